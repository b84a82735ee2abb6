"""Typed run configuration: nested dataclasses, JSON round trip, ``key=value`` overrides and presets.

A run is fully described by one :class:`TrainConfig`; it is saved as ``config.json`` in the run directory.
Overrides use dotted paths and are type-checked against the dataclass fields::

    vgrpo train --algo vgrpo iterations=40 vgrpo.num_pairs=8 optim.lr=3e-4 advantage.soft_clip=none

Every check and every help text is read from the dataclasses themselves: a field made with :func:`setting`
carries its options (``choices``), its range (``rule``, from :mod:`vgrpo_lib.rules`) and its ``help`` (what
``vgrpo config`` prints); an algorithm's section (a subclass of :class:`AlgorithmSection`) carries
the shared keys the algorithm ignores and its cross-key rules. A config refuses what it would ignore: a key of
another algorithm's section, or a shared key the chosen algorithm does not read (``rollout.solver`` under
Flow-GRPO), is an error that names the algorithm(s) that use it.

Adding an algorithm is one dataclass naming the algorithm(s) that read it, and one field of
:class:`TrainConfig` (an algorithm that only reads another's section adds its name to that section's
``algorithms``, as GRPO-Guard does to Flow-GRPO's)::

    @dataclass
    class AWMConfig(AlgorithmSection):
        algorithms: ClassVar[tuple[str, ...]] = ("awm",)
        loss: ClassVar[type] = AWMLoss  # its _schedulable_rules: the keys schedule.* may drive
        num_pairs: int = setting(6, rule=AT_LEAST_ONE, help="Pairs per sample.")

    class TrainConfig:
        ...
        awm: AWMConfig = field(default_factory=AWMConfig)
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from vgrpo_lib.integrations.distributed import STRATEGIES
from vgrpo_lib.algorithms.autotune import MICRO_BATCH_SIZE
from vgrpo_lib.algorithms.run_logging import LOG_BACKENDS
from vgrpo_lib.algorithms.step_control import SCHEDULED_LR, parse_adaptive_pairs, parse_reference_reset, parse_schedule
from vgrpo_lib.advantages import MULTI_REWARD, SCALES
from vgrpo_lib.elbo import NOISE_SCHEMES, SHARING_SCOPES
from vgrpo_lib.losses import FLOW_GRPO_KL_FORMS, AWMLoss, DGPOLoss, DiffusionNFTLoss, FlowGRPOLoss, VGRPOLoss
from vgrpo_lib.objectives import NFT_ADVANTAGE_MODES
from vgrpo_lib.rules import AT_LEAST_ONE, CLIP_RANGE, FRACTION, NON_NEGATIVE, POSITIVE, SEED, TIME_SHIFT, UNIT_INTERVAL, Rule
from vgrpo_lib.samplers import ODE_SOLVERS
from vgrpo_lib.sde import LOG_PROB_REDUCTIONS, SDE_TYPES
from vgrpo_lib.timesteps import TIMESTEP_SAMPLERS
from vgrpo_lib.weighting import WEIGHTINGS
from vgrpo_lib.errors import UsageError


__all__ = [
    "ALGORITHMS", "AWMConfig", "AdvantageConfig", "AlgorithmSection", "ClipRange", "DGPOConfig", "DiffusionNFTConfig",
    "DistributedConfig", "EvalConfig", "FPOConfig", "FlowGRPOConfig", "FlowGRPOFastConfig", "LogConfig", "ModelConfig",
    "OPTIONS", "OptimConfig", "PRECISIONS", "RENAMED", "RolloutConfig", "ScheduleConfig", "Section", "TrainConfig",
    "VGRPOConfig", "apply_overrides", "check_trained_fraction", "key_users", "parse_image_size", "schedule_targets",
    "setting", "valid_keys", "validate",
]


def setting(default, *, choices=(), rule: Rule | None = None, help: str):
    """A config field with its checks and its documentation: ``choices`` (the valid option strings), ``rule`` (a
    range, checked unless the value is None) and ``help`` (one or two sentences: what the key does, its official
    values; printed by ``vgrpo config`` and the docs' config reference)."""
    return field(default=default, metadata={"choices": tuple(choices), "rule": rule, "help": help})


ClipRange = float | tuple[float, float]  # eps, or a (low, high) pair: "0.01" or "0.01,0.02" on the command line


@dataclass
class Section:
    """Base of every config section: :meth:`check` holds its rules across keys (of the whole config)."""

    def check(self, config: TrainConfig) -> None:
        """Raise a ValueError naming the keys when a rule across keys fails (none by default)."""


@dataclass
class RolloutConfig(Section):
    """How samples are generated during training (the algorithm may override the sampler: Flow-GRPO's SDE)."""

    num_steps: int = setting(10, rule=AT_LEAST_ONE, help="Solver steps of a training rollout.")
    solver: str = setting("euler", choices=ODE_SOLVERS,
                          help="Deterministic ODE solver of V-GRPO's and DiffusionNFT's rollouts.")
    micro_batch_size: int | str | None = setting(
        None, rule=MICRO_BATCH_SIZE,
        help="Samples per rollout micro-batch: the rollout runs in micro-batches of this many samples in turn, each "
             "drawing its own noise (the samples depend on the size) and scored by one reward call. None: the whole "
             "batch at once. auto: "
             "the largest that fits in memory (halved on out-of-memory, recorded in the metrics and checkpoints).",
    )
    overlap_rewards: bool = setting(
        False, help="Score each rollout micro-batch (rollout.micro_batch_size) in a background thread while the next "
        "one is rolled out: a served reward (model.reward=http://...) works while the policy samples. The rewards are "
        "the same as without (the same calls, in the same order).",
    )
    shift: float | None = setting(
        None, rule=TIME_SHIFT,
        help="SD3 time shift of the rollout grid. None: the task's own grid (testbed: uniform; a diffusers task: its "
             "pipeline scheduler's sigmas at the training resolution, FLUX's resolution-dependent shift included).",
    )

    def check(self, config: TrainConfig) -> None:
        if self.overlap_rewards and self.micro_batch_size is None:
            raise UsageError("rollout.overlap_rewards scores a rollout micro-batch while the next rolls out, and "
                             "rollout.micro_batch_size=none rolls out one batch: set rollout.micro_batch_size (or auto).")


@dataclass
class OptimConfig(Section):
    """The optimizer (AdamW), how the rollout is cut into gradient steps, and an EMA of the weights."""

    lr: float = setting(1e-4, rule=POSITIVE, help="AdamW learning rate (schedule.lr may change it over the run).")
    weight_decay: float = setting(0.0, rule=NON_NEGATIVE,
                                  help="AdamW weight decay (official Flow-GRPO / DiffusionNFT: 1e-4).")
    max_grad_norm: float = setting(1.0, rule=POSITIVE, help="Gradients are clipped to this global norm.")
    epochs: int = setting(1, rule=AT_LEAST_ONE, help="Passes over the rollout per iteration.")
    minibatch_size: int | None = setting(
        None, rule=AT_LEAST_ONE,
        help="Rows per gradient step. None: the whole rollout in one gradient step per epoch.",
    )
    minibatches: int | None = setting(
        None, rule=AT_LEAST_ONE,
        help="Or: this many gradient steps per epoch, each on an equal share of the rows (the official Flow-GRPO "
             "batching: 2; the row count may vary, e.g. with flow_grpo.filter_zero_advantage). Exclusive with "
             "optim.minibatch_size.",
    )
    micro_batch_size: int | str | None = setting(
        None, rule=MICRO_BATCH_SIZE,
        help="Rows per forward/backward inside a minibatch (gradient accumulation), and per forward of the prepare "
             "phase (V-GRPO's old surrogates). None: the whole minibatch (and rollout). auto: the largest that fits in "
             "memory (halved on out-of-memory, recorded in the metrics and checkpoints; one process only).",
    )
    max_nonfinite_steps: int = setting(
        5, rule=AT_LEAST_ONE, help="Abort after this many consecutive skipped (non-finite) gradient steps.",
    )
    ema_decay: float | None = setting(
        None, rule=UNIT_INTERVAL,
        help="EMA of the trained weights, evaluated in their place (official Flow-GRPO and DiffusionNFT: 0.9, with "
             "the warm-up min((1 + s) / (10 + s), ema_decay)). None: off.",
    )
    ema_every: int = setting(
        1, rule=AT_LEAST_ONE, help="Gradient steps between EMA updates (official Flow-GRPO: 8, DiffusionNFT: 1).",
    )
    ema_offload: bool = setting(
        False, help="Keep the EMA average in CPU memory (copied to and from the device at each update and evaluation) "
        "instead of beside the trained weights on the GPU.",
    )
    max_kl: float | None = setting(
        None, rule=POSITIVE,
        help="Early stop of the epochs: skip the rest once an epoch's mean approx_kl_k3 exceeds this (None: never); "
             "for the algorithms with an importance ratio (a clip_range).",
    )

    def check(self, config: TrainConfig) -> None:
        if self.max_kl is not None:
            ratio = [name for name, s in _algorithm_sections().items() if "clip_range" in {f.name for f in fields(s)}]
            if not any(config.algo in _algorithm_sections()[name].algorithms for name in ratio):
                users = [algo for name in ratio for algo in _algorithm_sections()[name].algorithms]
                raise UsageError(f"optim.max_kl stops on the importance ratio's KL, which {config.algo} does not have; "
                                 f"it is used by {', '.join(users)}.")
        if self.minibatches is not None and self.minibatch_size is not None:
            raise UsageError("optim.minibatches and optim.minibatch_size both set the gradient steps per epoch: set one.")
        if self.ema_offload and self.ema_decay is None:
            raise UsageError("optim.ema_offload places the EMA average, which is off: set optim.ema_decay too.")
        if self.ema_decay is not None and config.distributed.strategy == "fsdp2":
            raise UsageError("optim.ema_decay is not supported with distributed.strategy=fsdp2 (the average is not sharded).")


@dataclass
class AdvantageConfig(Section):
    """Group-relative advantages (:class:`vgrpo_lib.advantages.GroupAdvantage`), for every algorithm."""

    scale: str = setting("group", choices=SCALES,
                         help="How the rewards are normalised: group (by each prompt group's std) | batch (by the "
                              "batch's std: official Flow-GRPO / DiffusionNFT) | none | rank | trimmed (see "
                              "vgrpo_lib.advantages.GroupAdvantage).")
    soft_clip: float | None = setting(None, rule=POSITIVE, help="eta of the soft clip eta * tanh(A / eta). None: off.")
    clip: float | None = setting(
        None, rule=POSITIVE,
        help="Hard clip of the advantages to [-clip, clip], before the soft clip (official Flow-GRPO: 5). None: off.",
    )
    eps: float = setting(1e-6, rule=NON_NEGATIVE,
                         help="Added to the scale (official Flow-GRPO / DiffusionNFT: 1e-4).")
    multi_reward: str = setting(
        "sum_then_normalize", choices=MULTI_REWARD,
        help="Several rewards (model.reward=pickscore:1,ocr:0.5; a task's weighted reward): sum_then_normalize (the "
             "weighted sum of the raw scores is normalised per group: official Flow-GRPO) | normalize_then_sum (each "
             "reward is normalised per group, then weighted and summed: no reward dominates by its scale).",
    )
    downsample: int | None = setting(
        None, rule=Rule(lambda v: v >= 2, ">= 2 (a group-relative advantage needs two samples)"),
        help="Update on this many of each group's group_size samples: those whose rewards vary most (PODS "
             "max-variance down-sampling, vgrpo_lib.advantages.max_variance_subset), their advantages computed among "
             "them; the update then costs downsample / group_size of the whole rollout's. None: every sample.",
    )

    def check(self, config: TrainConfig) -> None:
        if self.downsample is not None and self.downsample > config.group_size:
            raise UsageError(f"advantage.downsample={self.downsample} keeps more samples than a group has "
                             f"(group_size={config.group_size}).")


@dataclass
class ScheduleConfig(Section):
    """Values that change over the run (:mod:`vgrpo_lib.algorithms.step_control`), from the configured value, one step per
    iteration: ``constant``, ``linear:end=E,steps=N``, ``cosine:end=E,steps=N``,
    ``piecewise:at=B1/B2,values=V0/V1/V2``, each with an optional ``warmup=W``; and for the KL coefficients
    ``adaptive:target=T,horizon=H`` (the adaptive KL controller). None: the configured value throughout. Every value
    a schedule reaches is checked before the run starts: the learning rate's must be >= 0, any other's obeys the
    rule its loss declares for it (``_schedulable_rules`` of :mod:`vgrpo_lib.losses`)."""

    lr: str | None = setting(None, help="Schedule of the learning rate, from optim.lr (may decay to 0).")
    clip_range: str | None = setting(None, help="Schedule of the clip range, from <algo>.clip_range (a single eps).")
    behaviour_kl_coef: str | None = setting(
        None, help="Schedule of the behaviour-KL coefficient, from <algo>.behaviour_kl_coef (which must be set; 0 "
                   "starts it off).",
    )
    ref_kl_coef: str | None = setting(
        None, help="Schedule of the reference-KL coefficient, from <algo>.ref_kl_coef (which must be set; 0 starts "
                   "it off).",
    )
    reference_reset: str | None = setting(
        None, help="GARDO's reference reset, kl=K,every=N (either or both): the reference of <algo>.ref_kl_coef's KL "
                   "(which must be set) becomes a copy of the policy after an iteration whose mean ref_kl exceeds K, or "
                   "once more than N iterations passed since the last reset (official kl_thres 3e-4, reset_freq 15). "
                   "On the testbed the reference is a copy; on a LoRA model a frozen adapter. None: the base throughout.",
    )

    def check(self, config: TrainConfig) -> None:
        rules = {"lr": SCHEDULED_LR}
        for section in _algorithm_sections().values():
            rules |= section.schedulable() if config.algo in section.algorithms else {}
        for name, (start, spec) in schedule_targets(config).items():
            if name == "reference_reset":
                parse_reference_reset(spec, "schedule.reference_reset")
            else:
                parse_schedule(spec, start, f"schedule.{name}", rules[name], adaptive=name.endswith("kl_coef"))


def schedule_targets(config: TrainConfig) -> dict[str, tuple[float, str]]:
    """Each scheduled value's name, start value and schedule: ``lr`` from ``optim.lr``, any other from the section
    of the chosen algorithm whose loss declares it schedulable (:meth:`AlgorithmSection.schedulable`; a ValueError
    naming the key where there is none or it is unset)."""
    targets = {}
    sections = {name: getattr(config, name) for name, s in _algorithm_sections().items() if config.algo in s.algorithms}
    for f in fields(ScheduleConfig):
        spec = getattr(config.schedule, f.name)
        if spec is None:
            continue
        if f.name == "lr":
            targets["lr"] = (config.optim.lr, spec)
            continue
        value = "ref_kl_coef" if f.name == "reference_reset" else f.name  # the reset acts on the reference KL's term
        owner = next((name for name, section in sections.items() if value in section.schedulable()), None)
        if owner is None:
            raise UsageError(f"schedule.{f.name}: {config.algo} has no {value} to {'reset' if value != f.name else 'schedule'}.")
        start = getattr(sections[owner], value)
        if start is None:
            raise UsageError(
                f"schedule.{f.name} needs {owner}.{value} set: the term exists only when its coefficient is "
                f"(set it to the start value, e.g. 0)."
            )
        if isinstance(start, tuple):
            raise UsageError(f"schedule.{f.name} needs a single eps in {owner}.{f.name}, got the pair {start}.")
        targets[f.name] = (float(start), spec)
    return targets


@dataclass
class AlgorithmSection(Section):
    """Base of an algorithm's config section: ``algorithms`` names the algorithms that read it (the first usually
    gives the section its name); its :meth:`check` runs only when one of them is chosen. ``ignores`` maps keys of
    other sections that these algorithms do not read to the reason (setting one is an error). ``loss`` is the loss
    module these algorithms build from the section: the keys its ``_schedulable_rules`` declare are the ones a
    ``schedule.*`` may drive."""

    algorithms: ClassVar[tuple[str, ...]] = ()
    ignores: ClassVar[dict[str, str]] = {}
    loss: ClassVar[type | None] = None

    @classmethod
    def schedulable(cls) -> dict[str, Rule]:
        """The section's keys that a schedule may drive, each with the rule its loss declares."""
        declared = cls.loss._schedulable_rules if cls.loss is not None else {}
        return {f.name: declared[f.name] for f in fields(cls) if f.name in declared}


def check_trained_fraction(key: str, fraction: float, config: TrainConfig) -> None:
    """``int(rollout.num_steps * fraction)`` must leave a step to train."""
    if int(config.rollout.num_steps * fraction) < 1:
        raise UsageError(
            f"{key} must leave at least one of rollout.num_steps={config.rollout.num_steps} steps to train, got "
            f"{fraction}."
        )


@dataclass
class VGRPOConfig(AlgorithmSection):
    """V-GRPO: the ELBO surrogate's pairs and the clipped whole-sample ratio."""

    algorithms: ClassVar[tuple[str, ...]] = ("vgrpo",)
    loss: ClassVar[type] = VGRPOLoss

    num_pairs: int = setting(4, rule=AT_LEAST_ONE, help="K, the timestep-noise pairs of each sample's ELBO surrogate.")
    timesteps: str = setting("stratified", choices=TIMESTEP_SAMPLERS, help="How the pairs' timesteps are drawn.")
    sharing: str = setting("group", choices=SHARING_SCOPES,
                           help="Which samples share their pairs (group: every sample of a prompt group).")
    weighting: str = setting("adaptive_x", choices=WEIGHTINGS, help="Weighting of each pair's flow-matching loss.")
    noise: str = setting(
        "independent", choices=NOISE_SCHEMES,
        help="independent | antithetic (ours, beyond the paper: K/2 couples (eps, -eps) at a shared t; needs an even "
             "vgrpo.num_pairs).",
    )
    clip_range: ClipRange = setting(
        0.01, rule=CLIP_RANGE,
        help="eps or LOW,HIGH of the clipped whole-sample ratio (the paper: about 6e-3 to 3e-2, not LLM-style 0.2).",
    )
    behaviour_kl_coef: float | None = setting(
        None, rule=NON_NEGATIVE, help="x-space KL to the behaviour policy (paper: 0.3 where used). None: no term.",
    )
    ref_kl_coef: float | None = setting(None, rule=NON_NEGATIVE,
                                        help="x-space KL to the base policy. None: no term.")
    chunk_size: int | None = setting(
        None, rule=AT_LEAST_ONE,
        help="Largest number of model rows per surrogate forward (the estimator runs B*K rows; this bounds "
             "memory). None: all at once.",
    )
    adaptive_pairs: str | None = setting(
        None,
        help="Ours, beyond the paper: K chosen from the measured noise, share=S,max=K (optionally every=N, "
             "smoothing=B): every N-th iteration (default 1) measures the Monte-Carlo noise share of the within-group surrogate variance on "
             "the training batch from its per-pair terms and takes the smallest K in [2, max] predicted to keep it at "
             "most S, starting from vgrpo.num_pairs (costs K forwards without grad on a measured iteration with one "
             "step per rollout; free otherwise); with B > 0 it chooses from moving averages of the measurements, each "
             "new one weighted 1 - B (default 0: each alone). None: K = vgrpo.num_pairs throughout.",
    )

    def check(self, config: TrainConfig) -> None:
        if self.noise == "antithetic" and self.num_pairs % 2:
            raise UsageError(f"vgrpo.num_pairs must be even with vgrpo.noise=antithetic, got {self.num_pairs}.")
        if self.adaptive_pairs is not None:
            parse_adaptive_pairs(self.adaptive_pairs, "vgrpo.adaptive_pairs", self.num_pairs, self.noise == "antithetic")


@dataclass
class FlowGRPOConfig(AlgorithmSection):
    """Flow-GRPO's settings (MixGRPO: a sliding SDE window); also GRPO-Guard's and Flow-GRPO-Fast's (the same SDE
    rollout and clipped loss)."""

    algorithms: ClassVar[tuple[str, ...]] = ("flow_grpo", "grpo_guard", "flow_grpo_fast")
    ignores: ClassVar[dict[str, str]] = {"rollout.solver": "its rollout is its own SDE sampler"}
    loss: ClassVar[type] = FlowGRPOLoss

    noise_level: float = setting(
        0.7, rule=POSITIVE,
        help="SDE noise: a of sigma_t = a sqrt(t / (1 - t)) with flow_sde; eta in (0, 1] with cps.",
    )
    sde_type: str = setting(
        "flow_sde", choices=SDE_TYPES,
        help="flow_sde | cps (coefficients-preserving sampling; its step to t = 0 is an ODE step).",
    )
    clip_range: ClipRange = setting(1e-4, rule=CLIP_RANGE,
                                    help="eps or LOW,HIGH of the per-transition clipped ratio (official: 1e-4).")
    log_prob_reduction: str = setting("mean", choices=LOG_PROB_REDUCTIONS,
                                      help="How a transition's log-density is reduced over the data dimensions.")
    ref_kl_coef: float | None = setting(
        None, rule=NON_NEGATIVE,
        help="Closed-form Gaussian KL to the base policy (official: 0.04, 0.01 with kl_form=flow_grpo). None: no "
             "term.",
    )
    kl_form: str = setting("exact", choices=FLOW_GRPO_KL_FORMS,
                           help="exact | flow_grpo (the official: |dt| times the exact KL; see FlowGRPOLoss).")
    timestep_fraction: float = setting(
        1.0, rule=FRACTION, help="Train the first int(num_steps * fraction) SDE steps (official: 0.99 -> 9 of 10).",
    )
    filter_zero_advantage: bool = setting(
        False, help="Samples whose advantage is exactly 0 are not trained (official: true).",
    )
    cfg_scale: float = setting(
        1.0, rule=POSITIVE,
        help="Classifier-free guidance in rollout and loss, the unconditional branch detached (official: 4.5).",
    )
    window_size: int | None = setting(
        None, rule=AT_LEAST_ONE, help="MixGRPO: SDE only inside a sliding window of this many steps. None: off.",
    )
    window_shift_interval: int = setting(25, rule=AT_LEAST_ONE,
                                         help="MixGRPO: iterations between shifts of the window.")

    def check(self, config: TrainConfig) -> None:
        steps = config.rollout.num_steps
        if self.window_size is not None and self.window_size > steps:
            raise UsageError(f"flow_grpo.window_size must be in 1..rollout.num_steps={steps}, got {self.window_size}.")
        check_trained_fraction("flow_grpo.timestep_fraction", self.timestep_fraction, config)
        if self.window_size is not None and self.timestep_fraction != 1.0:
            raise UsageError("flow_grpo.timestep_fraction and flow_grpo.window_size both choose the trained steps: set one.")
        if self.sde_type == "cps" and self.noise_level > 1:
            raise UsageError(f"flow_grpo.noise_level must be in (0, 1] with flow_grpo.sde_type=cps, got {self.noise_level}.")
        if self.sde_type == "cps" and self.window_size is not None:
            raise UsageError(
                "flow_grpo.window_size (MixGRPO) slides onto the last step, which has no noise with flow_grpo.sde_type=cps."
            )


@dataclass
class DiffusionNFTConfig(AlgorithmSection):
    """DiffusionNFT: implicit positive / negative policies around a soft-updated old policy."""

    algorithms: ClassVar[tuple[str, ...]] = ("diffusion_nft",)
    ignores: ClassVar[dict[str, str]] = {
        "advantage.clip": "its Amax is diffusion_nft.advantage_max, which bounds and normalises the advantages; "
                          "configs before it named Amax advantage.clip",
    }
    loss: ClassVar[type] = DiffusionNFTLoss

    strength: float = setting(1.0, rule=POSITIVE,
                              help="b, the implicit-policy mixing strength (official: 1.0 GenEval, 0.1 OCR).")
    advantage_max: float = setting(
        5.0, rule=POSITIVE,
        help="Amax: the advantages are clamped to [-Amax, Amax] and normalised into the optimality r = A / (2 Amax) "
             "+ 1/2; the loss is scaled by Amax / b (official adv_clip_max: 5).",
    )
    adv_mode: str = setting(
        "all", choices=NFT_ADVANTAGE_MODES,
        help="The official adv_mode: all | positive_only | negative_only | one_only | binary.",
    )
    timestep_fraction: float = setting(
        1.0, rule=FRACTION,
        help="Train int(num_steps * fraction) distinct rollout timesteps per sample, fresh each step (official 0.99: "
             "9 of 10).",
    )
    weighting: str = setting("adaptive_x", choices=WEIGHTINGS, help="Weighting of each pair's flow-matching loss.")
    decay_rate: float = setting(
        0.001, rule=NON_NEGATIVE,
        help="Old policy's soft update: d = 0 for the first decay_flat gradient steps, then min(decay_rate * (steps - "
             "decay_flat), decay_max) (official type 1: 0.001, 0.5, 0; type 2: 0.0075, 0.999, 75).",
    )
    decay_max: float = setting(0.5, rule=UNIT_INTERVAL, help="Largest decay d of the old policy's soft update.")
    decay_flat: int = setting(0, rule=NON_NEGATIVE,
                              help="Gradient steps before the old policy's soft update starts decaying.")
    ref_kl_coef: float | None = setting(
        None, rule=NON_NEGATIVE, help="Velocity MSE to the base policy (official: 1e-4). None: no term.",
    )

    def check(self, config: TrainConfig) -> None:
        check_trained_fraction("diffusion_nft.timestep_fraction", self.timestep_fraction, config)


@dataclass
class FlowGRPOFastConfig(AlgorithmSection):
    """Flow-GRPO-Fast: SDE and training on a window of consecutive steps of an ODE rollout (SDE settings:
    ``flow_grpo.*``)."""

    algorithms: ClassVar[tuple[str, ...]] = ("flow_grpo_fast",)
    ignores: ClassVar[dict[str, str]] = {
        key: "its branching window chooses the trained steps"
        for key in ("flow_grpo.window_size", "flow_grpo.window_shift_interval", "flow_grpo.timestep_fraction")
    }

    branch_steps: int = setting(2, rule=AT_LEAST_ONE, help="Steps in the window (official sde_window_size: 2-3).")
    branch_range: float = setting(
        0.5, rule=FRACTION, help="The window lies in the first int(branch_range * num_steps) steps (official: half).",
    )

    def check(self, config: TrainConfig) -> None:
        steps = config.rollout.num_steps
        span = int(self.branch_range * steps)
        if self.branch_steps > span:
            raise UsageError(
                f"flow_grpo_fast.branch_steps must be <= int(branch_range * rollout.num_steps) = {span}, got "
                f"{self.branch_steps}."
            )
        if config.flow_grpo.sde_type == "cps" and span >= steps:
            raise UsageError(
                "flow_grpo_fast.branch_range must leave out the last step with flow_grpo.sde_type=cps (it has no noise)."
            )


@dataclass
class FPOConfig(AlgorithmSection):
    """FPO: the clipped ratio of conditional flow-matching losses on independent pairs (official playground
    values)."""

    algorithms: ClassVar[tuple[str, ...]] = ("fpo",)
    loss: ClassVar[type] = VGRPOLoss

    num_pairs: int = setting(8, rule=AT_LEAST_ONE, help="Pairs per sample (official n_samples_per_action: 8).")
    timesteps: str = setting(
        "grid", choices=("grid", *TIMESTEP_SAMPLERS),
        help="grid: i.i.d. from the rollout grid (official discretize_t_for_training) | a timestep sampler name.",
    )
    weighting: str = setting(
        "v", choices=WEIGHTINGS,
        help="The CFM loss ||v - (eps - x)||^2: v (the paper's; the playground default supervises eps).",
    )
    clip_range: ClipRange = setting(0.05, rule=CLIP_RANGE, help="eps or LOW,HIGH of the clipped ratio (official: 0.05).")


@dataclass
class AWMConfig(AlgorithmSection):
    """AWM: advantage-weighted flow matching (official SD3.5-M GenEval/OCR configs)."""

    algorithms: ClassVar[tuple[str, ...]] = ("awm",)
    loss: ClassVar[type] = AWMLoss

    num_pairs: int = setting(6, rule=AT_LEAST_ONE, help="Pairs per sample (official train_timesteps: 6).")
    timestep_fraction: float = setting(
        0.9, rule=FRACTION, help="The pairs' timesteps are the rollout grid's steps 1 .. int(fraction * T) - 1.",
    )
    weighting: str = setting("ghuber", choices=WEIGHTINGS, help="Weighting of the matching loss (official: ghuber).")
    advantage_scale: float = setting(
        0.2, rule=POSITIVE, help="Multiplies the advantages (official advantage_max / adv_clip_max = 1 / 5).",
    )
    behaviour_kl_coef: float | None = setting(
        1.0, rule=NON_NEGATIVE, help="Velocity MSE to the soft-updated copy (official: 1). None: no term.",
    )
    ref_kl_coef: float | None = setting(
        None, rule=NON_NEGATIVE,
        help="Velocity MSE to the base policy (official beta: 0.001 GenEval, 0.003 OCR). None: no term.",
    )
    decay_rate: float = setting(0.001, rule=NON_NEGATIVE,
                                help="The copy's decay d = min(decay_rate * gradient steps so far, decay_max).")
    decay_max: float = setting(0.3, rule=UNIT_INTERVAL, help="Largest decay d of the copy (official: 0.3).")

    def check(self, config: TrainConfig) -> None:
        steps = config.rollout.num_steps
        if int(self.timestep_fraction * steps) < 2:
            raise UsageError(
                f"awm.timestep_fraction * rollout.num_steps must be >= 2 (the pairs' timesteps are the grid's steps "
                f"1 .. int(fraction * num_steps) - 1), got {self.timestep_fraction} * {steps}."
            )


@dataclass
class DGPOConfig(AlgorithmSection):
    """DGPO: group-level preference optimisation on ODE samples (official Luo-Yihong/DGPO, config/dgpo.py over
    config/base.py, and scripts/train_sd3_dgpo.py)."""

    algorithms: ClassVar[tuple[str, ...]] = ("dgpo",)
    loss: ClassVar[type] = DGPOLoss

    num_pairs: int = setting(
        4, rule=AT_LEAST_ONE,
        help="Pairs per sample, shared by the members of a group (official num_train_timesteps: 4, with one noise per "
             "group: use_shared_noise).",
    )
    last_trained_step: int = setting(
        4, rule=NON_NEGATIVE,
        help="The pairs' timesteps are num_pairs distinct points of the rollout grid's steps 0 .. last_trained_step "
             "(official trunc_steps: 4 GenEval, 6 OCR / PickScore; step 0 is pure noise).",
    )
    beta: float = setting(
        100.0, rule=POSITIVE,
        help="Preference temperature of the group weight sigmoid(beta * group mean of A (l - l_ref)) (official beta_dpo: "
             "100 GenEval / OCR, 10 PickScore; 2000-5000 with preference_reference=copy).",
    )
    preference_reference: str = setting(
        "base", choices=("base", "copy"),
        help="Whose denoising loss l_ref the preference compares with: base (the frozen base policy: official) | copy "
             "(the soft-updated copy: official use_ema_ref).",
    )
    weighting: str = setting("v", choices=WEIGHTINGS,
                             help="Weighting of the denoising loss l (official: the velocity MSE, v).")
    clip_range: ClipRange | None = setting(
        0.01, rule=CLIP_RANGE,
        help="eps or LOW,HIGH: a pair's loss stops its gradient when exp(l_copy - l) leaves [1 - eps, 1 + eps] on the "
             "advantage's side (official clip_range: 1e-2 GenEval / OCR, 5e-2 PickScore; clip_dsm). None: no clip.",
    )
    ref_kl_coef: float | None = setting(
        None, rule=NON_NEGATIVE,
        help="Velocity MSE to the base policy (official beta: 0.02 GenEval / OCR, 0.001 PickScore). None: no term.",
    )
    reference_cfg_scale: float = setting(
        1.0, rule=POSITIVE,
        help="CFG scale of the base policy's prediction in the preference and the KL (official kl_cfg: 1, no CFG; 4.5 "
             "in the CFG-free mode). 1: no CFG.",
    )
    rollout_cfg_scale: float = setting(
        1.0, rule=POSITIVE,
        help="CFG scale of the rollouts; training is CFG-free (official sample.guidance_scale: 4.5). 1: no CFG.",
    )
    decay_rate: float = setting(
        0.001, rule=NON_NEGATIVE,
        help="The copy's decay d = min(decay_rate * gradient steps so far, decay_max) (official ema_ref: 0.001).",
    )
    decay_max: float = setting(0.3, rule=UNIT_INTERVAL, help="Largest decay d of the copy (official: 0.3).")
    copy_rollout_after: int | None = setting(
        None, rule=NON_NEGATIVE,
        help="Rollouts of the iterations after this one come from the soft-updated copy (official switch_ema_ref, in "
             "gradient steps, one per iteration: 500 GenEval, 200 OCR / PickScore). None: always the policy.",
    )

    def check(self, config: TrainConfig) -> None:
        steps, pairs = config.rollout.num_steps, self.num_pairs
        if self.last_trained_step >= steps:
            raise UsageError(f"dgpo.last_trained_step must be < rollout.num_steps={steps} (a step of the rollout grid), "
                             f"got {self.last_trained_step}.")
        if pairs > self.last_trained_step + 1:
            raise UsageError(f"dgpo.num_pairs={pairs} distinct timesteps need dgpo.last_trained_step >= {pairs - 1}, got "
                             f"{self.last_trained_step}.")
        optim = config.optim
        if optim.minibatches not in (None, 1) or optim.minibatch_size is not None:
            raise UsageError("dgpo weighs each group by a sum over its members, so a gradient step takes whole groups: "
                             "optim.minibatches and optim.minibatch_size must be unset (one step per epoch on the "
                             "whole rollout, as the official code).")
        micro = optim.micro_batch_size
        downsample = config.advantage.downsample
        group = f"group_size={config.group_size}" if downsample is None else \
            f"advantage.downsample={downsample} (the samples of each group it trains on)"
        if micro is not None and (not isinstance(micro, int) or micro % config.trained_per_group):
            raise UsageError(f"dgpo needs whole groups in every micro-batch: optim.micro_batch_size must be a multiple "
                             f"of {group}, got {micro!r}.")
        if optim.max_kl is not None and self.clip_range is None:
            raise UsageError("optim.max_kl stops on the clip's ratio: set dgpo.clip_range too.")


def parse_image_size(text: str) -> int | tuple[int, int] | None:
    """``"512"`` -> 512, ``"720x1280"`` -> (720, 1280); None unless every side is a positive multiple of 16."""
    parts = text.lower().split("x")
    if len(parts) > 2 or not all(part.strip().isdigit() for part in parts):
        return None
    sides = [int(part) for part in parts]
    if not all(side > 0 and side % 16 == 0 for side in sides):
        return None
    return sides[0] if len(sides) == 1 else (sides[0], sides[1])


@dataclass
class ModelConfig(Section):
    """The diffusers tasks (``task=sd3.5-medium`` / ``flux.1-dev`` / ``flux.2-dev`` / ``qwen-image`` / ``mnist-sd3/<task>``
    ...); testbed tasks ignore
    this section. ``None`` means the task's own value (the mnist-sd3 tasks bring prompts, reward and image size)."""

    path: str | None = setting(
        None, help="Local diffusers pipeline directory or hub id. None: the task's, from the Hugging Face cache.",
    )
    prompts: str | None = setting(
        None, help="Training prompt file, one prompt per line (required by the hub models: sd3.5-medium, flux.1-dev, ...).",
    )
    eval_prompts: str | None = setting(
        None, help="Evaluation prompt file. None: the task's, else the first 8 training prompts.",
    )
    reward: str | None = setting(
        None, help="A reward name, a weighted sum such as pickscore:1,ocr:0.5, the import path of your own "
        "reward, my_module:my_reward, a callable (images, prompts) -> (N,), or the URL of a served reward "
        "(vgrpo reward-server), http://HOST:PORT/NAME, alone or in a weighted sum. None: the task's (pickscore).",
    )
    image_size: str | None = setting(
        None, rule=Rule(lambda v: parse_image_size(v) is not None, "'H' or 'HxW' with positive multiples of 16"),
        help="Image size in pixels, 512 or HxW. None: the task's (512 SD3.5-M, FLUX.2-dev and Qwen-Image, 720 "
        "FLUX.1-dev, 384 FLUX.2 klein).",
    )
    eval_image_size: str | None = setting(
        None, rule=Rule(lambda v: parse_image_size(v) is not None, "'H' or 'HxW' with positive multiples of 16"),
        help="Size of the evaluation (and vgrpo sample) images, 512 or HxW, when it differs from the training "
        "rollouts' model.image_size (train smaller to save memory and time). None: model.image_size.",
    )
    lora_rank: int = setting(32, rule=AT_LEAST_ONE, help="Rank of the trained LoRA adapters.")
    lora_alpha: int = setting(64, rule=AT_LEAST_ONE, help="LoRA alpha (the adapters are scaled by alpha / rank).")
    device: str | None = setting(
        None, help="Device of the model. None: this process's GPU (cuda:LOCAL_RANK), the CPU without CUDA.",
    )
    dtype: str = setting("bfloat16", choices=("bfloat16", "float16", "float32"), help="Storage dtype of the weights.")
    max_sequence_length: int | None = setting(
        None, rule=NON_NEGATIVE, help="Text tokens per prompt (T5 for SD3 / FLUX.1). None: the pipeline's, 256 SD3 / "
        "512 FLUX, FLUX.2, Qwen-Image; 0 without T5.",
    )
    gradient_checkpointing: bool | None = setting(None, help="Gradient checkpointing. None: on with CUDA.")
    gradient_checkpointing_every: int = setting(
        1, rule=AT_LEAST_ONE,
        help="With gradient checkpointing on, recompute only every N-th transformer block in the backward pass (the "
        "N-th, 2N-th, ... in the order the transformer runs them, as torchtitan's per-layer selective checkpointing); "
        "the others keep their activations. 1: every block (least memory); a larger N: less recomputation, more memory.",
    )
    batch_size: int = setting(
        8, rule=AT_LEAST_ONE, help="Samples per evaluation forward, VAE decode and text-encoder call.",
    )
    without_t5: bool = setting(
        False, help="SD3: load without T5 (text_encoder_3=None); its tokens are max_sequence_length zeros.",
    )
    frames: int | None = setting(
        None, rule=AT_LEAST_ONE,
        help="Video models (wan2.1-t2v): frames per video, 4k + 1 (1, 5, 33, 81). None: the model's (Wan: 81).",
    )
    negative_prompt: str | None = setting(
        None, help="Evaluation only: the negative prompt of true CFG (the qwen-image preset: the empty prompt, as "
        "Flow-Factory's recipes). None: CFG-free evaluation. Training rollouts and losses stay CFG-free.",
    )
    true_cfg_scale: float = setting(
        1.0, rule=POSITIVE, help="Evaluation only: the true-CFG scale against model.negative_prompt (qwen-image: 4.0, "
        "its pipeline's default; the norm-rescaled CFG of QwenImagePipeline). 1: no CFG.",
    )

    def check(self, config: TrainConfig) -> None:
        if self.gradient_checkpointing is False and self.gradient_checkpointing_every != 1:
            raise UsageError("model.gradient_checkpointing_every chooses the checkpointed blocks, but "
                             "model.gradient_checkpointing=false turns checkpointing off: drop one of them.")


@dataclass
class DistributedConfig(Section):
    """Multi-process training under torchrun (see :mod:`vgrpo_lib.integrations.distributed`)."""

    strategy: str = setting(
        "ddp", choices=STRATEGIES,
        help="ddp | fsdp2 (parameters, gradients and optimizer state sharded over processes).",
    )


@dataclass
class EvalConfig(Section):
    """Evaluation on held-out seeds during and after training."""

    every: int = setting(
        10, rule=NON_NEGATIVE, help="Iterations between evaluations (0: only at the start and the end).",
    )
    per_prompt: int = setting(20, rule=AT_LEAST_ONE, help="Samples per evaluation prompt.")
    num_steps: int = setting(40, rule=AT_LEAST_ONE, help="ODE steps of an evaluation sample.")
    seed: int = setting(12345, rule=SEED, help="Seed of the held-out evaluation noise (independent of the training seed).")


@dataclass
class LogConfig(Section):
    """Where the metrics and sample grids go besides the run directory's files (TorchRL's loggers, see
    :mod:`vgrpo_lib.algorithms.run_logging`)."""

    backend: str = setting(
        "auto", choices=LOG_BACKENDS,
        help="auto (TensorBoard when installed, else CSV) | tensorboard | csv | wandb (Weights & Biases; "
             "WANDB_MODE=offline keeps it on this machine).",
    )
    project: str | None = setting(None, help="The wandb project (needs log.backend=wandb). None: wandb's default.")

    def check(self, config: TrainConfig) -> None:
        if self.project is not None and self.backend != "wandb":
            raise UsageError(f"log.project names a wandb project; it needs log.backend=wandb, got {self.backend}.")


PRECISIONS = ("float32", "bfloat16")


@dataclass
class TrainConfig:
    """One training run: the algorithm (``algo``, the name of one :class:`AlgorithmSection` field below), the
    task, the batch (``prompts_per_iteration`` prompts x ``group_size`` samples) and every section."""

    algo: str = setting("vgrpo", help="The algorithm: the name of one algorithm section.")
    task: str = setting("digit", help="The task: a registered name (a testbed task, mnist-sd3/<task>, a hub model) "
                        "or the import path of your own task's factory, package.module:factory.")
    seed: int = setting(0, rule=SEED, help="Seed of the run (rollout noise, pairs, minibatches).")
    iterations: int = setting(60, rule=AT_LEAST_ONE, help="Training iterations (rollout, rewards, update).")
    prompts_per_iteration: int = setting(8, rule=AT_LEAST_ONE, help="Prompts (groups) per iteration.")
    group_size: int = setting(
        16, rule=Rule(lambda v: v >= 2, ">= 2 (a group-relative advantage needs two samples)"),
        help="Samples per prompt: the group of a group-relative advantage.",
    )
    checkpoint_every: int = setting(10, rule=AT_LEAST_ONE, help="Iterations between checkpoints.")
    reward_retries: int = setting(
        2, rule=NON_NEGATIVE, help="A reward function that raises is retried this many times, then the run fails.",
    )
    precision: str = setting(
        "float32", choices=PRECISIONS,
        help="float32 | bfloat16: model forwards of rollouts, old surrogates and losses under bf16 autocast "
             "(parameters, optimizer and the losses' arithmetic on the fp32 samples stay float32); evaluation always "
             "in float32.",
    )
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    vgrpo: VGRPOConfig = field(default_factory=VGRPOConfig)
    flow_grpo: FlowGRPOConfig = field(default_factory=FlowGRPOConfig)
    diffusion_nft: DiffusionNFTConfig = field(default_factory=DiffusionNFTConfig)
    fpo: FPOConfig = field(default_factory=FPOConfig)
    awm: AWMConfig = field(default_factory=AWMConfig)
    dgpo: DGPOConfig = field(default_factory=DGPOConfig)
    flow_grpo_fast: FlowGRPOFastConfig = field(default_factory=FlowGRPOFastConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self):
        validate(self)

    @classmethod
    def for_algo(cls, algo: str, preset: str = "testbed", task: str | None = None,
                 overrides: Sequence[str] = ()) -> TrainConfig:
        """A valid config for ``algo``: the defaults, then the preset's settings for it (``testbed``: each
        algorithm's testbed default; see :mod:`vgrpo_lib.algorithms.presets`), then ``task`` and its preset
        settings, then ``overrides`` (``key=value``): what ``vgrpo train --algo A --preset P --task T ...`` runs.
        ``TrainConfig.for_algo("diffusion_nft")`` is DiffusionNFT at its testbed settings."""
        from vgrpo_lib.algorithms.presets import build_config  # the presets are built on this module

        return build_config(algo, task, preset, list(overrides))

    @property
    def trained_per_group(self) -> int:
        """How many of each group's ``group_size`` samples the update trains on (``advantage.downsample``, else all)."""
        return self.group_size if self.advantage.downsample is None else self.advantage.downsample

    def to_dict(self) -> dict:
        """What ``config.json`` holds: every key the chosen algorithm uses (not the other algorithms' sections, not
        the keys it ignores)."""
        sections = _algorithm_sections()
        data = {k: v for k, v in asdict(self).items() if k not in sections or self.algo in sections[k].algorithms}
        for key in _ignored(self.algo):
            *sections, name = key.split(".")
            target = data
            for section in sections:
                target = target[section]
            del target[name]
        return data

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON with sorted keys (``config.json``)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """Build from a (JSON) mapping: unknown keys and wrong types are refused, and so are keys the algorithm
        does not use unless they hold their defaults (a ``config.json`` written with every section reads back)."""
        return _build(cls, data, "")


def _section_values(config: TrainConfig) -> dict[str, Section]:
    return {f.name: getattr(config, f.name) for f in fields(config) if isinstance(getattr(config, f.name), Section)}


def _sections(cls) -> dict[str, type]:
    return {f.name: _resolve(_field_types(cls)[f.name])[0] for f in fields(cls)}


def _walk(config, prefix: str = "") -> Iterator[tuple[str, Any, dataclasses.Field]]:
    """``(dotted key, value, field)`` of every leaf of ``config``."""
    for f in fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from _walk(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, value, f


def validate(config: TrainConfig) -> None:
    """Options, ranges, finiteness and cross-key rules, each error naming the key; then keys the chosen algorithm
    does not use must keep their defaults."""
    if config.algo not in ALGORITHMS:
        raise UsageError(f"Unknown algorithm {config.algo!r}; expected one of {', '.join(ALGORITHMS)}.")
    for key, value, f in _walk(config):
        choices, rule = f.metadata.get("choices"), f.metadata.get("rule")
        if choices and value not in choices:
            raise UsageError(f"Unknown {key} {value!r}; expected one of {', '.join(map(repr, choices))}.")
        # NaN passes a plain `value <= 0` check and ends as a NaN loss or rate
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{key} must be finite, got {value}.")
        if rule is not None and value is not None and not rule.ok(value):
            raise UsageError(f"{key} must be {rule.text}, got {value!r}.")
    _check_used(config.algo, [key for key, value, f in _walk(config) if value != f.default])
    for section in _section_values(config).values():
        if not isinstance(section, AlgorithmSection) or config.algo in section.algorithms:
            section.check(config)


@functools.cache
def _algorithm_sections() -> dict[str, type[AlgorithmSection]]:
    """TrainConfig's algorithm sections: field name -> section class."""
    return {name: tp for name, tp in _sections(TrainConfig).items()
            if isinstance(tp, type) and issubclass(tp, AlgorithmSection)}


def _ignored(algo: str) -> dict[str, str]:
    """The keys ``algo`` does not read and why: the ``ignores`` of every section it reads."""
    return {key: reason for section in _algorithm_sections().values() if algo in section.algorithms
            for key, reason in section.ignores.items()}


def _check_used(algo: str, keys) -> None:
    """Refuse keys (set by the user, or off their defaults) that ``algo`` does not use, naming those that do."""
    sections = _algorithm_sections()
    for key in keys:
        section = sections.get(key.partition(".")[0])
        if section is not None and algo not in section.algorithms:
            raise UsageError(
                f"{key} is a setting of {' / '.join(section.algorithms)}, but algo={algo} does not use it; drop it, "
                f"or train with algo={section.algorithms[0]}."
            )
        reason = _ignored(algo).get(key)
        if reason is not None:
            users = key_users(key)
            raise UsageError(f"{key} is not used by {algo} ({reason}); it is used by {', '.join(users) or 'no algorithm'}.")


def key_users(key: str) -> tuple[str, ...]:
    """The algorithms that read ``key``: those of its section (every algorithm for a shared section) less those
    that ignore it; for ``schedule.<name>``, those whose section's loss declares ``<name>`` schedulable (``lr``:
    every algorithm; ``reference_reset``: those with a reference KL)."""
    section_name, _, name = key.partition(".")
    sections = _algorithm_sections()
    if section_name == "schedule" and name != "lr":
        name = "ref_kl_coef" if name == "reference_reset" else name  # the reset acts on the reference KL's term
        return tuple(algo for algo in ALGORITHMS
                     if any(name in s.schedulable() for s in sections.values() if algo in s.algorithms))
    candidates = sections[section_name].algorithms if section_name in sections else ALGORITHMS
    return tuple(algo for algo in candidates if key not in _ignored(algo))


# -- types and parsing -------------------------------------------------------------------------------------------


def _members(tp) -> tuple[list, bool]:
    """The non-None types of a field's annotation and whether None is allowed: ``float | None`` -> ([float], True)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        hints = typing.get_args(tp)
        return [h for h in hints if h is not type(None)], type(None) in hints
    return [tp], False


def _resolve(tp):
    """The first non-None type of an annotation and whether None is allowed (sections are never unions)."""
    members, optional = _members(tp)
    return members[0], optional


def _is_pair(tp) -> bool:
    return typing.get_origin(tp) is tuple and typing.get_args(tp) == (float, float)


def _expected(tp) -> str:
    members, optional = _members(tp)
    names = ["a (low, high) pair such as 0.01,0.02" if _is_pair(m) else getattr(m, "__name__", str(m)) for m in members]
    return " or ".join(names) + (" or None" if optional else "")


def _field_types(cls) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


# Keys renamed for one name per meaning (issue 13; DiffusionNFT's Amax, issue 28): an old key is refused with
# its new name.
RENAMED = {
    "vgrpo.kl_coef": "vgrpo.behaviour_kl_coef",
    "vgrpo.clip_low": "vgrpo.clip_range=LOW,HIGH",
    "vgrpo.clip_high": "vgrpo.clip_range=LOW,HIGH",
    "flow_grpo.clip_epsilon": "flow_grpo.clip_range",
    "flow_grpo.kl_coef": "flow_grpo.ref_kl_coef",
    "flow_grpo.adv_clip": "advantage.clip",
    "diffusion_nft.kl_coef": "diffusion_nft.ref_kl_coef",
    "diffusion_nft.adv_max": "diffusion_nft.advantage_max",
}


def _unknown(key: str, candidates: list[str], what: str = "key") -> UsageError:
    """An unknown key's error: its new name if it was renamed, else the closest valid name if one is close."""
    if key in RENAMED:
        return UsageError(f"Unknown config key {key!r}: renamed to {RENAMED[key]} (see the changelog's migration table).")
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else f"`vgrpo config` lists the valid {what}s."
    return UsageError(f"Unknown config {what} {key!r}; {hint}")


def _build(cls, data: dict, prefix: str):
    types_ = _field_types(cls)
    for name in sorted(set(data) - set(types_)):
        raise _unknown(prefix + name, [prefix + k for k in types_])
    kwargs = {}
    for name, value in data.items():
        base, _ = _resolve(types_[name])
        if dataclasses.is_dataclass(base):
            if not isinstance(value, dict):
                raise UsageError(f"Config section {prefix}{name} must be a mapping, got {type(value).__name__}.")
            kwargs[name] = _build(base, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _check_type(value, types_[name], prefix + name)
    return cls(**kwargs)


def _convert(value, tp):
    """``value`` as type ``tp`` (ints accepted for floats, two reals for a float pair), or a ValueError."""
    if _is_pair(tp):
        if isinstance(value, (list, tuple)) and len(value) == 2:
            return tuple(_convert(v, float) for v in value)
        raise ValueError
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp in (int, float) and isinstance(value, bool)):
        raise ValueError
    return value


def _check_type(value, tp, key: str):
    """The value of ``key`` read from a dict / JSON, type-checked against the annotation ``tp`` (ints are accepted
    for float fields, a two-element list for a (low, high) pair)."""
    members, optional = _members(tp)
    if value is None and optional:
        return value
    for member in members:
        try:
            return _convert(value, member)
        except ValueError:
            continue
    raise UsageError(f"Config key {key} must be {_expected(tp)}, got {type(value).__name__} {value!r}.")


def _parse_text(text: str, tp):
    """One command-line value as type ``tp`` (a ValueError when it does not parse)."""
    if tp is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError
        return text.lower() in ("true", "1")
    if _is_pair(tp):
        parts = text.strip().strip("()[]").split(",")
        if len(parts) != 2:
            raise ValueError
        return tuple(float(part) for part in parts)
    return tp(text)


def _parse_value(text: str, tp, key: str):
    members, optional = _members(tp)
    if optional and text.lower() in ("none", "null"):
        return None
    for member in members:
        try:
            return _parse_text(text, member)
        except (TypeError, ValueError):
            continue
    raise UsageError(f"Override {key}={text!r}: expected {_expected(tp)}.")


def apply_overrides(config: TrainConfig, overrides: list[str]) -> TrainConfig:
    """Return a new config with ``section.field=value`` overrides applied (types checked, unknown keys refused with
    the closest valid one, keys the final ``algo`` does not use refused even at their default value)."""
    data = asdict(config)
    keys = []
    for item in overrides:
        if "=" not in item:
            raise UsageError(f"Override {item!r} must look like key=value (e.g. optim.lr=3e-4).")
        key, text = item.split("=", 1)
        parts = key.split(".")
        cls, target = TrainConfig, data
        for depth, part in enumerate(parts[:-1]):
            sections = {name: tp for name, tp in _sections(cls).items() if dataclasses.is_dataclass(tp)}
            if part not in sections:
                raise _unknown(part, list(sections), "section") if depth == 0 else _unknown(key, valid_keys())
            cls, target = sections[part], target[part]
        types_ = _field_types(cls)
        if parts[-1] not in types_ or dataclasses.is_dataclass(_resolve(types_[parts[-1]])[0]):
            raise _unknown(key, valid_keys())
        target[parts[-1]] = _parse_value(text, types_[parts[-1]], key)
        keys.append(key)
    if data["algo"] in ALGORITHMS:  # an unknown algorithm is named by validate()
        _check_used(data["algo"], keys)
    return _build(TrainConfig, data, "")


def valid_keys(cls=TrainConfig, prefix: str = "") -> list[str]:
    """Every dotted key of ``cls`` (all algorithms' sections included)."""
    out = []
    for name, tp in _field_types(cls).items():
        base = _resolve(tp)[0]
        out += valid_keys(base, f"{prefix}{name}.") if dataclasses.is_dataclass(base) else [prefix + name]
    return out


# The algorithms, in the order of TrainConfig's AlgorithmSection fields: those their ``algorithms`` name.
ALGORITHMS = tuple(dict.fromkeys(
    algo for tp in _sections(TrainConfig).values() if isinstance(tp, type) and issubclass(tp, AlgorithmSection)
    for algo in tp.algorithms
))
# Every option key and its choices (read from the fields).
OPTIONS = {key: f.metadata["choices"] for key, _, f in _walk(TrainConfig()) if f.metadata.get("choices")}
