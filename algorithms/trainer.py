"""The one trainer loop every algorithm shares.

    for each iteration:
        prompts (B) -> G samples each (algorithm.rollout) -> rewards -> group advantages
        -> algorithm.prepare (pairs and old surrogates / transitions / nothing)
        -> epochs x minibatches of gradient steps on algorithm.loss (a TorchRL replay buffer over the rows)
        -> algorithm.after_iteration (old-policy update) -> metrics, evaluation, checkpoint

Costs are measured per phase (rollout, reward, prepare, update) and model evaluations are counted per sample
(see :meth:`algorithms.base.Algorithm.nfe`). A gradient step whose loss or gradient is not finite is skipped
(weights and optimizer untouched) and counted; ``optim.max_nonfinite_steps`` in a row abort the run, as do
non-finite weights or optimizer state after a step, non-finite samples and a non-finite evaluation
(:class:`~algorithms.errors.DivergenceError`: a non-finite state is never saved). Checkpoints carry every RNG stream
(:mod:`algorithms.rng`) and evaluation runs on its own streams, so ``resume`` continues exactly. A run holds its
run directory's lock while it trains (:class:`algorithms.run_dir.RunDir`).

Launched with torchrun, every process trains its block of whole prompt groups of the global batch and DDP
(``distributed.strategy=ddp``) or FSDP2 (``fsdp2``) averages the gradients; rank 0 alone evaluates and writes
files, checkpoints hold full state dicts (see :mod:`integrations.distributed`).
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
import warnings
from pathlib import Path

import torch
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from tqdm.auto import tqdm

from algorithms.config import TrainConfig, schedule_targets
from algorithms.errors import DamagedFileError, DivergenceError
from algorithms.policies import Policies, WeightEMA, make_behaviour
from algorithms.registry import ALGORITHM_CLASSES
from algorithms.rng import isolated_rng, rng_state, seed_everything, set_rng_state
from algorithms.plots import plot_run
from algorithms.run_dir import RunDir, new_run_id
from algorithms.run_logging import RunLogger, resolve_backend
from algorithms.step_control import StepControl
from algorithms.tasks import load_task, repeat_each, rollout_grid
from integrations.distributed import (
    Shard,
    all_finite,
    all_reduce_metrics,
    barrier,
    decided_by_main,
    full_tensor,
    gradient_sync,
    is_sharded,
    load_model_state_dict,
    load_optimizer_state_dict,
    metric_extreme,
    model_state_dict,
    optimizer_state_dict,
    shard_frozen,
    shard_groups,
    wrap_model,
)
from vgrpo_lib.advantages import GroupAdvantage, group_statistics
from vgrpo_lib.losses import total_loss

logging.getLogger("torchrl").setLevel(logging.WARNING)


class RewardError(ValueError):
    """A reward function returned something unusable."""


def check_reward(reward, num_samples: int, prompts: torch.Tensor, num_rewards: int | None = None) -> torch.Tensor:
    """The reward as a float tensor ``[N]`` (``[N, R]`` for ``num_rewards`` rewards); a clear error naming the
    prompt on NaN/inf or a wrong shape."""
    expected = (num_samples,) if num_rewards is None else (num_samples, num_rewards)
    if not isinstance(reward, torch.Tensor) or reward.shape != expected:
        shape = tuple(reward.shape) if isinstance(reward, torch.Tensor) else type(reward).__name__
        raise RewardError(f"The reward function must return a tensor of shape {expected}, got {shape}.")
    bad = ~torch.isfinite(reward)
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        prompt = prompts[index].tolist() if isinstance(prompts[index], torch.Tensor) else prompts[index]
        raise RewardError(
            f"The reward is NaN or inf for {int(bad.sum())} sample(s), first at index {index} (prompt {prompt!r})."
        )
    return reward.float()


class Trainer:
    """Train ``config.algo`` on ``config.task`` into ``run_dir``.

    ``Trainer(config, run_dir)`` starts a new run (refusing an existing run directory);
    ``Trainer.resume(run_dir)`` continues one from its newest valid checkpoint with its saved config.
    """

    def __init__(self, config: TrainConfig, run_dir: str | Path, *, progress: bool = True, _resuming: bool = False):
        self.config, self.run, self.progress = config, RunDir(run_dir), progress
        self.shard = Shard.current()
        shard_groups(config.prompts_per_iteration, self.shard.world_size, self.shard.rank)  # raises unless divisible
        if config.optim.minibatch_size is not None:
            self.shard.check_divisible("optim.minibatch_size", config.optim.minibatch_size)
        if not _resuming:  # decided by rank 0, which alone writes; nothing is written before train()
            decided_by_main(self.run.refuse_unless_fresh)
        self.run_id, self._resuming = new_run_id(), _resuming
        seed_everything(config.seed)
        self.task = load_task(config.task, config.model)
        self.policy = self.task.load_policy()
        algorithm_class = ALGORITHM_CLASSES[config.algo]
        # The frozen versions are made from the unwrapped policy, then prepared for the strategy with it.
        reference = self.task.reference_policy(self.policy) if algorithm_class.needs_reference(config) else None
        behaviour = make_behaviour(self.task, self.policy) if algorithm_class.needs_behaviour(config) else None
        strategy = config.distributed.strategy
        # DDP's constructor is a collective: no rank passes it before every rank has checked the run directory.
        # FSDP2 shards self.policy in place (the optimizer below then holds the local shards).
        policies = Policies(wrap_model(self.policy, strategy), shard_frozen(reference, strategy), behaviour,
                            null_cond=getattr(self.task, "null_cond", None))
        if behaviour is not None:
            behaviour.shard(strategy)
        self.device_type = next(self.policy.parameters()).device.type  # where the policy computes (autocast)
        grid = rollout_grid(self.task, config.rollout)
        self.algorithm = algorithm_class(config, policies, self.task.sample_shape, grid)
        self.algorithm.shard = self.shard
        self.reward_fn = self.task.reward()
        # A multi-reward (``stack(images, prompts) -> [N, R]`` with ``names`` and ``weights``) is scored per reward
        # and combined as advantage.multi_reward says.
        self.reward_names = list(self.reward_fn.names) if hasattr(self.reward_fn, "stack") else None
        self.reward_weights = None if self.reward_names is None else torch.as_tensor(self.reward_fn.weights).float().cpu()
        a = config.advantage
        self.advantage = GroupAdvantage(a.scale, soft_clip=a.soft_clip, clip=a.clip, eps=a.eps,
                                        weights=self.reward_weights, multi_reward=a.multi_reward)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.optim.lr, weight_decay=config.optim.weight_decay)
        self.control = StepControl(schedule_targets(config), self.algorithm.loss_module, self.optimizer)
        o = config.optim
        self.ema = None if o.ema_decay is None else WeightEMA(self.policy.parameters(), o.ema_decay, o.ema_every)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.iteration = 0
        # train_seconds: wall-clock of the iterations (evaluation excluded); train_cpu_s: the process's CPU time
        # over the same span, robust to other jobs sharing the machine.
        self.counters = {"grad_steps": 0, "skipped_steps": 0, "nonfinite_in_a_row": 0, "nfe": 0, "train_seconds": 0.0,
                         "train_cpu_s": 0.0}
        self.metrics: list[dict] = []
        self.evaluations: list[dict] = []
        resolve_backend(config.log.backend)  # a missing logger package fails here, before anything runs
        self.logger: RunLogger | None = None  # opened by train()

    @classmethod
    def resume(cls, run_dir: str | Path, *, progress: bool = True) -> Trainer:
        """Continue the run in ``run_dir`` from its newest intact checkpoint of this run (taking its lock), or from
        iteration 0 when it was stopped before its first checkpoint."""
        run = RunDir(run_dir)
        try:
            config = TrainConfig.from_dict(run.read_config())
        except (TypeError, ValueError) as error:
            raise DamagedFileError(f"{run.config_path} is not a valid run config: {error}") from error
        trainer = cls(config, run_dir, progress=progress, _resuming=True)
        trainer.run_id = decided_by_main(trainer.run.run_id)
        trainer._take_lock()
        try:
            found = decided_by_main(lambda: trainer.run.newest_checkpoint(trainer.run_id))
            if found is None:
                warnings.warn(f"{run.root} has no checkpoint yet (stopped before the first): restarting it from "
                              f"iteration 0.")
            else:
                trainer._load_state(trainer.run.load_checkpoint(found, trainer.run_id))
        except BaseException:
            trainer.run.unlock()
            raise
        return trainer

    def _take_lock(self) -> None:
        """Rank 0 takes the run directory's lock (a new run checks again that the folder is fresh, now under the
        lock) and removes the temporary files of killed writes; every rank raises if it could not."""

        def take() -> None:
            self.run.lock()
            try:
                if not self._resuming and self.iteration == 0:
                    self.run.refuse_unless_fresh()
                self.run.remove_leftovers()
            except BaseException:
                self.run.unlock()
                raise

        decided_by_main(take)

    # -- state -------------------------------------------------------------------------------------------

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
            **({} if self.ema is None else {"ema": self.ema.state_dict()}),
        }

    def _load_state(self, state: dict) -> None:
        self.iteration = state["iteration"]
        load_model_state_dict(self.policy, state["policy"])
        load_optimizer_state_dict(self.policy, self.optimizer, state["optimizer"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.generator.set_state(state["generator"])
        set_rng_state(state["rng"])
        self.counters = {**self.counters, **state["counters"]}  # counters added since the checkpoint start at 0
        self.control.load_state_dict(state.get("step_control", {}))
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        self.metrics = [row for row in self.run.read_rows("metrics.csv") if row["iteration"] < self.iteration]
        self.evaluations = [e for e in self.run.read_jsonl("eval.jsonl") if e["iteration"] <= self.iteration]

    # -- one iteration -----------------------------------------------------------------------------------

    def _autocast(self):
        """bf16 autocast on the policy's device for ``precision=bfloat16`` (a no-op context for float32)."""
        return torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.config.precision == "bfloat16")

    def _prompts(self):
        """This process's prompt groups (every rank draws the global prompts and keeps its block): the prompt of
        each sample, its conditioning and its group id."""
        c = self.config
        prompts = self.task.sample_prompts(c.prompts_per_iteration, self.generator)
        block = shard_groups(c.prompts_per_iteration, self.shard.world_size, self.shard.rank)
        prompts = repeat_each(prompts[block], c.group_size)
        group = torch.arange(c.prompts_per_iteration)[block].repeat_interleave(c.group_size)
        return prompts, self.task.condition(prompts), group

    def _reward(self, images: torch.Tensor, prompts) -> torch.Tensor:
        """The reward ``[N]`` (a multi-reward's ``[N, R]``), retried ``reward_retries`` times when the reward
        function raises (a flaky remote or GPU reward model), then checked for shape and finiteness."""
        score = self.reward_fn if self.reward_names is None else self.reward_fn.stack
        for attempt in range(self.config.reward_retries + 1):
            try:
                reward = score(images, prompts)
                break
            except Exception as error:  # any failure of user code: retried, then reported with its cause
                if attempt == self.config.reward_retries:
                    raise RewardError(
                        f"The reward function raised on {attempt + 1} attempt(s) at iteration {self.iteration}: "
                        f"{type(error).__name__}: {error}"
                    ) from error
                warnings.warn(f"The reward function raised ({error}); retrying ({attempt + 1}/{self.config.reward_retries}).")
        return check_reward(reward, images.shape[0], prompts, None if self.reward_names is None else len(self.reward_names))

    def _update(self, rows) -> dict[str, float]:
        optim = self.config.optim
        # Each process takes its share of a global minibatch from its own rows (or 1/minibatches of its rows); one
        # minibatch covering all rows is not shuffled (the order is irrelevant to the step, and a multi-process run
        # then matches a single one).
        if optim.minibatch_size is not None:
            minibatch = optim.minibatch_size // self.shard.world_size
        else:
            minibatch = -(-rows.shape[0] // (optim.minibatches or 1))
        buffer = ReplayBuffer(
            storage=LazyTensorStorage(rows.shape[0]),
            sampler=SamplerWithoutReplacement(drop_last=False, shuffle=minibatch < rows.shape[0]),
            batch_size=minibatch,
        )
        buffer.set_rng(self.generator)
        buffer.extend(rows)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        outputs = []
        for _ in range(optim.epochs):
            for minibatch in buffer:
                self.optimizer.zero_grad(set_to_none=True)
                losses = self._accumulate_gradients(minibatch)
                grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, optim.max_grad_norm))
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                    self._check_finite_state()
                    self.counters["grad_steps"] += 1
                    self.counters["nonfinite_in_a_row"] = 0
                    if self.ema is not None:
                        self.ema.update(self.counters["grad_steps"])
                else:
                    self.optimizer.zero_grad(set_to_none=True)
                    self.counters["skipped_steps"] += 1
                    self.counters["nonfinite_in_a_row"] += 1
                    if self.counters["nonfinite_in_a_row"] >= optim.max_nonfinite_steps:
                        raise DivergenceError(
                            f"The policy diverged: {self.counters['nonfinite_in_a_row']} gradient steps in a row had a "
                            f"non-finite loss or gradient (iteration {self.iteration}); lower optim.lr or check the reward."
                        )
                outputs.append({k: v.detach() for k, v in losses.items()} | {"grad_norm": grad_norm.detach()})
        keys = list(outputs[0])
        steps = torch.stack([torch.stack([o[key].float() for key in keys]) for o in outputs])  # [steps, keys]
        return dict(zip(keys, all_reduce_metrics(steps, keys).mean(0).tolist()))  # global values (processes combined)

    def _check_finite_state(self) -> None:
        """Raise :class:`DivergenceError` unless the weights and the optimizer state are finite (after a step)."""
        state = [v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
        tensors = [p for group in self.optimizer.param_groups for p in group["params"]] + state
        if not all_finite(tensors):
            raise DivergenceError(
                f"The policy diverged: its weights or optimizer state are not finite after gradient step "
                f"{self.counters['grad_steps'] + 1} (iteration {self.iteration}, optim.lr={self.config.optim.lr:g}); "
                f"nothing of this state was saved. Lower optim.lr."
            )

    def _accumulate_gradients(self, minibatch) -> dict[str, torch.Tensor]:
        """Backpropagate the loss of ``minibatch``, in micro-batches of ``optim.micro_batch_size`` rows when set
        (each micro-batch's loss weighted by its share of the rows, so the gradient is the minibatch's; DDP /
        FSDP2 synchronise only on the last one). Returns the losses and diagnostics combined the same way (``*_min`` /
        ``*_max`` diagnostics by min / max, as across processes)."""
        size = self.config.optim.micro_batch_size
        micro_batches = [minibatch] if size is None or size >= minibatch.shape[0] else minibatch.split(size)
        policy = self.algorithm.policy
        combined: dict[str, torch.Tensor] = {}
        for index, micro in enumerate(micro_batches):
            share = micro.shape[0] / minibatch.shape[0]
            with gradient_sync(policy, enabled=index == len(micro_batches) - 1):
                with self._autocast():
                    losses = self.algorithm.loss(micro, self.generator)
                (total_loss(losses) * share).backward()
            for key, value in losses.items():
                value, extreme = value.detach(), metric_extreme(key)
                if key not in combined:
                    combined[key] = value if extreme else value * share
                elif extreme:
                    combined[key] = (torch.minimum if extreme == "min" else torch.maximum)(combined[key], value)
                else:
                    combined[key] = combined[key] + value * share
        return combined

    def step(self) -> dict:
        """Run one iteration and return its metrics row."""
        clock = time.perf_counter
        start, cpu_start = clock(), time.process_time()
        controlled = self.control.apply(self.iteration)  # scheduled lr / clip range / KL coefficients
        prompts, cond, group = self._prompts()
        with self._autocast():
            batch = self.algorithm.rollout(cond, group, self.generator, self.iteration)
        rolled = clock()
        check_finite_images(batch["sample"], f"the training samples of iteration {self.iteration}")
        batch["reward"] = self._reward(self.task.decode(batch["sample"]), prompts)
        # The global batch's rewards on every rank (B floats, or [B, R]): advantages and logged statistics are global.
        scores, groups = self.shard.all_gather(batch["reward"]), self.shard.all_gather(group)
        reward = scores if self.reward_names is None else scores @ self.reward_weights.to(scores)  # the weighted sum
        stats = group_statistics(reward, groups)
        advantage = self.advantage(scores, groups)
        batch["advantage"] = self.shard.local(advantage)
        rewarded = clock()
        with self._autocast():
            rows = self.algorithm.prepare(batch, self.generator)
        prepared = clock()
        losses = self._update(rows)
        self.control.observe(losses)  # the adaptive KL coefficients follow the measured KL
        self.algorithm.after_iteration(self.iteration, self.counters["grad_steps"])
        updated = clock()
        nfe = self.algorithm.nfe()
        self.counters["nfe"] += sum(nfe.values())
        self.counters["train_seconds"] += updated - start
        self.counters["train_cpu_s"] += time.process_time() - cpu_start
        self.iteration += 1
        row = {
            "iteration": self.iteration - 1,
            "reward_mean": reward.mean().item(),
            "reward_std": reward.std().item(),
            "zero_std_fraction": stats["zero_std_fraction"].item(),
            "advantage_abs_mean": advantage.abs().mean().item(),
            **{f"reward_{name}_mean": scores[:, i].mean().item() for i, name in enumerate(self.reward_names or [])},
            **losses,
            **controlled,
            "rollout_s": rolled - start,
            "reward_s": rewarded - rolled,
            "prepare_s": prepared - rewarded,
            "update_s": updated - prepared,
            "iteration_s": updated - start,
            "nfe_per_sample": sum(nfe.values()),
            **{f"nfe_{phase}": value for phase, value in nfe.items()},
            "nfe_cumulative": self.counters["nfe"],
            "grad_steps": self.counters["grad_steps"],
            "skipped_steps": self.counters["skipped_steps"],
            "train_seconds": self.counters["train_seconds"],
            "train_cpu_s": self.counters["train_cpu_s"],
        }
        self.metrics.append(row)
        return row

    # -- evaluation, logging, checkpoints ----------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict | None:
        """CFG-free ODE samples on held-out seeds (``eval.seed``), more steps than training (of the EMA weights when
        ``optim.ema_decay`` is set), scored, recorded and
        written as a sample grid by rank 0. Under FSDP2 every rank must call it (the sharded policy's forwards are
        collectives); the other ranks only take part in the sampling and return None."""
        e = self.config.eval
        with isolated_rng(e.seed):  # the global streams: untouched by evaluation, and the same at every evaluation
            prompts = self.task.eval_prompts(e.per_prompt)
            generator = torch.Generator().manual_seed(e.seed)
            with nullcontext() if self.ema is None else self.ema.swapped_in():
                images = self.task.sample(self.policy, prompts, num_steps=e.num_steps, generator=generator)
            check_finite_images(images, f"the evaluation samples of iteration {self.iteration}")
            if not self.shard.is_main:
                return None
            result = self.task.evaluate(images, prompts)
        # The scores (a diagnostic such as diversity may be undefined, e.g. NaN for one sample per prompt).
        headline = ["reward_mean", *self.task.evaluation_metrics]
        bad = [k for k in headline if k in result and not math.isfinite(result[k])]
        if bad:
            raise DivergenceError(f"The evaluation at iteration {self.iteration} is not finite ({', '.join(bad)}).")
        result.update(
            iteration=self.iteration,
            train_seconds=self.counters["train_seconds"],
            train_cpu_s=self.counters["train_cpu_s"],
            nfe_cumulative=self.counters["nfe"],
            grad_steps=self.counters["grad_steps"],
        )
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
        plot_run(self.metrics, flat, self.task.evaluation_metrics, self.run.root / "reward.png")

    def train(self, until: int | None = None) -> list[dict]:
        """Run (or continue) until ``config.iterations``, or stop after iteration ``until`` with a checkpoint (as
        a job cut short would); returns the evaluations (rank 0 only evaluates and writes files: the other
        processes return an empty list; under FSDP2 they take part in the evaluation's forwards)."""
        c = self.config
        until = c.iterations if until is None else min(until, c.iterations)
        main = self.shard.is_main
        evaluates = main or is_sharded(self.policy)
        self._take_lock()
        log = c.log
        self.logger = RunLogger(log.backend, self.run.root / "logs", self.run_id, log.project, c.to_dict())
        try:
            return self._train(until, main, evaluates)
        finally:
            self.logger.close()
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
                    if evaluation is not None:
                        self._log(evaluation, "eval")
                        first = next(iter(self.task.evaluation_metrics))
                        bar.set_postfix({"reward": f"{row['reward_mean']:.3f}", first: f"{evaluation[first]:.3f}"})
                    else:
                        bar.set_postfix(reward=f"{row['reward_mean']:.3f}")
                    self._write_files()
                if last or self.iteration == until or self.iteration % c.checkpoint_every == 0:
                    state = self._state()  # on every rank: gathering FSDP2 shards is a collective
                    if main:
                        self.run.save_checkpoint(self.iteration, state, self.run_id)
                    barrier()  # no rank goes on (and may resume from it) before the checkpoint is complete
                bar.update(1)
        return self.evaluations


def check_finite_images(images: torch.Tensor, what: str) -> None:
    """Raise :class:`DivergenceError` when ``images`` ``[N, ...]`` hold NaN or inf (the policy diverged)."""
    bad = ~torch.isfinite(images.flatten(1)).all(1)
    if bool(bad.any()):
        raise DivergenceError(f"The policy diverged: {int(bad.sum())} of {images.shape[0]} of {what} are NaN or inf; "
                              f"lower optim.lr.")
