"""The protocol of the controlled comparison: the algorithms as it runs them (:data:`VARIANTS`), the tuning grid,
the seeds, and the targets that may select each algorithm's setting (:data:`SELECTIONS`). The package doc of
:mod:`vgrpo_lib.benchmarks.compare` states the whole protocol."""

from __future__ import annotations

from dataclasses import dataclass, field

from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.presets import OFFICIAL_ON_PIPELINE, PRESETS, build_config, named_configuration
from vgrpo_lib.errors import UsageError

__all__ = [
    "DEFAULT_STEP_CONTROLS", "FLOW_GRPO_CORE", "LEARNING_RATES", "MIN_SEEDS", "REFERENCE", "SELECTIONS", "SMOOTHING",
    "TARGET_FRACTION", "TASK_OVERRIDES", "TUNING_SEED", "VARIANTS", "Selection", "Variant", "build", "check_selection",
    "check_lr_decay", "check_variants", "chosen_config", "cosine_decay", "run_name", "setting_budget",
    "setting_config", "variant_preset",
]

TUNING_SEED = 100
MIN_SEEDS = 5
TARGET_FRACTION = 0.8
SMOOTHING = 3
LEARNING_RATES = (1e-4, 3e-4, 1e-3)
REFERENCE = "vgrpo"

# One step per rollout; two epochs (clipped where the algorithm clips its ratio); two minibatches per rollout.
DEFAULT_STEP_CONTROLS = {
    "one_step": ("optim.epochs=1", "optim.minibatches=1"),
    "two_epochs": ("optim.epochs=2", "optim.minibatches=1"),
    "two_minibatches": ("optim.epochs=1", "optim.minibatches=2"),
}


@dataclass(frozen=True)
class Variant:
    """An algorithm as the comparison runs it: ``algo`` at ``preset`` with ``overrides``, tuned over
    ``step_controls`` (name -> overrides) x the learning rates."""

    algo: str
    overrides: tuple[str, ...] = ()
    step_controls: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_STEP_CONTROLS))
    preset: str = "official"


# V-GRPO's controls without the soft clip: one step; two epochs under the paper's ratio clip (0.01).
_VGRPO_STEPS = {
    "one_step": ("optim.epochs=1", "optim.minibatches=1", "advantage.soft_clip=none"),
    "two_epochs": ("optim.epochs=2", "optim.minibatches=1", "advantage.soft_clip=none", "vgrpo.clip_range=0.01"),
}
# The paper's preference-stage control (one step, soft-clipped advantages) in place of a plain two-minibatch setting.
_VGRPO_CONTROLS = {**_VGRPO_STEPS,
                   "paper_soft_clip": ("optim.epochs=1", "optim.minibatches=1", "advantage.soft_clip=3.0")}
FLOW_GRPO_CORE = ("flow_grpo.ref_kl_coef=none", "flow_grpo.cfg_scale=1.0")


def _beyond_paper(name: str, step_controls: dict[str, tuple[str, ...]]) -> Variant:
    """A named configuration of ``BEYOND_PAPER`` as the comparison runs it: its algorithm and settings with V-GRPO's
    base-policy KL off (as the paper's V-GRPO here), tuned over ``step_controls``."""
    algo, settings = named_configuration(name)
    return Variant(algo, ("vgrpo.ref_kl_coef=none", *settings), dict(step_controls))


VARIANTS: dict[str, Variant] = {
    # Two epochs use the ratio clip (0.01) the paper uses over several steps.
    "vgrpo": Variant("vgrpo", ("vgrpo.ref_kl_coef=none",), dict(_VGRPO_CONTROLS)),
    # vgrpo+ (BEYOND_PAPER: K = 8, beyond the paper) over the same controls as V-GRPO's, plus a third epoch (where
    # the ratio clip starts to bind on MNIST-SD3 digit, results/iteration-budget/); its soft clip is tuned away too.
    "vgrpo+": _beyond_paper("vgrpo+", {
        **_VGRPO_STEPS,
        "three_epochs": ("optim.epochs=3", "optim.minibatches=1", "advantage.soft_clip=none", "vgrpo.clip_range=0.01"),
    }),
    # The lean candidates (BEYOND_PAPER: K = 2 or 4, a 6-step rollout) over V-GRPO's own controls, as their levers
    # were measured.
    "vgrpo+lean": _beyond_paper("vgrpo+lean", _VGRPO_CONTROLS),
    "vgrpo+lean-k4": _beyond_paper("vgrpo+lean-k4", _VGRPO_CONTROLS),
    "vgrpo+pods": _beyond_paper("vgrpo+pods", _VGRPO_CONTROLS),
    # Official: two minibatches per rollout (the default controls hold it), clip 1e-4.
    "flow_grpo": Variant("flow_grpo", FLOW_GRPO_CORE),
    # MixGRPO: Flow-GRPO with a sliding SDE window of 4 steps (its window replaces the timestep fraction).
    "mixgrpo": Variant("flow_grpo", (*FLOW_GRPO_CORE, "flow_grpo.timestep_fraction=1.0", "flow_grpo.window_size=4",
                                     "flow_grpo.window_shift_interval=10")),
    # Official: one gradient step per rollout (GenEval, PickScore), two minibatches for OCR.
    "diffusion_nft": Variant("diffusion_nft", ("diffusion_nft.ref_kl_coef=none",)),
    # The peers (docs/concepts/peers.md), each at its official settings with the base-policy KL off.
    # FPO: its paper's several steps per rollout are the PPO epochs (two_epochs, clip 0.05).
    "fpo": Variant("fpo"),
    # AWM: official one on-policy step; its KL to the soft-updated copy is its own step control and stays on.
    "awm": Variant("awm", ("awm.ref_kl_coef=none",)),
    "grpo_guard": Variant("grpo_guard", FLOW_GRPO_CORE),
    "flow_grpo_fast": Variant("flow_grpo_fast", FLOW_GRPO_CORE),
    # DGPO: a gradient step takes whole groups, so its third control is the official PickScore temperature (beta_dpo
    # 10) in place of two minibatches; CFG-free rollouts as the others'.
    "dgpo": Variant("dgpo", ("dgpo.ref_kl_coef=none", "dgpo.rollout_cfg_scale=1.0"), {
        "one_step": DEFAULT_STEP_CONTROLS["one_step"],
        "two_epochs": DEFAULT_STEP_CONTROLS["two_epochs"],
        "one_step_beta10": (*DEFAULT_STEP_CONTROLS["one_step"], "dgpo.beta=10"),
    }),
}
TASK_OVERRIDES = {"pair": ["eval.per_prompt=4"]}


def variant_preset(variant: str, pipeline: str | None) -> str:
    """The preset ``variant`` runs at: its own (``official``), or that preset on a pipeline (``official-mnist-sd3``)."""
    preset = VARIANTS[variant].preset if pipeline is None else f"{VARIANTS[variant].preset}-{pipeline}"
    if preset not in PRESETS:
        raise UsageError(f"No preset {preset!r} for the comparison on {pipeline!r}; pipelines: "
                         f"{', '.join(OFFICIAL_ON_PIPELINE.values())}.")
    return preset


def build(variant: str, task: str, seed: int, lr: float, control: str, overrides: list[str], pipeline: str | None = None) -> TrainConfig:
    """The config of one run: ``variant``'s preset (on ``pipeline`` if given), its overrides and step ``control``,
    the task's comparison overrides, ``seed``, learning rate ``lr``, then ``overrides`` (the budget and the user's)."""
    v = VARIANTS[variant]
    extra = [*v.overrides, *v.step_controls[control], *TASK_OVERRIDES.get(task, []), f"seed={seed}", f"optim.lr={lr}",
             *overrides]
    return build_config(v.algo, task, variant_preset(variant, pipeline), extra)


def setting_budget(protocol: dict, variant: str, control: str) -> list[str]:
    """The budget overrides of ``variant``'s setting ``control`` in a comparison's ``protocol`` (its
    ``protocol.json``): the budget every setting shares (``iterations=N``, the evaluation period) and, in a
    comparison with an NFE budget (``nfe_budget``), the iterations that spend it at this setting's cost
    (``setting_iterations``)."""
    per_setting = protocol.get("setting_iterations", {}).get(variant, {})
    return [*protocol["budget"], *([f"iterations={per_setting[control]}"] if control in per_setting else [])]


def cosine_decay(lr: float, fraction: float, steps: int) -> str:
    """The override that decays the learning rate by a cosine from ``lr`` to ``fraction * lr`` over ``steps``
    iterations (``schedule.lr``, :mod:`vgrpo_lib.algorithms.step_control`)."""
    return f"schedule.lr=cosine:end={lr * fraction:.6g},steps={steps}"


def check_lr_decay(lr_decay: float | None, overrides) -> None:
    """``lr_decay`` (``vgrpo compare --lr-decay``) is a fraction in [0, 1) and the only learning-rate schedule:
    anything else is refused naming the argument."""
    if lr_decay is None:
        return
    if not 0 <= lr_decay < 1:
        raise UsageError(f"--lr-decay is the fraction of each setting's learning rate it decays to, in [0, 1); "
                         f"got {lr_decay}.")
    if any(override.startswith("schedule.lr=") for override in overrides):
        raise UsageError("--lr-decay sets every setting's schedule.lr: give it without a schedule.lr= override.")


def setting_config(protocol: dict, variant: str, control: str, seed: int, lr: float, overrides=()) -> TrainConfig:
    """The config of ``variant``'s setting ``control`` at learning rate ``lr`` on ``seed`` in a comparison's
    ``protocol`` (its ``protocol.json``, or the part of it fixed before the tuning): the setting's budget
    (:func:`setting_budget`), the comparison's overrides, then ``overrides``. Where the protocol decays the rate
    (``lr_decay``), it falls by a cosine to ``lr_decay * lr`` over the run's iterations, those of the config with
    ``overrides`` (so a lever that lengthens the run lengthens the decay); a schedule in ``overrides`` replaces it."""
    def config(decay: list[str]) -> TrainConfig:
        return build(variant, protocol["task"], seed, lr, control,
                     [*setting_budget(protocol, variant, control), *protocol["overrides"], *decay, *overrides],
                     protocol["pipeline"])

    if protocol.get("lr_decay") is None:  # protocols before --lr-decay have no key
        return config([])
    return config([cosine_decay(lr, protocol["lr_decay"], config([]).iterations)])


def chosen_config(protocol: dict, variant: str, seed: int, overrides=()) -> TrainConfig:
    """The config of ``variant``'s reported run on ``seed`` in a comparison's ``protocol``: the setting it chose
    (:func:`setting_config`), then ``overrides``."""
    chosen = protocol["chosen"][variant]
    return setting_config(protocol, variant, chosen["step_control"], seed, chosen["lr"], overrides)


def run_name(variant: str, control: str, lr: float, seed: int) -> str:
    """The folder under ``DIR/runs`` of one run of the comparison."""
    return f"{variant}_{control}_lr{lr:g}_seed{seed}"


@dataclass(frozen=True)
class Selection:
    """A target that can choose each algorithm's setting: the summary columns of its time to target and of the
    final reward that breaks ties among settings that never reach it, and its name in the summary. With
    ``kept_key`` (a summary column, true where the run ends at or above the target) a run that reached the target
    and fell back below it by its end counts as a miss: the setting must keep what it reached."""

    time_key: str
    reward_key: str
    label: str
    kept_key: str | None = None


SELECTIONS = {"training": Selection("time_to_target_s", "final_reward", "training-reward"),
              "heldout": Selection("heldout_time_to_target_s", "final_eval_reward", "held-out"),
              # The held-out target reached and still met by the final evaluation: the held-out selection picked
              # settings that cross the target first and fall back (results/compare-mnist-sd3-digit-nfe/).
              "heldout-kept": Selection("heldout_time_to_target_s", "final_eval_reward",
                                        "held-out (reached and still met at the end)", "heldout_target_kept")}


def check_selection(by: str) -> None:
    if by not in SELECTIONS:
        raise UsageError(f"select/by={by!r}: expected one of {sorted(SELECTIONS)} (the target that selects)")


def check_variants(variants) -> None:
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UsageError(f"Unknown variant(s) {', '.join(map(repr, unknown))}; expected some of {', '.join(VARIANTS)}.")
    sizes = {v: len(VARIANTS[v].step_controls) for v in variants}
    if len(set(sizes.values())) > 1:
        raise UsageError(f"Every variant needs the same tuning budget (number of step controls), got {sizes}.")
