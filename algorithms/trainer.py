"""The one trainer loop every algorithm shares.

    for each iteration:
        prompts (B) -> G samples each (algorithm.rollout) -> rewards -> group advantages
           (of each group's most varied m samples only with advantage.downsample=m: the update trains on those)
        -> algorithm.prepare (pairs and old surrogates / transitions / nothing)
        -> epochs x minibatches of gradient steps on algorithm.loss -> algorithm.after_iteration (old-policy update)
        -> metrics, evaluation, checkpoint

Costs are measured per phase (rollout, reward, prepare, update) and model evaluations are counted per sample
(see :func:`spent_nfe`). Checkpoints carry every RNG stream (:mod:`vgrpo_lib.algorithms.rng`), so
``resume`` continues exactly; a run holds its run directory's lock while it trains
(:class:`vgrpo_lib.algorithms.run_dir.RunDir`). How it executes lives in modules of their own: the processes
(:mod:`vgrpo_lib.algorithms.strategy`), the precision (:mod:`vgrpo_lib.algorithms.precision`), the gradient steps with their
micro-batches and divergence checks (:mod:`vgrpo_lib.algorithms.gradient_steps`, :mod:`vgrpo_lib.algorithms.micro_batches`), the
rollout's micro-batches and their overlapped rewards (:mod:`vgrpo_lib.algorithms.rollout_batches`), the micro-batch
autotuner (:mod:`vgrpo_lib.algorithms.autotune`), the reward calls and retries (:mod:`vgrpo_lib.algorithms.scoring`), evaluation (:mod:`vgrpo_lib.algorithms.evaluation`), plots
(:mod:`vgrpo_lib.algorithms.plots`) and loggers (:mod:`vgrpo_lib.algorithms.run_logging`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from tensordict import TensorDict
from tqdm.auto import tqdm

from vgrpo_lib.algorithms.autotune import MicroBatchSizes
from vgrpo_lib.algorithms.base import Algorithm
from vgrpo_lib.algorithms.config import TrainConfig, schedule_targets
from vgrpo_lib.algorithms.errors import DamagedFileError, UsageError
from vgrpo_lib.algorithms.costs import PhaseClock
from vgrpo_lib.algorithms.evaluation import evaluate_policy, guidance_label
from vgrpo_lib.algorithms.gradient_steps import GradientSteps
from vgrpo_lib.algorithms.micro_batches import accumulate_gradients, forward_in_micro_batches
from vgrpo_lib.algorithms.plots import plot_run
from vgrpo_lib.algorithms.policies import WeightEMA
from vgrpo_lib.algorithms.precision import autocast
from vgrpo_lib.algorithms.registry import ALGORITHM_CLASSES
from vgrpo_lib.algorithms.rng import rng_state, seed_everything, set_rng_state
from vgrpo_lib.algorithms.rollout_batches import MicroBatchScores, rollout_in_micro_batches
from vgrpo_lib.algorithms.run_dir import RunDir, float32_snapped, new_run_id
from vgrpo_lib.algorithms.threads import limit_torch_threads
from vgrpo_lib.algorithms.run_logging import RunLogger, check_wandb_credentials, resolve_backend
from vgrpo_lib.algorithms.scoring import (  # noqa: F401 (RewardError, check_reward: public here too)
    RewardError, call_reward, check_finite_images, check_reward, reward_parts, reward_statistics,
)
from vgrpo_lib.algorithms.step_control import StepControl
from vgrpo_lib.algorithms.strategy import build_policies, check_split, local_prompts
from vgrpo_lib.algorithms.tasks import TaskProtocol, check_task, load_task, rollout_grid
from vgrpo_lib.integrations.tasks import TASK_ENTRIES, is_import_path
from vgrpo_lib.integrations.distributed import (
    Shard, all_finite, barrier, decided_by_main, is_sharded, load_model_state_dict, load_optimizer_state_dict,
    model_state_dict, optimizer_state_dict,
)
from vgrpo_lib.advantages import GroupAdvantage, max_variance_subset

__all__ = ["build_algorithm", "iteration_nfe", "refuse_nonfinite_weights", "spent_nfe", "task_label", "Trainer"]

logging.getLogger("torchrl").setLevel(logging.WARNING)


def task_label(task: object, name: str) -> str:
    """What a run given the task object ``task`` records as ``config.task``: ``name`` when it is a label of the
    user's own (neither a registered task nor an import path, which would name another task), else the object's
    type, ``"module.Class"``."""
    if name in TASK_ENTRIES or is_import_path(name):
        return f"{type(task).__module__}.{type(task).__qualname__}"
    return name


def refuse_nonfinite_weights(policy: torch.nn.Module, config: TrainConfig) -> None:
    """A :class:`DamagedFileError` naming the parameters when the task's policy holds NaN or inf before anything
    trained (damaged base weights: no learning rate could help), before anything is written."""
    parameters = dict(policy.named_parameters())
    if all_finite(list(parameters.values())):
        return
    bad = [name for name, value in parameters.items() if not bool(torch.isfinite(value).all())]
    source = f"model.path={config.model.path}" if config.model.path else f"the task {config.task!r}"
    raise DamagedFileError(f"The policy's weights from {source} hold NaN or inf before any training, in "
                           f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} ({len(bad)} tensors): the weights "
                           f"are damaged; load intact ones.")


def build_algorithm(config: TrainConfig, task: TaskProtocol, policy: torch.nn.Module):
    """``config.algo``'s algorithm (:data:`~vgrpo_lib.algorithms.registry.ALGORITHM_CLASSES`) on ``task`` with the
    trained ``policy`` and the frozen copies it asks for (:func:`~vgrpo_lib.algorithms.strategy.build_policies`)."""
    algorithm_class = ALGORITHM_CLASSES[config.algo]
    policies = build_policies(task, policy, algorithm_class, config)
    return algorithm_class(config, policies, task.sample_shape, rollout_grid(task, config.rollout))


def iteration_nfe(config: TrainConfig) -> float:
    """Model evaluations per sample in one iteration of ``config`` (the sum of :func:`spent_nfe`: rollout, prepare,
    update; a fraction with ``advantage.downsample``), read from its algorithm as built for
    training on its task, whose policy is loaded for it (no run directory is touched): what a budget in NFE per
    sample divides by (``vgrpo compare --nfe-budget``). Refused by name for a config whose cost changes as it trains
    (:attr:`~vgrpo_lib.algorithms.base.Algorithm.nfe_varies_with`: V-GRPO's ``vgrpo.adaptive_pairs``)."""
    task = load_task(config.task, config.model)
    algorithm = build_algorithm(config, task, task.load_policy())
    if algorithm.nfe_varies_with is not None:
        raise UsageError(f"{config.algo} with {algorithm.nfe_varies_with} chooses its cost per iteration as it "
                         f"trains: no fixed number of iterations spends a given NFE budget.")
    return sum(spent_nfe(algorithm, config).values())


def spent_nfe(algorithm: Algorithm, config: TrainConfig) -> dict[str, float]:
    """Model evaluations per rollout sample in each phase of one iteration: the algorithm's own
    (:meth:`~vgrpo_lib.algorithms.base.Algorithm.nfe`), its prepare and update phases on the samples it trains on
    (``advantage.downsample`` of each group's ``group_size``: a fraction of theirs per rollout sample)."""
    nfe = algorithm.nfe()
    trained = config.trained_per_group
    if trained == config.group_size:
        return nfe
    return {phase: value if phase == "rollout" else value * trained / config.group_size for phase, value in nfe.items()}


class Trainer:
    """Train ``config.algo`` on a task into ``run_dir``.

    ``Trainer(config, run_dir)`` starts a new run on the task ``config.task`` names (a registered name or an import
    path ``"package.module:factory"``, :func:`vgrpo_lib.algorithms.tasks.load_task`), refusing an existing run
    directory; ``Trainer(config, run_dir, task=obj)`` trains on any object satisfying
    :class:`vgrpo_lib.algorithms.tasks.TaskProtocol` (checked first, before anything is written: a
    :class:`~vgrpo_lib.algorithms.tasks.TaskProtocolError` names every missing member), and records
    ``config.task`` as a label (:func:`task_label`). ``Trainer.resume(run_dir)`` continues a run from its newest
    valid checkpoint with its saved config; ``Trainer.resume(run_dir, task=obj)`` with the same task object.
    """

    def __init__(self, config: TrainConfig, run_dir: str | Path, *, task: TaskProtocol | None = None,
                 progress: bool = True, _resuming: bool = False):
        if task is not None:
            check_task(task, "Trainer(task=...)")
            config = dataclasses.replace(config, task=task_label(task, config.task))
        self.config, self.run, self.progress = config, RunDir(run_dir), progress
        self.shard = Shard.current()
        check_split(config, self.shard)
        if not _resuming:  # decided by rank 0, which alone writes; nothing is written before train()
            decided_by_main(self.run.refuse_unless_fresh)
        self.run_id, self._resuming = new_run_id(), _resuming
        if resolve_backend(config.log.backend) == "wandb":  # a missing package or key fails before anything runs
            check_wandb_credentials()
        limit_torch_threads()  # no more threads than the cores given (see vgrpo_lib.algorithms.threads)
        seed_everything(config.seed)
        self.task = load_task(config.task, config.model) if task is None else task
        self.policy = self.task.load_policy()
        refuse_nonfinite_weights(self.policy, config)
        # DDP's constructor is a collective: no rank gets here before every rank has checked the run directory.
        self.algorithm = build_algorithm(config, self.task, self.policy)
        # bf16 autocast (precision=bfloat16) where the policy computes
        self._autocast = functools.partial(autocast, next(self.policy.parameters()).device.type, config.precision)
        self.reward_fn = self.task.reward()
        self.reward_names, self.reward_weights = reward_parts(self.reward_fn)  # None, None for a single reward
        a, o = config.advantage, config.optim
        self.advantage = GroupAdvantage(a.scale, soft_clip=a.soft_clip, clip=a.clip, eps=a.eps,
                                        weights=self.reward_weights, multi_reward=a.multi_reward)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)
        self.control = StepControl(schedule_targets(config), self.algorithm.loss_module, self.optimizer)
        self.ema = None if o.ema_decay is None else WeightEMA(self.policy.parameters(), o.ema_decay, o.ema_every,
                                                             offload=o.ema_offload)
        self.gradient_steps = GradientSteps(o, self.optimizer, self._accumulate_gradients, self.shard.world_size, self.ema)
        self.generator = torch.Generator().manual_seed(config.seed)
        # rollout.micro_batch_size / optim.micro_batch_size, the sizes found under "auto" (saved with checkpoints)
        self.micro_batches = MicroBatchSizes(config.rollout.micro_batch_size, o.micro_batch_size)
        self.iteration = 0
        # train_seconds: wall-clock of the iterations (evaluation excluded); train_cpu_s: the process's CPU time
        # over the same span, robust to other jobs sharing the machine.
        self.counters = {"grad_steps": 0, "skipped_steps": 0, "nonfinite_in_a_row": 0, "nfe": 0, "train_seconds": 0.0,
                         "train_cpu_s": 0.0}
        self.metrics: list[dict] = []
        self.evaluations: list[dict] = []
        self.logger: RunLogger | None = None  # opened by train()

    @classmethod
    def resume(cls, run_dir: str | Path, *, task: TaskProtocol | None = None, progress: bool = True) -> Trainer:
        """Continue the run in ``run_dir`` from its newest intact checkpoint of this run (taking its lock), or from
        iteration 0 when it was stopped before its first checkpoint. A ``config.json`` edited since the checkpoint
        is refused naming the keys, except :data:`~vgrpo_lib.algorithms.run_dir.RESUME_MAY_CHANGE`. ``task``: the task object the run was started
        with (``Trainer(..., task=obj)``); without it the saved ``config.task`` (a name or import path) is built."""
        run = RunDir(run_dir)
        config = run.train_config()
        if task is None and config.task not in TASK_ENTRIES and not is_import_path(config.task):
            raise UsageError(f"The run in {run.root} trained {config.task!r}, neither a registered task nor an import "
                             f"path (a task object, or a task registered in another process): pass the object again, "
                             f"Trainer.resume(run_dir, task=obj), or register_task({config.task!r}, ...) first.")
        trainer = cls(config, run_dir, task=task, progress=progress, _resuming=True)
        trainer.run_id = decided_by_main(trainer.run.run_id)
        trainer._take_lock()
        try:
            found = decided_by_main(lambda: trainer.run.newest_checkpoint(trainer.run_id))
            if found is None:
                warnings.warn(f"{run.root} has no checkpoint yet (stopped before the first): restarting it from "
                              f"iteration 0.")
            else:
                decided_by_main(lambda: trainer.run.check_resume_config(found, trainer.config))
                trainer._load_state(trainer.run.load_checkpoint(found, trainer.run_id))
        except BaseException:
            trainer.run.unlock()
            raise
        return trainer

    def _take_lock(self) -> None:
        """Rank 0 takes the run directory (:meth:`RunDir.take`); every rank raises if it could not."""
        decided_by_main(lambda: self.run.take(fresh=not self._resuming and self.iteration == 0))

    def _state(self) -> dict:
        """Everything a resume needs, with full (gathered) weights: a collective under FSDP2, so every rank calls
        it; rank 0 writes it."""
        return {
            "iteration": self.iteration,
            "policy": model_state_dict(self.policy),
            "optimizer": optimizer_state_dict(self.policy, self.optimizer),
            "algorithm": self.algorithm.state_dict(),
            "generator": self.generator.get_state(),
            "rng": rng_state(),
            "counters": dict(self.counters),
            "step_control": self.control.state_dict(),
            # The rows of metrics.csv and eval.jsonl so far, as JSON text: a resume takes them from here, not from
            # files a user may have cut short or deleted.
            "records": json.dumps({"metrics": self.metrics, "evaluations": self.evaluations}, default=float),
            **({} if self.ema is None else {"ema": self.ema.state_dict()}),
            "micro_batch_sizes": self.micro_batches.state_dict(),
        }

    def _load_state(self, state: dict) -> None:
        self.iteration = state["iteration"]
        load_model_state_dict(self.policy, state["policy"])
        load_optimizer_state_dict(self.policy, self.optimizer, state["optimizer"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.generator.set_state(state["generator"])
        set_rng_state(state["rng"])
        self.counters.update(state["counters"])  # counters added since the checkpoint start at 0
        self.control.load_state_dict(state.get("step_control", {}))
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        self.micro_batches.load_state_dict(state.get("micro_batch_sizes", {}))  # none in older checkpoints
        if "records" in state:  # a garbled table is still refused by name; a cut or deleted one is rewritten
            self.run.read_rows("metrics.csv"), self.run.read_jsonl("eval.jsonl")
            records = json.loads(state["records"])
            self.metrics, self.evaluations = records["metrics"], records["evaluations"]
        else:  # a checkpoint of an older vgrpo-lib: the run's files must hold every row before it
            self.metrics = self._metrics_rows_before(self.iteration)
            self.evaluations = [e for e in self.run.read_jsonl("eval.jsonl") if e["iteration"] <= self.iteration]

    def _metrics_rows_before(self, iteration: int) -> list[dict]:
        """The rows of ``metrics.csv`` for iterations 0 .. ``iteration`` - 1, each complete; a
        :class:`DamagedFileError` naming the file when a row is cut short or missing."""
        path = self.run.root / "metrics.csv"
        rows = [row for row in self.run.read_rows("metrics.csv") if row["iteration"] < iteration]
        for line, row in enumerate(rows, start=2):
            if None in row.values():
                raise DamagedFileError(f"{path} is damaged: line {line} has fewer cells than the header, and the "
                                       f"checkpoint (of an older vgrpo-lib) holds no copy of the rows.")
        missing = sorted(set(range(iteration)) - {row["iteration"] for row in rows})
        if missing or len(rows) != iteration:
            shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
            what = f"holds no row of iterations {shown}" if missing else "repeats an iteration's row"
            raise DamagedFileError(f"{path} {what} before the checkpoint at {iteration}, which (of an older "
                                   f"vgrpo-lib) holds no copy of the rows.")
        return rows

    # -- one iteration -----------------------------------------------------------------------------------

    def _rewinder(self, gradients: bool = False) -> Callable[[], None]:
        """What undoes an attempt that ran out of memory (:mod:`vgrpo_lib.algorithms.autotune`): the generator's
        stream back to now, and with ``gradients`` the gradients it accumulated (none before an attempt)."""
        state = self.generator.get_state()

        def rewind() -> None:
            self.generator.set_state(state)
            if gradients:
                self.optimizer.zero_grad(set_to_none=True)

        return rewind

    def _accumulate_gradients(self, minibatch) -> dict[str, torch.Tensor]:
        """Backpropagate the loss of ``minibatch`` in micro-batches of ``optim.micro_batch_size`` rows (see
        :func:`vgrpo_lib.algorithms.micro_batches.accumulate_gradients`; ``auto``: the largest that fits)."""
        def attempt(size: int) -> dict[str, torch.Tensor]:
            return accumulate_gradients(self.algorithm.loss, self.algorithm.policy, minibatch, size, self.generator,
                                        self._autocast)

        return self.micro_batches.run("update", minibatch.shape[0], attempt, self._rewinder(gradients=True))

    def _prepare(self, batch: TensorDict) -> TensorDict:
        """The algorithm's training rows of the scored rollout ``batch``, their forwards without gradient
        (:meth:`~vgrpo_lib.algorithms.base.Algorithm.prepare_forward`) in micro-batches of the update's size
        (``optim.micro_batch_size``; ``auto``: see :mod:`vgrpo_lib.algorithms.autotune`)."""
        with self._autocast():
            rows = self.algorithm.prepare(batch, self.generator)
        if not self.algorithm.nfe()["prepare"]:
            return rows

        def attempt(size: int) -> dict[str, torch.Tensor]:
            with self._autocast():
                return forward_in_micro_batches(self.algorithm.prepare_forward, rows, size)

        return rows.update(self.micro_batches.run("update", rows.shape[0], attempt, self._rewinder(), step="prepare"))

    def _rollout_and_score(self, cond, group: torch.Tensor, prompts, clock: PhaseClock) -> TensorDict:
        """This iteration's rollout with its ``"reward"`` (``[N]``, ``[N, R]`` for a multi-reward): the algorithm's
        rollout in micro-batches of ``rollout.micro_batch_size`` samples (``auto``: the largest that fits), each
        decoded and scored, in the background while the next rolls out with ``rollout.overlap_rewards``
        (:mod:`vgrpo_lib.algorithms.rollout_batches`). Ends the phase ``rollout`` on ``clock`` when the last
        micro-batch is rolled out."""
        what = f"the training samples of iteration {self.iteration}"
        score = self.reward_fn if self.reward_names is None else self.reward_fn.stack
        num_rewards = None if self.reward_names is None else len(self.reward_names)

        def decode(samples: torch.Tensor) -> torch.Tensor:
            check_finite_images(samples, what)
            return self.task.decode(samples)

        def reward(images: torch.Tensor, prompt_rows) -> torch.Tensor:
            return call_reward(score, images, prompt_rows, self.config.reward_retries, self.iteration, num_rewards)

        def rollout(cond_rows, group_rows) -> TensorDict:
            with self._autocast():
                return self.algorithm.rollout(cond_rows, group_rows, self.generator, self.iteration)

        def attempt(size: int) -> TensorDict:
            with MicroBatchScores(decode, reward, prompts, overlap=self.config.rollout.overlap_rewards) as scores:
                batch = rollout_in_micro_batches(rollout, cond, group, size, then=scores.add)
                clock.mark("rollout")
                batch["reward"] = scores.result()
            return batch

        return self.micro_batches.run("rollout", group.shape[0], attempt, self._rewinder())

    def step(self) -> dict:
        """Run one iteration and return its metrics row."""
        clock = PhaseClock(next(self.policy.parameters()).device)  # on a GPU also each phase's peak memory
        controlled = self.control.apply(self.iteration)  # scheduled lr / clip range / KL coefficients
        prompts, cond, group = local_prompts(self.task, self.config, self.shard, self.generator)
        batch = self._rollout_and_score(cond, group, prompts, clock)
        # The global batch's rewards on every rank (B floats, or [B, R]): advantages and logged statistics are global.
        scores, groups = self.shard.all_gather(batch["reward"]), self.shard.all_gather(group)
        reward = scores if self.reward_names is None else scores @ self.reward_weights.to(scores)  # the weighted sum
        if self.config.advantage.downsample is None:
            advantage = self.advantage(scores, groups)
        else:  # the update trains on each group's most varied rewards; the logged rewards stay the whole rollout's
            kept = max_variance_subset(reward, groups, self.config.advantage.downsample)
            advantage = self.advantage(scores[kept], groups[kept])
            batch = batch[self.shard.local(kept)]
        batch["advantage"] = self.shard.local(advantage)
        clock.mark("reward")
        rows = self._prepare(batch)
        self.algorithm.prepared(rows)
        clock.mark("prepare")
        losses = self.gradient_steps(rows, self.generator, self.counters, self.iteration)
        self.control.observe(losses)  # the adaptive KL coefficients follow the measured KL
        self.algorithm.after_iteration(self.iteration, self.counters["grad_steps"])
        clock.mark("update")
        nfe = spent_nfe(self.algorithm, self.config)
        self.counters["nfe"] += sum(nfe.values())
        self.counters["train_seconds"] += clock.elapsed
        self.counters["train_cpu_s"] += clock.cpu_seconds()
        self.iteration += 1
        row = {
            "iteration": self.iteration - 1,
            **reward_statistics(reward, scores, groups, advantage, self.reward_names),
            **losses,
            **controlled,
            **clock.seconds(),
            **clock.peak_memory(),
            **self.micro_batches.metrics(),
            **self.algorithm.metrics(),
            "nfe_per_sample": sum(nfe.values()),
            **{f"nfe_{phase}": value for phase, value in nfe.items()},
            "nfe_cumulative": self.counters["nfe"],
            **{key: self.counters[key] for key in ("grad_steps", "skipped_steps", "train_seconds", "train_cpu_s")},
        }
        row = {key: float32_snapped(value) for key, value in row.items()}  # as metrics.csv keeps and gives it back
        self.metrics.append(row)
        return row

    # -- evaluation, logging, checkpoints ----------------------------------------------------------------

    def evaluate(self) -> dict | None:
        """Evaluate the policy (:func:`vgrpo_lib.algorithms.evaluation.evaluate_policy`), record the result and write the
        sample grid (rank 0). Under FSDP2 every rank must call it (the sharded policy's forwards are collectives);
        the other ranks only take part in the sampling and return None."""
        result, images, prompts = evaluate_policy(self.task, self.policy, self.config.eval, self.iteration, self.ema,
                                                  score=self.shard.is_main)
        if result is None:
            return None
        result.update(iteration=self.iteration, train_seconds=self.counters["train_seconds"],
                      train_cpu_s=self.counters["train_cpu_s"], nfe_cumulative=self.counters["nfe"],
                      grad_steps=self.counters["grad_steps"])
        self.evaluations.append(result)
        ema = "" if self.ema is None else ", EMA weights"
        title = f"{self.config.algo} on {self.config.task}, iteration {self.iteration} (held-out seeds, CFG-free{ema})"
        self.task.write_samples(images, prompts, self._grid_path(), title)
        return result

    def _grid_path(self) -> Path:
        return self.run.root / f"samples_iter_{self.iteration:06d}.png"

    def _log(self, row: dict, prefix: str) -> None:
        self.logger.scalars(row, prefix, self.iteration)
        if prefix == "eval":
            self.logger.image("eval/samples", self._grid_path(), self.iteration)

    def _write_files(self) -> None:
        self.run.write_rows("metrics.csv", self.metrics)
        flat = [{k: v for k, v in e.items() if not isinstance(v, dict)} for e in self.evaluations]
        self.run.write_rows("eval.csv", flat)
        self.run.write_jsonl("eval.jsonl", self.evaluations)
        plot_run(self.metrics, flat, self.task.evaluation_metrics, self.run.root / "reward.png",
                 guidance_label(self.config.model))

    def train(self, until: int | None = None) -> list[dict]:
        """Run (or continue) until ``config.iterations``, or stop after iteration ``until`` with a checkpoint (as
        a job cut short would); returns the evaluations (rank 0 only evaluates and writes files: the other
        processes return an empty list; under FSDP2 they take part in the evaluation's forwards)."""
        c = self.config
        until = c.iterations if until is None else min(until, c.iterations)
        self._take_lock()
        try:
            self.logger = RunLogger(c.log.backend, self.run.root / "logs", self.run_id, c.log.project, c.to_dict(),
                                    resume_step=self.iteration)
            try:
                return self._train(until, self.shard.is_main, self.shard.is_main or is_sharded(self.policy))
            finally:
                self.logger.close()
        finally:
            self.run.unlock()

    def _train(self, until: int, main: bool, evaluates: bool) -> list[dict]:
        c = self.config
        if self.iteration == 0 and main:
            self.run.write_config(c.to_json(), self.run_id)
        if self.iteration == 0 and evaluates:
            evaluation = self.evaluate()
            if main:
                self._log(evaluation, "eval")
                self._write_files()
        progress = self.progress and main
        with tqdm(total=c.iterations, initial=self.iteration, desc=f"{c.algo} on {c.task}", disable=not progress) as bar:
            while self.iteration < until:
                row = self.step()
                last = self.iteration == c.iterations
                due = last or bool(c.eval.every and self.iteration % c.eval.every == 0)
                evaluation = self.evaluate() if due and evaluates else None
                if main:
                    self._log(row, "train")
                    shown = {"reward": f"{row['reward_mean']:.3f}"}
                    if evaluation is not None:
                        self._log(evaluation, "eval")
                        first = next(iter(self.task.evaluation_metrics))
                        shown[first] = f"{evaluation[first]:.3f}"
                    bar.set_postfix(shown)
                    self._write_files()
                if last or self.iteration == until or self.iteration % c.checkpoint_every == 0:
                    state = self._state()  # on every rank: gathering FSDP2 shards is a collective
                    if main:
                        self.run.save_checkpoint(self.iteration, state, self.run_id, c)
                    barrier()  # no rank goes on (and may resume from it) before the checkpoint is complete
                bar.update(1)
        return self.evaluations
