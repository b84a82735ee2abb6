"""Typed run configuration: nested dataclasses, JSON round trip, ``key=value`` overrides and presets.

A run is fully described by one :class:`TrainConfig`; it is saved as ``config.json`` in the run directory.
Overrides use dotted paths and are type-checked against the dataclass fields::

    vgrpo train --algo vgrpo iterations=40 vgrpo.num_pairs=8 optim.lr=3e-4 advantage.soft_clip=none
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields

from integrations.distributed import STRATEGIES
from vgrpo_lib.advantages import SCALES
from vgrpo_lib.elbo import NOISE_SCHEMES, SHARING_SCOPES
from vgrpo_lib.samplers import ODE_SOLVERS
from vgrpo_lib.losses import FLOW_GRPO_KL_FORMS
from vgrpo_lib.objectives import NFT_ADVANTAGE_MODES
from vgrpo_lib.sde import LOG_PROB_REDUCTIONS, SDE_TYPES
from vgrpo_lib.timesteps import TIMESTEP_SAMPLERS
from vgrpo_lib.weighting import WEIGHTINGS


@dataclass
class RolloutConfig:
    """How samples are generated during training (the algorithm may override the sampler: Flow-GRPO's SDE)."""

    num_steps: int = 10
    solver: str = "euler"  # euler | heun | dpmpp_2m (deterministic ODE; V-GRPO and DiffusionNFT)
    # SD3 time shift of the grid; None: the task's own grid (testbed: uniform; a diffusers task: its pipeline
    # scheduler's sigmas at the training resolution, FLUX's resolution-dependent shift included)
    shift: float | None = None


@dataclass
class OptimConfig:
    lr: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: int = 1  # passes over the rollout per iteration
    minibatch_size: int | None = None  # rows per gradient step (None: the whole rollout in one gradient step per epoch)
    # or: this many gradient steps per epoch, each on an equal share of the rows (the official Flow-GRPO batching:
    # 2; the row count may vary, e.g. with flow_grpo.filter_zero_advantage); exclusive with minibatch_size
    minibatches: int | None = None
    micro_batch_size: int | None = None  # rows per forward/backward inside a minibatch (gradient accumulation)
    max_nonfinite_steps: int = 5  # abort after this many consecutive skipped (non-finite) steps
    # EMA of the trained weights, evaluated in their place (official Flow-GRPO and DiffusionNFT: 0.9, with the
    # warm-up min((1 + s) / (10 + s), ema_decay)); None: off
    ema_decay: float | None = None
    ema_every: int = 1  # gradient steps between EMA updates (official Flow-GRPO 8, DiffusionNFT 1)


ClipRange = float | tuple[float, float]  # eps, or a (low, high) pair: "0.01" or "0.01,0.02" on the command line


@dataclass
class AdvantageConfig:
    scale: str = "group"  # group | batch | none | rank | trimmed
    soft_clip: float | None = None  # eta of eta * tanh(A / eta)
    # hard clip [-clip, clip] before the soft clip (Flow-GRPO: 5); DiffusionNFT's Amax (it needs one; official 5)
    clip: float | None = None
    eps: float = 1e-6  # added to the scale (official Flow-GRPO / DiffusionNFT: 1e-4)


@dataclass
class VGRPOConfig:
    num_pairs: int = 4
    timesteps: str = "stratified"
    sharing: str = "group"  # none | group | batch
    weighting: str = "adaptive_x"  # eps | v | x | adaptive_x | elbo
    # independent | antithetic (ours, beyond the paper: K/2 couples (eps, -eps) at a shared t; needs even num_pairs)
    noise: str = "independent"
    clip_range: ClipRange = 0.01
    behaviour_kl_coef: float | None = None  # x-space KL to the behaviour policy (paper: 0.3 where used)
    ref_kl_coef: float | None = None  # x-space KL to the base policy
    chunk_size: int | None = None


@dataclass
class FlowGRPOConfig:
    """Flow-GRPO's settings; also those of GRPO-Guard and Flow-GRPO-Fast (the same SDE rollout and clipped loss)."""

    noise_level: float = 0.7  # flow_sde: a of sigma_t = a sqrt(t / (1 - t)); cps: eta in (0, 1]
    sde_type: str = "flow_sde"  # flow_sde | cps (coefficients-preserving sampling; its step to t = 0 is an ODE step)
    clip_range: ClipRange = 1e-4
    log_prob_reduction: str = "mean"
    ref_kl_coef: float | None = None  # closed-form Gaussian KL to the base policy (official: 0.04, 0.01 with kl_form=flow_grpo)
    kl_form: str = "exact"  # exact | flow_grpo (the official: |dt| times the exact KL; see FlowGRPOLoss)
    timestep_fraction: float = 1.0  # train the first int(num_steps * fraction) SDE steps (official: 0.99 -> 9 of 10)
    filter_zero_advantage: bool = False  # official: samples with advantage exactly 0 are not trained
    cfg_scale: float = 1.0  # classifier-free guidance in rollout and loss, uncond branch detached (official: 4.5)
    window_size: int | None = None  # MixGRPO: SDE only inside a sliding window of this many steps
    window_shift_interval: int = 25


@dataclass
class DiffusionNFTConfig:
    strength: float = 1.0  # b, the implicit-policy mixing strength
    adv_mode: str = "all"  # all | positive_only | negative_only | one_only | binary (official variants)
    # train int(num_steps * fraction) distinct rollout timesteps per sample, fresh each step (official 0.99: 9 of 10)
    timestep_fraction: float = 1.0
    weighting: str = "adaptive_x"
    # old policy: d = 0 for the first decay_flat gradient steps, then min(decay_rate * (steps - decay_flat),
    # decay_max), steps = gradient steps so far (official type 1: 0.001, 0.5, 0; type 2: 0.0075, 0.999, 75)
    decay_rate: float = 0.001
    decay_max: float = 0.5
    decay_flat: int = 0
    ref_kl_coef: float | None = None  # velocity MSE to the base policy (official: 1e-4)


@dataclass
class FlowGRPOFastConfig:
    """Flow-GRPO-Fast: SDE and training on a window of consecutive steps of an ODE rollout (SDE settings: flow_grpo.*)."""

    branch_steps: int = 2  # steps in the window (official sde_window_size: 2-3)
    branch_range: float = 0.5  # the window lies in the first int(branch_range * num_steps) steps (official: half)


@dataclass
class FPOConfig:
    """FPO: the clipped ratio of conditional flow-matching losses on independent pairs (official playground values)."""

    num_pairs: int = 8  # n_samples_per_action
    timesteps: str = "grid"  # grid: i.i.d. from the rollout grid (discretize_t_for_training) | a timestep sampler name
    weighting: str = "v"  # the CFM loss ||v - (eps - x)||^2 (the paper's; the playground default supervises eps)
    clip_range: float = 0.05


@dataclass
class AWMConfig:
    """AWM: advantage-weighted flow matching (official SD3.5-M GenEval/OCR configs)."""

    num_pairs: int = 6  # train_timesteps
    timestep_fraction: float = 0.9  # pairs' timesteps from the rollout grid's steps 1 .. int(fraction * T) - 1
    weighting: str = "ghuber"
    advantage_scale: float = 0.2  # advantage_max / adv_clip_max = 1 / 5
    behaviour_kl_coef: float | None = 1.0  # velocity MSE to the soft-updated copy (ema_beta)
    ref_kl_coef: float | None = None  # velocity MSE to the base policy (beta: 0.001 GenEval, 0.003 OCR)
    decay_rate: float = 0.001  # copy's decay d = min(decay_rate * gradient steps so far, decay_max)
    decay_max: float = 0.3


@dataclass
class ModelConfig:
    """The diffusers tasks (``task=sd3.5-medium`` / ``flux.1-dev`` / ``mnist-sd3/<task>``); testbed tasks ignore
    this section. ``None`` means the task's own value (the mnist-sd3 tasks bring prompts, reward and image size)."""

    path: str | None = None  # local diffusers pipeline directory or hub id (None: the task's, from the HF cache)
    prompts: str | None = None  # training prompt file, one prompt per line (required by sd3.5-medium / flux.1-dev)
    eval_prompts: str | None = None  # evaluation prompt file (None: the task's, else the first 8 training prompts)
    reward: str | None = None  # a reward name or a weighted sum "pickscore:1,ocr:0.5" (None: the task's; pickscore)
    image_size: str | None = None  # "512" or "HxW" in pixels (None: the task's: 512 SD3.5-M, 720 FLUX.1-dev)
    lora_rank: int = 32
    lora_alpha: int = 64
    device: str | None = None  # None: this process's GPU (cuda:LOCAL_RANK), the CPU without CUDA
    dtype: str = "bfloat16"  # storage dtype of the pretrained weights
    max_sequence_length: int | None = None  # T5 tokens per prompt (None: 256 SD3 / 512 FLUX; 0 without T5)
    gradient_checkpointing: bool | None = None  # None: on with CUDA
    batch_size: int = 8  # samples per evaluation forward, VAE decode and text-encoder call
    without_t5: bool = False  # SD3: load without T5 (text_encoder_3=None); its tokens are max_sequence_length zeros


@dataclass
class DistributedConfig:
    """Multi-process training under torchrun (see :mod:`integrations.distributed`)."""

    strategy: str = "ddp"  # ddp | fsdp2 (parameters, gradients and optimizer state sharded over processes)


@dataclass
class EvalConfig:
    every: int = 10  # iterations between evaluations (0: only at the start and the end)
    per_prompt: int = 20
    num_steps: int = 40
    seed: int = 12345  # held-out seeds: independent of the training seed


@dataclass
class TrainConfig:
    algo: str = "vgrpo"  # vgrpo | flow_grpo | diffusion_nft | fpo | awm | grpo_guard | flow_grpo_fast
    task: str = "digit"
    seed: int = 0
    iterations: int = 60
    prompts_per_iteration: int = 8
    group_size: int = 16
    checkpoint_every: int = 10
    reward_retries: int = 2  # a reward function that raises is retried this many times, then the run fails
    # float32 | bfloat16: model forwards of rollouts, old surrogates and losses under bf16 autocast (parameters,
    # optimizer and the losses' arithmetic on the fp32 samples stay float32); evaluation always in float32
    precision: str = "float32"
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    vgrpo: VGRPOConfig = field(default_factory=VGRPOConfig)
    flow_grpo: FlowGRPOConfig = field(default_factory=FlowGRPOConfig)
    diffusion_nft: DiffusionNFTConfig = field(default_factory=DiffusionNFTConfig)
    fpo: FPOConfig = field(default_factory=FPOConfig)
    awm: AWMConfig = field(default_factory=AWMConfig)
    flow_grpo_fast: FlowGRPOFastConfig = field(default_factory=FlowGRPOFastConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def __post_init__(self):
        validate(self)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        return _build(cls, data, "")


ALGORITHMS = ("vgrpo", "flow_grpo", "diffusion_nft", "fpo", "awm", "grpo_guard", "flow_grpo_fast")
PRECISIONS = ("float32", "bfloat16")


def validate(config: TrainConfig) -> None:
    """Range checks that name the offending field."""
    if config.algo not in ALGORITHMS:
        raise ValueError(f"Unknown algorithm {config.algo!r}; expected one of {', '.join(ALGORITHMS)}.")
    positive = {
        "iterations": config.iterations,
        "prompts_per_iteration": config.prompts_per_iteration,
        "checkpoint_every": config.checkpoint_every,
        "rollout.num_steps": config.rollout.num_steps,
        "optim.epochs": config.optim.epochs,
        "optim.max_nonfinite_steps": config.optim.max_nonfinite_steps,
        "vgrpo.num_pairs": config.vgrpo.num_pairs,
        "eval.per_prompt": config.eval.per_prompt,
        "eval.num_steps": config.eval.num_steps,
    }
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    if config.reward_retries < 0:
        raise ValueError(f"reward_retries must be >= 0, got {config.reward_retries}.")
    if config.group_size < 2:
        raise ValueError(f"group_size must be >= 2 (a group-relative advantage needs two samples), got {config.group_size}.")
    if config.optim.lr <= 0:
        raise ValueError(f"optim.lr must be > 0, got {config.optim.lr}.")
    if config.optim.minibatch_size is not None and config.optim.minibatch_size < 1:
        raise ValueError(f"optim.minibatch_size must be >= 1 or None, got {config.optim.minibatch_size}.")
    if config.optim.micro_batch_size is not None and config.optim.micro_batch_size < 1:
        raise ValueError(f"optim.micro_batch_size must be >= 1 or None, got {config.optim.micro_batch_size}.")
    if config.eval.every < 0:
        raise ValueError(f"eval.every must be >= 0, got {config.eval.every}.")
    window = config.flow_grpo.window_size
    if window is not None and not 1 <= window <= config.rollout.num_steps:
        raise ValueError(f"flow_grpo.window_size must be in 1..rollout.num_steps={config.rollout.num_steps}, got {window}.")
    for key in ("flow_grpo.timestep_fraction", "diffusion_nft.timestep_fraction"):
        fraction = _get(config, key)
        if not (0 < fraction <= 1 and int(config.rollout.num_steps * fraction) >= 1):
            raise ValueError(
                f"{key} must be in (0, 1] and leave at least one of rollout.num_steps={config.rollout.num_steps} "
                f"steps to train, got {fraction}."
            )
    if window is not None and config.flow_grpo.timestep_fraction != 1.0:
        raise ValueError("flow_grpo.timestep_fraction and flow_grpo.window_size both choose the trained steps: set one.")
    if config.optim.minibatches is not None and config.optim.minibatch_size is not None:
        raise ValueError("optim.minibatches and optim.minibatch_size both set the gradient steps per epoch: set one.")
    if config.optim.ema_decay is not None and config.distributed.strategy == "fsdp2":
        raise ValueError("optim.ema_decay is not supported with distributed.strategy=fsdp2 (the average is not sharded).")
    _validate_options_and_ranges(config)


# Option strings, checked here so that a typo fails when the config is built, naming the config key.
OPTIONS = {
    "rollout.solver": tuple(ODE_SOLVERS),
    "advantage.scale": SCALES,
    "vgrpo.timesteps": tuple(TIMESTEP_SAMPLERS),
    "vgrpo.sharing": SHARING_SCOPES,
    "vgrpo.weighting": tuple(WEIGHTINGS),
    "vgrpo.noise": NOISE_SCHEMES,
    "flow_grpo.log_prob_reduction": LOG_PROB_REDUCTIONS,
    "flow_grpo.kl_form": FLOW_GRPO_KL_FORMS,
    "diffusion_nft.adv_mode": NFT_ADVANTAGE_MODES,
    "flow_grpo.sde_type": tuple(SDE_TYPES),
    "fpo.timesteps": ("grid", *TIMESTEP_SAMPLERS),
    "fpo.weighting": tuple(WEIGHTINGS),
    "awm.weighting": tuple(WEIGHTINGS),
    "diffusion_nft.weighting": tuple(WEIGHTINGS),
    "distributed.strategy": STRATEGIES,
    "precision": PRECISIONS,
    "model.dtype": ("bfloat16", "float16", "float32"),
}


def _get(config, key: str):
    value = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _validate_options_and_ranges(config: TrainConfig) -> None:
    for key, options in OPTIONS.items():
        value = _get(config, key)
        if value not in options:
            raise ValueError(f"Unknown {key} {value!r}; expected one of {', '.join(map(repr, options))}.")
    # Every float field must be finite (NaN passes a plain `value <= 0` check and ends as a NaN loss or rate).
    for key in valid_keys():
        value = _get(config, key)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key} must be finite, got {value}.")

    def need(key: str, ok, rule: str) -> None:
        value = _get(config, key)
        if value is not None and not ok(value):
            raise ValueError(f"{key} must be {rule}, got {value!r}.")

    positive = lambda v: v > 0  # noqa: E731
    non_negative = lambda v: v >= 0  # noqa: E731
    for key in ("optim.max_grad_norm", "rollout.shift", "advantage.soft_clip", "advantage.clip", "flow_grpo.noise_level",
                "flow_grpo.cfg_scale", "diffusion_nft.strength", "awm.advantage_scale"):
        need(key, positive, "> 0")
    for key in ("optim.weight_decay", "advantage.eps", "diffusion_nft.decay_flat", "vgrpo.behaviour_kl_coef",
                "vgrpo.ref_kl_coef", "flow_grpo.ref_kl_coef", "diffusion_nft.decay_rate", "diffusion_nft.ref_kl_coef",
                "awm.behaviour_kl_coef", "awm.ref_kl_coef", "awm.decay_rate"):
        need(key, non_negative, ">= 0")
    for key in ("vgrpo.chunk_size", "flow_grpo.window_shift_interval", "optim.minibatches", "optim.ema_every",
                "fpo.num_pairs", "awm.num_pairs", "flow_grpo_fast.branch_steps", "model.lora_rank",
                "model.lora_alpha", "model.batch_size"):
        need(key, lambda v: v >= 1, ">= 1")
    need("model.max_sequence_length", non_negative, ">= 0")  # 0: no T5 tokens (a pipeline without T5)
    for key in ("vgrpo.clip_range", "flow_grpo.clip_range"):
        need(key, _valid_clip_range, "eps or a (low, high) pair with 0 <= low < 1 and high >= 0, finite")
    if config.algo == "diffusion_nft" and config.advantage.clip is None:
        raise ValueError(
            "diffusion_nft needs advantage.clip: its Amax, the bound its advantages are clamped to before they are "
            "normalised into r = A / (2 Amax) + 1/2 (official: 5; the testbed preset sets it)."
        )
    need("diffusion_nft.decay_max", lambda v: 0 <= v <= 1, "in [0, 1]")
    need("optim.ema_decay", lambda v: 0 <= v <= 1, "in [0, 1]")
    need("awm.decay_max", lambda v: 0 <= v <= 1, "in [0, 1]")
    need("fpo.clip_range", lambda v: 0 <= v < 1, "in [0, 1)")
    for key in ("awm.timestep_fraction", "flow_grpo_fast.branch_range"):
        need(key, lambda v: 0 < v <= 1, "in (0, 1]")
    _validate_peers(config)
    if config.vgrpo.noise == "antithetic" and config.vgrpo.num_pairs % 2:
        raise ValueError(f"vgrpo.num_pairs must be even with vgrpo.noise=antithetic, got {config.vgrpo.num_pairs}.")
    need("model.image_size", lambda v: parse_image_size(v) is not None, "'H' or 'HxW' with positive multiples of 16")


def _valid_clip_range(value) -> bool:
    low, high = value if isinstance(value, tuple) else (value, value)
    return 0 <= low < 1 and 0 <= high < math.inf


def _validate_peers(config: TrainConfig) -> None:
    """Settings of the peer algorithms that depend on each other or on the rollout."""
    steps, flow = config.rollout.num_steps, config.flow_grpo
    if flow.sde_type == "cps" and flow.noise_level > 1:
        raise ValueError(f"flow_grpo.noise_level must be in (0, 1] with flow_grpo.sde_type=cps, got {flow.noise_level}.")
    if flow.sde_type == "cps" and flow.window_size is not None:
        raise ValueError("flow_grpo.window_size (MixGRPO) slides onto the last step, which has no noise with flow_grpo.sde_type=cps.")
    if config.algo == "awm" and int(config.awm.timestep_fraction * steps) < 2:
        raise ValueError(
            f"awm.timestep_fraction * rollout.num_steps must be >= 2 (the pairs' timesteps are the grid's steps "
            f"1 .. int(fraction * num_steps) - 1), got {config.awm.timestep_fraction} * {steps}."
        )
    if config.algo == "flow_grpo_fast":
        fast = config.flow_grpo_fast
        span = int(fast.branch_range * steps)
        if flow.window_size is not None or flow.timestep_fraction != 1.0:
            raise ValueError(
                "flow_grpo.window_size (MixGRPO's window) and flow_grpo.timestep_fraction do not apply to flow_grpo_fast "
                "(its branching window chooses the trained steps); unset them."
            )
        if fast.branch_steps > span:
            raise ValueError(
                f"flow_grpo_fast.branch_steps must be <= int(branch_range * rollout.num_steps) = {span}, got {fast.branch_steps}."
            )
        if flow.sde_type == "cps" and span >= steps:
            raise ValueError("flow_grpo_fast.branch_range must leave out the last step with flow_grpo.sde_type=cps (it has no noise).")


def parse_image_size(text: str) -> int | tuple[int, int] | None:
    """``"512"`` -> 512, ``"720x1280"`` -> (720, 1280); None unless every side is a positive multiple of 16."""
    parts = text.lower().split("x")
    if len(parts) > 2 or not all(part.strip().isdigit() for part in parts):
        return None
    sides = [int(part) for part in parts]
    if not all(side > 0 and side % 16 == 0 for side in sides):
        return None
    return sides[0] if len(sides) == 1 else (sides[0], sides[1])


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


def _describe(tp) -> str:
    if typing.get_origin(tp) is tuple:
        return "a (low, high) pair such as 0.01,0.02"
    return getattr(tp, "__name__", str(tp))


def _is_pair(tp) -> bool:
    return typing.get_origin(tp) is tuple and typing.get_args(tp) == (float, float)


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


def _field_types(cls) -> dict[str, typing.Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def _build(cls, data: dict, prefix: str):
    types_ = _field_types(cls)
    unknown = set(data) - set(types_)
    if unknown:
        raise ValueError(f"Unknown config key(s) {', '.join(prefix + k for k in sorted(unknown))}.")
    kwargs = {}
    for name, value in data.items():
        base, _ = _resolve(types_[name])
        if dataclasses.is_dataclass(base):
            if not isinstance(value, dict):
                raise ValueError(f"Config section {prefix}{name} must be a mapping, got {type(value).__name__}.")
            kwargs[name] = _build(base, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _check_type(value, types_[name], prefix + name)
    return cls(**kwargs)


def _expected(tp) -> str:
    members, optional = _members(tp)
    return " or ".join(_describe(m) for m in members) + (" or None" if optional else "")


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
    raise ValueError(f"Config key {key} must be {_expected(tp)}, got {type(value).__name__} {value!r}.")


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
    raise ValueError(f"Override {key}={text!r}: expected {_expected(tp)}.")


def apply_overrides(config: TrainConfig, overrides: list[str]) -> TrainConfig:
    """Return a new config with ``section.field=value`` overrides applied (types checked, unknown keys refused)."""
    data = config.to_dict()
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"Override {item!r} must look like key=value (e.g. optim.lr=3e-4).")
        key, text = item.split("=", 1)
        parts = key.split(".")
        cls, target = TrainConfig, data
        for part in parts[:-1]:
            types_ = _field_types(cls)
            base = _resolve(types_[part])[0] if part in types_ else None
            if base is None or not dataclasses.is_dataclass(base):
                raise ValueError(f"Unknown config section {part!r} in override {key!r}.")
            cls, target = base, target[part]
        types_ = _field_types(cls)
        if parts[-1] not in types_ or dataclasses.is_dataclass(_resolve(types_[parts[-1]])[0]):
            raise ValueError(f"Unknown config key {key!r}; valid keys: {', '.join(sorted(valid_keys()))}.")
        target[parts[-1]] = _parse_value(text, types_[parts[-1]], key)
    return TrainConfig.from_dict(data)


def valid_keys(cls=TrainConfig, prefix: str = "") -> list[str]:
    out = []
    for name, tp in _field_types(cls).items():
        base = _resolve(tp)[0]
        out += valid_keys(base, f"{prefix}{name}.") if dataclasses.is_dataclass(base) else [prefix + name]
    return out
