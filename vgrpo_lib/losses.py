"""TorchRL loss modules for the algorithms, thin wrappers over :mod:`vgrpo_lib.objectives`.

Conventions (TorchRL's): each loss reads a TensorDict whose entry names are remappable with ``set_keys``,
returns a TensorDict whose ``loss_*`` entries a trainer sums, and detached diagnostics beside them.
Coefficients and the clip range are buffers (``loss.ref_kl_coef = 0.1``, ``loss.clip_range = 0.02`` or
``(0.01, 0.02)`` update in place, so schedules can drive them). Each loss declares them once, in
``_schedulable_rules``: the buffer's name and its :class:`~vgrpo_lib.rules.Rule`, the same rule that checks the
constructor argument, every assignment, the config key and every value of a schedule of it.

One name per meaning across the losses: ``behaviour_kl_coef`` weighs a KL to the behaviour (old) policy
(outputs ``loss_behaviour_kl``, ``behaviour_kl``), ``ref_kl_coef`` a KL to a frozen reference (base) policy
(``loss_ref_kl``, ``ref_kl``); ``clip_range`` is ``eps`` or ``(low, high)``; ``advantage_clip`` bounds the
advantages (Flow-GRPO's hard clip), ``advantage_max`` is DiffusionNFT's Amax (its normalisation). A KL term
exists only if its coefficient was given (``None`` = off); it is then always computed, so
that a schedule may start it at 0 and no Python branch on a tensor value forces a device sync.

Devices: a batch must sit on the model's device (a clear error names the entry otherwise), unless the model
declares ``moves_inputs = True``: it moves its inputs to its own device and returns its output on theirs (the
diffusers ``LoRAPolicy`` does, so a trainer's CPU batches drive a GPU transformer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives import LossModule

from vgrpo_lib._checks import check_key, check_model_dtype, check_positive, choose, renamed_keywords
from vgrpo_lib.elbo import ELBOSurrogate, VelocityModel
from vgrpo_lib.objectives import (
    NFT_ADVANTAGE_MODES,
    clip_active_mask,
    clip_fraction,
    clip_fraction_active,
    clipped_ratio_objective,
    dgpo_group_weight,
    gaussian_kl_same_std,
    guard_log_ratio,
    nft_implicit_velocities,
    nft_optimality,
    ratio_diagnostics,
    x_space_kl,
)
from vgrpo_lib.rules import CLIP_RANGE, NON_NEGATIVE, POSITIVE, Rule
from vgrpo_lib.sde import LOG_PROB_REDUCTIONS, check_noise_level, gaussian_log_prob, step_mean_std
from vgrpo_lib.weighting import mean_over_data

__all__ = ["AWMLoss", "DGPOLoss", "DiffusionNFTLoss", "FLOW_GRPO_KL_FORMS", "FlowGRPOLoss", "GRPOGuardLoss", "VGRPOLoss", "total_loss"]

FLOW_GRPO_KL_FORMS = ("exact", "flow_grpo")


@dataclass
class _SampleKeys:
    """The batch entries of the losses on whole samples, each remappable with ``set_keys``: ``sample`` the generated
    samples ``[B, *D]``, ``cond`` the prompt conditioning, ``advantage`` ``[B]``, ``pairs`` the timestep-noise pairs
    ``[B, K]``."""

    sample: str = "sample"
    cond: str = "cond"
    advantage: str = "advantage"
    pairs: str = "pairs"


class _PolicyLoss(LossModule):
    """Shared plumbing: key access with clear errors, the schedulable scalar buffers, the in/out keys (from
    ``_batch_keys`` and the KL terms that are on), the KL terms' model-and-coefficient pairing and outputs, no value
    estimator.

    ``_schedulable_rules`` is the one declaration of the scalars a schedule may assign: each buffer's name and its
    :class:`~vgrpo_lib.rules.Rule`. The constructor registers them with :meth:`_register_scalar` (checked by the
    rule; ``None`` = the term is off), ``loss.<name> = value`` is checked by the same rule and copied into the
    buffer in place (a refused value leaves it unchanged), and TorchRL's ``_schedulable_buffers`` is derived from
    it. A scheduled value is checked over its whole schedule before a run starts
    (:func:`vgrpo_lib.algorithms.step_control.parse_schedule`), with the rule declared here.
    """

    _schedulable_rules: ClassVar[Mapping[str, Rule]] = {}
    # The batch entries every forward reads (by their ``_AcceptedKeys`` names; ``cond`` is added unless the model is
    # unconditional); a loss whose entries depend on its options extends :meth:`_in_key_names`.
    _batch_keys: ClassVar[tuple[str, ...]] = ()
    # Each KL term a loss may have, in output order: ``loss_<name>`` exists when the coefficient ``<name>_coef`` does.
    _kl_terms: ClassVar[tuple[str, ...]] = ("behaviour_kl", "ref_kl")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._schedulable_buffers = frozenset(cls._schedulable_rules)

    def __setattr__(self, name: str, value) -> None:
        buffer = self.__dict__.get("_buffers", {}).get(name)
        if name in self._schedulable_rules and buffer is not None and not isinstance(value, torch.Tensor):
            buffer.copy_(torch.tensor(self._schedulable_rules[name].check(name, value), dtype=buffer.dtype))
            return
        super().__setattr__(name, value)

    def _register_scalar(self, name: str, value: float | tuple[float, float] | None) -> None:
        """Register the schedulable buffer ``name`` (declared in ``_schedulable_rules``) holding ``value``, checked
        by its rule: ``[]`` for a coefficient, ``[2]`` (low, high) for ``clip_range``; ``None``: the term is off."""
        if value is not None:
            self._schedulable_rules[name].check(name, value)
            value = [float(v) for v in value] if isinstance(value, (tuple, list)) else float(value)
            if name == "clip_range" and isinstance(value, float):
                value = [value, value]
        self.register_buffer(name, None if value is None else torch.tensor(value))

    def _register_kl(self, name: str, model_arg: str, model, coef: float | None) -> None:
        """The KL term ``name`` (``behaviour_kl`` or ``ref_kl``) to the frozen policy given as ``model_arg``: the
        model and the coefficient ``<name>_coef`` come both or neither (``None``: the term is off)."""
        if (model is None) != (coef is None):
            raise ValueError(f"A KL to a frozen policy needs both {model_arg} and {name}_coef (or neither).")
        self._register_scalar(f"{name}_coef", coef)

    def _in_key_names(self) -> list[str]:
        return [*self._batch_keys, *([] if self.unconditional else ["cond"])]

    @property
    def in_keys(self):
        return [getattr(self.tensor_keys, k) for k in self._in_key_names()]

    @property
    def out_keys(self):
        """``loss_objective`` and ``loss_<name>`` of each KL term that is on."""
        on = [name for name in self._kl_terms if getattr(self, f"{name}_coef", None) is not None]
        return ["loss_objective"] + [f"loss_{name}" for name in on]

    def _kl_term(self, name: str, distance: torch.Tensor) -> dict[str, torch.Tensor]:
        """The KL term ``name``'s outputs: ``loss_<name>``, its coefficient times the mean of ``distance`` (the
        per-sample or per-pair distances), and that mean detached as the diagnostic ``<name>``."""
        kl = distance.mean()
        return {f"loss_{name}": getattr(self, f"{name}_coef") * kl, name: kl.detach()}

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        """These losses have no value estimator: nothing to forward."""

    def _get(self, batch: TensorDictBase, name: str, what: str):
        """Batch entry ``name`` (errors name it: a missing key, or a device other than the model's, unless the
        model declares ``moves_inputs = True``: it moves its inputs to its own device and its output back, as the
        diffusers ``LoRAPolicy`` does for a trainer whose batches stay on the CPU)."""
        key = getattr(self.tensor_keys, name)
        check_key(batch, key, what)
        value = batch.get(key)
        checked = isinstance(self.model, torch.nn.Module) and not getattr(self.model, "moves_inputs", False)
        weight = next(self.model.parameters(), None) if checked else None
        if weight is not None and getattr(value, "device", None) is not None and value.device != weight.device:
            raise ValueError(f"{key} ({what}) is on {value.device} but the model is on {weight.device}; move the batch "
                             f"to the model's device.")
        return value

    def _cond(self, batch: TensorDictBase):
        return None if self.unconditional else self._get(batch, "cond", "the prompt conditioning")

    def _clipped_objective(self, log_prob, old_log_prob, advantage, shape_rule: str) -> dict[str, torch.Tensor]:
        """The clipped ratio loss of ``log_prob - old_log_prob`` and its detached diagnostics."""
        if advantage.shape != log_prob.shape or old_log_prob.shape != log_prob.shape:
            raise ValueError(
                f"advantage {tuple(advantage.shape)} and old_log_prob {tuple(old_log_prob.shape)} {shape_rule} "
                f"{tuple(log_prob.shape)}."
            )
        log_ratio = log_prob - old_log_prob
        return {
            "loss_objective": clipped_ratio_objective(log_ratio, advantage, self.clip_range).mean(),
            "clip_fraction": clip_fraction(log_ratio, self.clip_range),
            "clip_fraction_active": clip_fraction_active(log_ratio, advantage, self.clip_range),
            **ratio_diagnostics(log_ratio),
        }


class VGRPOLoss(_PolicyLoss):
    """V-GRPO: GRPO with the ELBO surrogate as the whole-sample log-likelihood (Tang et al., 2026).

        rho_i = exp(s_theta(o_i) - s_old(o_i))                       (same stored pairs for both)
        L = -mean_i min(rho_i A_i, clip(rho_i, 1 - eps_lo, 1 + eps_hi) A_i)
            + behaviour_kl_coef * mean_i D_i(theta, old)  +  ref_kl_coef * mean_i D_i(theta, ref)

    ``D`` is the x-space distance of :func:`~vgrpo_lib.objectives.x_space_kl` on the stored pairs.

    Args:
        model: the trained velocity model ``model(z, t, cond) -> v``.
        estimator: the :class:`~vgrpo_lib.elbo.ELBOSurrogate` whose pairs are stored in the batch.
        clip_range: ``eps`` or ``(eps_lo, eps_hi)``; whole-sample ratios are sensitive, the paper uses
            about 6e-3 to 3e-2 (not LLM-style 0.2).
        behaviour_kl_coef: coefficient of the KL to the behaviour policy (paper: 0.3 where used); needs the batch
            entry ``"old_x_pred"`` ``[B, K, *D]`` stored with the old surrogates. ``None``: no KL term.
        ref_model, ref_kl_coef: a frozen reference policy (e.g. the base model; LoRA: adapters disabled) and the
            coefficient of the same x-space distance to it, computed on the fly without gradient.
        on_policy: the batch is used for exactly one gradient step right after the rollout, so
            ``s_old == s_theta`` in value: the old-surrogate pass is skipped and ``s_theta.detach()`` stands in
            (ratio exactly 1, gradient ``-A grad s_theta``). Wrong for several steps per rollout.
        unconditional: the model takes ``cond=None`` (then no ``"cond"`` entry is read).

    Batch entries (remappable with ``set_keys``): ``sample`` ``[B, *D]``, ``cond`` ``[B, ...]``, ``advantage``
    ``[B]``, ``pairs`` (TensorDict ``[B, K]`` from :meth:`ELBOSurrogate.sample_pairs`), ``old_log_prob`` ``[B]``,
    ``old_x_pred`` ``[B, K, *D]`` (behaviour KL only).

    Returns ``loss_objective`` (and ``loss_behaviour_kl``, ``loss_ref_kl``) plus detached diagnostics: ratio
    mean/min/max, ``clip_fraction`` / ``clip_fraction_active``, ``approx_kl_k3`` / ``approx_kl_sq``, ESS (see
    :func:`~vgrpo_lib.objectives.ratio_diagnostics`), surrogate mean, and the KL values ``behaviour_kl``,
    ``ref_kl``.
    """

    @dataclass
    class _AcceptedKeys(_SampleKeys):
        old_log_prob: str = "old_log_prob"
        old_x_pred: str = "old_x_pred"

    _schedulable_rules = {"clip_range": CLIP_RANGE, "behaviour_kl_coef": NON_NEGATIVE, "ref_kl_coef": NON_NEGATIVE}
    _batch_keys = ("sample", "advantage", "pairs")

    @renamed_keywords(kl_coef="behaviour_kl_coef", clip_epsilon="clip_range", clip_low="clip_range",
                      clip_high="clip_range")
    def __init__(
        self,
        model: torch.nn.Module,
        estimator: ELBOSurrogate,
        *,
        clip_range: float | tuple[float, float] = 0.01,
        behaviour_kl_coef: float | None = None,
        ref_model: torch.nn.Module | None = None,
        ref_kl_coef: float | None = None,
        on_policy: bool = False,
        unconditional: bool = False,
    ):
        super().__init__()
        self.model, self.estimator, self.ref_model = model, estimator, ref_model
        self.on_policy, self.unconditional = on_policy, unconditional
        self._register_scalar("clip_range", clip_range)
        self._register_scalar("behaviour_kl_coef", behaviour_kl_coef)  # its "model" is the stored old_x_pred
        self._register_kl("ref_kl", "ref_model", ref_model, ref_kl_coef)

    def _in_key_names(self) -> list[str]:
        return (super()._in_key_names() + ([] if self.on_policy else ["old_log_prob"])
                + ([] if self.behaviour_kl_coef is None else ["old_x_pred"]))

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The losses (``loss_*``, with gradient) and detached diagnostics of a batch, as a TensorDict ``[]``."""
        sample = self._get(tensordict, "sample", "the generated samples")
        advantage = self._get(tensordict, "advantage", "the advantages")
        pairs = self._get(tensordict, "pairs", "the stored timestep-noise pairs")
        cond = self._cond(tensordict)
        inputs = self.estimator.noised(sample, cond, pairs)
        pair_loss, x_pred = self.estimator.pair_loss(self.estimator.predict(self.model, inputs), inputs)
        log_prob = -pair_loss.mean(dim=1)
        if self.on_policy:
            old_log_prob = log_prob.detach()
        else:
            old_log_prob = self._get(tensordict, "old_log_prob", "the behaviour policy's surrogates")
        out = self._clipped_objective(log_prob, old_log_prob, advantage, "must be [B] =")
        out["surrogate"] = log_prob.detach().mean()
        if self.behaviour_kl_coef is not None:
            old_x_pred = self._get(tensordict, "old_x_pred", "the behaviour policy's x-predictions, for the KL")
            if old_x_pred.shape != x_pred.shape:
                raise ValueError(
                    f"old_x_pred {tuple(old_x_pred.shape)} must be [B, K, *D] = {tuple(x_pred.shape)} "
                    "(x-space KL needs equal shapes)."
                )
            out.update(self._kl_term("behaviour_kl", x_space_kl(x_pred, old_x_pred)))
        if self.ref_kl_coef is not None:
            with torch.no_grad():
                ref_x_pred = self.estimator.path.x_from_v(
                    inputs.z, self.estimator.predict(self.ref_model, inputs), inputs.t
                )
            out.update(self._kl_term("ref_kl", x_space_kl(x_pred, ref_x_pred)))
        return TensorDict(out, batch_size=[])


class FlowGRPOLoss(_PolicyLoss):
    """Flow-GRPO: per-transition PPO on the SDE rollout (Liu et al., 2025).

        ratio = exp(log p_theta(z' | z) - log p_old(z' | z)) of each stored SDE transition
        L = -mean over transitions of min(ratio A, clip(ratio, 1 - eps, 1 + eps) A)  +  ref_kl_coef * mean KL_step

    The step ``t -> t_next`` is Gaussian, ``N(mu, sigma_t^2 |dt| I)`` (:func:`vgrpo_lib.sde.sde_step_mean_std`), so
    its KL to the reference's step has a closed form. ``kl_form`` chooses what ``KL_step`` means:

    - ``"exact"``: ``||mu_theta - mu_ref||^2 / (2 sigma_t^2 |dt|)``, the Gaussian KL of the step;
    - ``"flow_grpo"``: ``||mu_theta - mu_ref||^2 / (2 sigma_t^2) = |dt| * exact``, what the official loss computes
      (yifan123/flow_grpo, ``scripts/train_sd3.py``: divided by ``2 * std_dev_t**2``, where ``std_dev_t`` is the
      SDE's ``sigma_t`` without the step length). The official ``beta`` (0.04 GenEval / OCR, 0.01 PickScore)
      has this meaning: on SD3's shifted 10-step grid (``|dt|`` from 0.036 to 0.25) it weighs each step's exact KL
      4 to 28 times less than the same coefficient with ``"exact"`` (10 times on a uniform 10-step grid). Use ``"flow_grpo"`` with a beta taken from the
      official presets.

    Both are reduced over the data dimensions like the log-prob (``"mean"``, the official, or ``"sum"``).

    Args:
        model: the trained velocity model (wrap it in
            :class:`~vgrpo_lib.samplers.ClassifierFreeGuidance` with ``detach_uncond=True`` to train with CFG as
            the official code does).
        clip_range: ``eps`` or ``(low, high)``; Flow-GRPO uses 1e-4 with the ``"mean"`` log-prob reduction.
        noise_level: ``a`` of the SDE (0.7; ``eta`` in ``(0, 1]`` for CPS); must equal the rollout's.
        log_prob_reduction: ``"mean"`` over dimensions (anchor, default) or ``"sum"``; must equal the rollout's.
        advantage_clip: advantages are hard-clipped to ``[-advantage_clip, advantage_clip]`` (official: 5);
            ``None``: not clipped here (e.g. already clipped by :class:`~vgrpo_lib.advantages.GroupAdvantage`).
        sde_type: ``"flow_sde"`` (Flow-GRPO's SDE) or ``"cps"`` (coefficients-preserving); must equal the rollout's.
        ref_model, ref_kl_coef: closed-form Gaussian KL to a frozen reference (``None``: no KL term).
        kl_form: ``"exact"`` (default) or ``"flow_grpo"``, see above.

    Batch entries: one row per transition (any batch shape; it is flattened): ``z``, ``z_next`` ``[..., *D]``,
    ``t``, ``t_next``, ``advantage``, ``old_log_prob`` ``[...]`` and ``cond`` with the same batch shape.
    """

    @dataclass
    class _AcceptedKeys:
        z: str = "z"
        z_next: str = "z_next"
        t: str = "t"
        t_next: str = "t_next"
        cond: str = "cond"
        advantage: str = "advantage"
        old_log_prob: str = "old_log_prob"

    _schedulable_rules = {"clip_range": CLIP_RANGE, "ref_kl_coef": NON_NEGATIVE}
    _batch_keys = ("z", "z_next", "t", "t_next", "advantage", "old_log_prob")

    @renamed_keywords(kl_coef="ref_kl_coef", clip_epsilon="clip_range", adv_clip="advantage_clip")
    def __init__(
        self,
        model: torch.nn.Module,
        *,
        clip_range: float | tuple[float, float] = 1e-4,
        noise_level: float = 0.7,
        log_prob_reduction: str = "mean",
        advantage_clip: float | None = 5.0,
        ref_model: torch.nn.Module | None = None,
        ref_kl_coef: float | None = None,
        sde_type: str = "flow_sde",
        kl_form: str = "exact",
        unconditional: bool = False,
    ):
        super().__init__()
        self.step_mean_std, self.sde_type = step_mean_std(sde_type), sde_type
        check_noise_level(sde_type, noise_level)
        self.kl_form = choose("Flow-GRPO KL form", kl_form, FLOW_GRPO_KL_FORMS)
        if advantage_clip is not None:  # clamp(-c, c) with c <= 0 or NaN is not a clip
            check_positive("advantage_clip", advantage_clip, allow_inf=True)
        self.model, self.ref_model, self.unconditional = model, ref_model, unconditional
        self.log_prob_reduction = choose("log-prob reduction", log_prob_reduction, LOG_PROB_REDUCTIONS)
        self.noise_level, self.advantage_clip = noise_level, advantage_clip
        self._register_scalar("clip_range", clip_range)
        self._register_kl("ref_kl", "ref_model", ref_model, ref_kl_coef)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The losses (``loss_*``, with gradient) and detached diagnostics of a batch, as a TensorDict ``[]``."""
        if tensordict.batch_size.numel() == 0:
            raise ValueError(f"The batch of transitions is empty (batch size {tuple(tensordict.batch_size)}).")
        batch = tensordict.reshape(-1)
        z = self._get(batch, "z", "the SDE states")
        z_next = self._get(batch, "z_next", "the sampled next states")
        t, t_next = self._get(batch, "t", "the step times"), self._get(batch, "t_next", "the next step times")
        # Shape checks only (no device sync): a z_next of another shape, or per-row times that are not one scalar
        # per transition, would broadcast silently inside the Gaussian density.
        if z_next.shape != z.shape:
            raise ValueError(f"z_next {tuple(z_next.shape)} must have the shape of z {tuple(z.shape)}.")
        for name, value in (("t", t), ("t_next", t_next)):
            if value.shape != z.shape[:1]:
                raise ValueError(
                    f"{name} must hold one time per transition, {tuple(z.shape[:1])} after flattening the batch, "
                    f"got {tuple(value.shape)}."
                )
        advantage = self._get(batch, "advantage", "the advantages")
        if self.advantage_clip is not None:
            advantage = advantage.clamp(-self.advantage_clip, self.advantage_clip)
        old_log_prob = self._get(batch, "old_log_prob", "the rollout's transition log-probs")
        cond = self._cond(batch)
        check_model_dtype(self.model, "z (the SDE states)", z)
        mean, std = self.step_mean_std(z, self.model(z, t, cond), t, t_next, self.noise_level)
        log_prob = gaussian_log_prob(z_next, mean, std, self.log_prob_reduction)
        out = self._clipped_objective(
            *self._ratio_log_probs(batch, log_prob, old_log_prob, mean, std),
            advantage,
            "must have one entry per transition (after flattening the batch):",
        )
        if self.ref_kl_coef is not None:
            with torch.no_grad():
                ref_mean, _ = self.step_mean_std(z, self.ref_model(z, t, cond), t, t_next, self.noise_level)
            kl = gaussian_kl_same_std(mean, ref_mean, std, self.log_prob_reduction)
            if self.kl_form == "flow_grpo":
                kl = kl * (t - t_next)  # the official divides by 2 sigma_t^2 only: |dt| times the exact KL
            out.update(self._kl_term("ref_kl", kl))
        return TensorDict(out, batch_size=[])

    def _ratio_log_probs(self, batch: TensorDictBase, log_prob, old_log_prob, mean, std):
        """The two log-probs whose difference is the clipped log-ratio: a hook for ratio variants (GRPO-Guard)."""
        return log_prob, old_log_prob


class GRPOGuardLoss(FlowGRPOLoss):
    """GRPO-Guard: Flow-GRPO with each step's log-ratio normalised (Wang et al., 2025, "GRPO-Guard: Mitigating
    Implicit Over-Optimization in Flow Matching via Regulated Clipping").

        log_ratio = std * (log p_theta - log p_old) + ||mu_theta - mu_old||^2 / (2 std)     (clipped as in Flow-GRPO)

    see :func:`~vgrpo_lib.objectives.guard_log_ratio`: zero-mean over the rollout noise with a scale that does not
    depend on the step (so one clip range fits every step), and each step's gradient weighted by its std. Follows
    Flow-Factory's ``GRPOGuardTrainer`` (X-GenGroup/Flow-Factory, src/flow_factory/trainers/grpo.py). Arguments
    as :class:`FlowGRPOLoss`; the batch also holds ``old_mean`` ``[..., *D]``, each step's mean under the
    behaviour policy (recorded by :func:`~vgrpo_lib.samplers.sample_sde` with ``record_mean=True``).
    The diagnostics (ratio statistics, clip fractions) are those of the normalised ratio.
    """

    @dataclass
    class _AcceptedKeys(FlowGRPOLoss._AcceptedKeys):
        old_mean: str = "old_mean"

    _batch_keys = (*FlowGRPOLoss._batch_keys, "old_mean")

    def _ratio_log_probs(self, batch: TensorDictBase, log_prob, old_log_prob, mean, std):
        old_mean = self._get(batch, "old_mean", "the behaviour policy's step means")
        if old_mean.shape != mean.shape:
            raise ValueError(f"old_mean {tuple(old_mean.shape)} must have the shape of z {tuple(mean.shape)}.")
        # The normalised log-ratio against 0: the clipped objective only sees the difference.
        return guard_log_ratio(log_prob - old_log_prob, mean, old_mean, std, self.log_prob_reduction), torch.zeros_like(log_prob)


class AWMLoss(_PolicyLoss):
    """AWM: advantage weighted matching (Xue et al., 2025, "Advantage Weighted Matching: Aligning RL with
    Pretraining in Diffusion Models").

        L = mean_{i, j} A_i l_theta(o_i; t_ij, eps_ij)
            + behaviour_kl_coef * mean ||v_theta - v_behaviour||^2  +  ref_kl_coef * mean ||v_theta - v_ref||^2

    The flow-matching loss ``l`` of the estimator (AWM: the generalised-Huber weighting ``"ghuber"``) on the
    policy's own samples, weighted by the advantage: no likelihood ratio and no trust region. The official code
    (scxue/advantage_weighted_matching, scripts/train_sd3_awm.py) writes it as a PPO ratio of per-pair log-probs
    ``-l`` with one on-policy step (ratio 1, clip range 1 inert): the same gradient, ``-A grad(-l)``. The KLs are
    velocity MSEs, to a soft-updated copy of the policy (its "EMA" adapter, decay ``min(0.001 step, 0.3)``,
    coefficient 1) and to the base model (0.001 GenEval, 0.003 OCR).

    Args:
        model: the trained velocity model.
        estimator: noising and weighting; its pairs (fresh each step) are in the batch.
        advantage_scale: multiplies the advantages (official: ``advantage_max / adv_clip_max`` = 1/5 after the
            clip to +-5), i.e. the weight of the matching term against the KLs.
        behaviour_model, behaviour_kl_coef: the soft-updated policy copy and the coefficient of the MSE to it.
        ref_model, ref_kl_coef: the frozen base policy and the coefficient of the MSE to it.

    Batch entries: ``sample`` ``[B, *D]``, ``cond``, ``advantage`` ``[B]``, ``pairs`` ``[B, K]``. Returns
    ``loss_objective`` (and ``loss_behaviour_kl``, ``loss_ref_kl``) plus the mean matching loss ``matching_loss``
    and the KL values.
    """

    _AcceptedKeys = _SampleKeys
    _schedulable_rules = {"behaviour_kl_coef": NON_NEGATIVE, "ref_kl_coef": NON_NEGATIVE}
    _batch_keys = ("sample", "advantage", "pairs")

    def __init__(
        self,
        model: torch.nn.Module,
        estimator: ELBOSurrogate,
        *,
        advantage_scale: float = 1.0,
        behaviour_model: VelocityModel | None = None,
        behaviour_kl_coef: float | None = None,
        ref_model: VelocityModel | None = None,
        ref_kl_coef: float | None = None,
        unconditional: bool = False,
    ):
        super().__init__()
        self.model, self.estimator, self.unconditional = model, estimator, unconditional
        self.behaviour_model, self.ref_model = behaviour_model, ref_model
        self.advantage_scale = check_positive("advantage_scale", advantage_scale)
        self._register_kl("behaviour_kl", "behaviour_model", behaviour_model, behaviour_kl_coef)
        self._register_kl("ref_kl", "ref_model", ref_model, ref_kl_coef)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The losses (``loss_*``, with gradient) and detached diagnostics of a batch, as a TensorDict ``[]``."""
        sample = self._get(tensordict, "sample", "the generated samples")
        advantage = self._get(tensordict, "advantage", "the advantages")
        pairs = self._get(tensordict, "pairs", "the timestep-noise pairs")
        if advantage.shape != sample.shape[:1]:
            raise ValueError(f"advantage must be [B] = [{sample.shape[0]}], got {tuple(advantage.shape)}.")
        inputs = self.estimator.noised(sample, self._cond(tensordict), pairs)
        v = self.estimator.predict(self.model, inputs)
        matching, _ = self.estimator.pair_loss(v, inputs)
        weight = self.advantage_scale * advantage
        out = {"loss_objective": (weight[:, None] * matching).mean(), "matching_loss": matching.detach().mean()}
        for name, other in (("behaviour_kl", self.behaviour_model), ("ref_kl", self.ref_model)):
            if getattr(self, f"{name}_coef") is not None:
                with torch.no_grad():
                    v_other = self.estimator.predict(other, inputs)
                out.update(self._kl_term(name, _velocity_distance(v, v_other)))
        return TensorDict(out, batch_size=[])


class DGPOLoss(_PolicyLoss):
    """DGPO: direct group preference optimisation (Luo et al., ICLR 2026, "Reinforcing Diffusion Models by Direct
    Group Preference Optimization"; official code Luo-Yihong/DGPO, scripts/train_sd3_dgpo.py,
    ``compute_group_dgpo_loss_allreduce`` and the training loop).

        w_gk = sigmoid( beta / |g| sum_{i in g} A_i (l_ik - l^ref_ik) )                  (constant)
        L = mean_{i, k} w_{g(i)k} A_i l~_ik  +  ref_kl_coef * mean ||v_theta - v_ref||^2

    ``l`` is the estimator's per-pair denoising loss (official: the velocity MSE) of the trained policy on its own
    ODE samples, ``l^ref`` the same on the same pairs under ``reference_model`` (official: the frozen base, or the
    soft-updated copy with ``use_ema_ref``), ``w`` the group preference weight of
    :func:`~vgrpo_lib.objectives.dgpo_group_weight`: its gradient is the group-level DPO loss's, no likelihood
    ratio of a stochastic sampler. With ``clip_range`` the per-pair ratio ``exp(l^old - l)`` to ``old_model`` (the
    soft-updated copy) clips as PPO does: ``l~`` is ``l`` with its gradient stopped where the ratio is above
    ``1 + eps`` with ``A > 0`` or below ``1 - eps`` with ``A < 0`` (official ``clip_dsm``). The rows of a group must
    reach one call together (the weight sums over the group).

    Args:
        model: the trained velocity model.
        estimator: noising and weighting; its pairs (shared within a group) are in the batch.
        reference_model: the model of the implicit reward ``-(l - l^ref)``, run without gradient.
        beta: the preference temperature (official ``beta_dpo``: 100 GenEval / OCR, 10 PickScore).
        old_model, clip_range: the behaviour copy and ``eps`` or ``(low, high)`` of the clip (official 1e-2; both or
            neither).
        ref_model, ref_kl_coef: the frozen base and the coefficient of the velocity MSE to it (official ``beta``:
            0.02 GenEval / OCR, 0.001 PickScore).

    Batch entries: ``sample`` ``[B, *D]``, ``cond``, ``advantage`` ``[B]``, ``group`` ``[B]``, ``pairs`` ``[B, K]``.
    Returns ``loss_objective`` (and ``loss_ref_kl``) plus the mean preference weight ``preference_weight``, the mean
    matching loss ``matching_loss``, its mean gap to the reference ``reference_gap`` and, with a clip, the ratio
    diagnostics.
    """

    @dataclass
    class _AcceptedKeys(_SampleKeys):
        group: str = "group"  # the prompt-group ids [B]

    _schedulable_rules = {"clip_range": CLIP_RANGE, "ref_kl_coef": NON_NEGATIVE}
    _batch_keys = ("sample", "advantage", "group", "pairs")

    def __init__(
        self,
        model: torch.nn.Module,
        estimator: ELBOSurrogate,
        reference_model: VelocityModel,
        *,
        beta: float = 100.0,
        old_model: VelocityModel | None = None,
        clip_range: float | tuple[float, float] | None = None,
        ref_model: VelocityModel | None = None,
        ref_kl_coef: float | None = None,
        unconditional: bool = False,
    ):
        super().__init__()
        if (old_model is None) != (clip_range is None):
            raise ValueError("The clip needs both old_model (the behaviour copy) and clip_range.")
        self.model, self.estimator, self.unconditional = model, estimator, unconditional
        self.reference_model, self.old_model, self.ref_model = reference_model, old_model, ref_model
        self.beta = POSITIVE.check("beta", beta)
        self._register_scalar("clip_range", clip_range)
        self._register_kl("ref_kl", "ref_model", ref_model, ref_kl_coef)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The losses (``loss_*``, with gradient) and detached diagnostics of a batch, as a TensorDict ``[]``."""
        sample = self._get(tensordict, "sample", "the generated samples")
        advantage = self._get(tensordict, "advantage", "the advantages")
        group = self._get(tensordict, "group", "the prompt-group ids")
        pairs = self._get(tensordict, "pairs", "the timestep-noise pairs")
        if advantage.shape != sample.shape[:1] or group.shape != sample.shape[:1]:
            raise ValueError(f"advantage and group must be [B] = [{sample.shape[0]}], got {tuple(advantage.shape)} "
                             f"and {tuple(group.shape)}.")
        inputs = self.estimator.noised(sample, self._cond(tensordict), pairs)
        v = self.estimator.predict(self.model, inputs)
        matching, _ = self.estimator.pair_loss(v, inputs)
        frozen = self._frozen_predictions(inputs)  # each distinct frozen model once (the base may serve twice)
        reference_loss, _ = self.estimator.pair_loss(frozen[id(self.reference_model)], inputs)
        weight = dgpo_group_weight(advantage, matching, reference_loss, group, self.beta)
        out = {"preference_weight": weight.mean(), "matching_loss": matching.detach().mean(),
               "reference_gap": (matching.detach() - reference_loss).mean()}
        if self.clip_range is not None:
            old_loss, _ = self.estimator.pair_loss(frozen[id(self.old_model)], inputs)
            log_ratio = old_loss - matching
            clipped = clip_active_mask(log_ratio, advantage[:, None], self.clip_range)
            matching = torch.where(clipped, matching.detach(), matching)
            out.update(clip_fraction=clip_fraction(log_ratio, self.clip_range), clip_fraction_active=clipped.float().mean(),
                       **ratio_diagnostics(log_ratio))
        out["loss_objective"] = (weight * advantage.detach()[:, None] * matching).mean()
        if self.ref_kl_coef is not None:
            out.update(self._kl_term("ref_kl", _velocity_distance(v, frozen[id(self.ref_model)])))
        return TensorDict(out, batch_size=[])

    @torch.no_grad()
    def _frozen_predictions(self, inputs) -> dict[int, torch.Tensor]:
        """The velocity of each distinct frozen model (reference, old, KL reference) at ``inputs``, by ``id``."""
        models = [m for m in (self.reference_model, self.old_model, self.ref_model) if m is not None]
        return {id(m): self.estimator.predict(m, inputs) for m in {id(m): m for m in models}.values()}


class DiffusionNFTLoss(_PolicyLoss):
    """DiffusionNFT: negative-aware fine-tuning on the forward process (Zheng et al., 2025).

        r = clip(clip(A, -Amax, Amax) / (2 Amax) + 1/2, 0, 1)
        v+ = (1 - b) v_old + b v_theta,      v- = (1 + b) v_old - b v_theta
        L = (Amax / b) E_{t, eps}[ r l(v+) + (1 - r) l(v-) ]  +  ref_kl_coef E ||v_theta - v_ref||^2

    ``l`` is the estimator's per-pair loss (default x-space adaptive weighting, as in DiffusionNFT); the
    ``Amax / b`` scale follows the official code. The old policy is a soft copy of the trained one, updated
    after each iteration (see :func:`vgrpo_lib.control.ema_update_`).

    Args:
        model, old_model: the trained velocity model and the behaviour (old) one (any frozen callable
            ``(x_t, t, cond) -> v``: a module, or a view of a second LoRA adapter of the same model).
        estimator: noising and weighting; its pairs (fresh each step, ``sharing="none"``) are in the batch.
        strength: ``b``, the implicit-policy mixing strength (1.0 GenEval, 0.1 OCR / multi-reward).
        advantage_max: ``Amax`` (official: 5): the advantages are clamped to ``[-Amax, Amax]`` before they are
            normalised into ``r``, and the loss is scaled by ``Amax / b`` (config ``diffusion_nft.advantage_max``).
        adv_mode: the official ``adv_mode`` (``"all"``, ``"positive_only"``, ``"negative_only"``, ``"one_only"``,
            ``"binary"``), see :func:`~vgrpo_lib.objectives.nft_optimality`.
        ref_model, ref_kl_coef: velocity-MSE KL to a frozen base policy (official: 1e-4).

    Batch entries: ``sample`` ``[B, *D]``, ``cond``, ``advantage`` ``[B]``, ``pairs`` ``[B, K]``.
    """

    _AcceptedKeys = _SampleKeys
    _schedulable_rules = {"ref_kl_coef": NON_NEGATIVE}
    _batch_keys = ("sample", "advantage", "pairs")

    @renamed_keywords(kl_coef="ref_kl_coef", adv_max="advantage_max", advantage_clip="advantage_max")
    def __init__(
        self,
        model: torch.nn.Module,
        old_model: VelocityModel,
        estimator: ELBOSurrogate,
        *,
        strength: float = 1.0,
        advantage_max: float = 5.0,
        adv_mode: str = "all",
        ref_model: torch.nn.Module | None = None,
        ref_kl_coef: float | None = None,
        unconditional: bool = False,
    ):
        super().__init__()
        self.adv_mode = choose("adv_mode", adv_mode, NFT_ADVANTAGE_MODES)
        self.strength = POSITIVE.check("strength", strength)
        self.advantage_max = POSITIVE.check("advantage_max", advantage_max)
        self.model, self.old_model, self.ref_model, self.estimator = model, old_model, ref_model, estimator
        self.unconditional = unconditional
        self._register_kl("ref_kl", "ref_model", ref_model, ref_kl_coef)

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        """The losses (``loss_*``, with gradient) and detached diagnostics of a batch, as a TensorDict ``[]``."""
        sample = self._get(tensordict, "sample", "the generated samples")
        advantage = self._get(tensordict, "advantage", "the advantages")
        pairs = self._get(tensordict, "pairs", "the timestep-noise pairs")
        inputs = self.estimator.noised(sample, self._cond(tensordict), pairs)
        v_theta = self.estimator.predict(self.model, inputs)
        with torch.no_grad():
            v_old = self.estimator.predict(self.old_model, inputs)
        v_positive, v_negative = nft_implicit_velocities(v_theta, v_old, self.strength)
        positive_loss, _ = self.estimator.pair_loss(v_positive, inputs)
        negative_loss, _ = self.estimator.pair_loss(v_negative, inputs)
        optimality = nft_optimality(advantage, self.advantage_max, self.adv_mode)
        if optimality.shape != (sample.shape[0],):
            raise ValueError(f"advantage must be [B] = [{sample.shape[0]}], got {tuple(advantage.shape)}.")
        per_pair = optimality[:, None] * positive_loss + (1.0 - optimality[:, None]) * negative_loss
        out = {
            "loss_objective": (self.advantage_max / self.strength) * per_pair.mean(),
            "positive_loss": positive_loss.detach().mean(),
            "negative_loss": negative_loss.detach().mean(),
            "optimality": optimality.mean(),
        }
        if self.ref_kl_coef is not None:
            with torch.no_grad():
                v_ref = self.estimator.predict(self.ref_model, inputs)
            out.update(self._kl_term("ref_kl", _velocity_distance(v_theta, v_ref)))
        return TensorDict(out, batch_size=[])


def _velocity_distance(v: torch.Tensor, v_other: torch.Tensor) -> torch.Tensor:
    """The velocity-MSE "KL" of AWM, DGPO and DiffusionNFT per pair ``[B, K]``: ``||v - v_other||^2`` averaged over
    the data dimensions of ``[B, K, *D]`` predictions."""
    return mean_over_data((v - v_other).square(), 2)


def total_loss(losses: TensorDictBase) -> torch.Tensor:
    """Sum of the ``loss_*`` entries of a loss module's output (what a trainer backpropagates)."""
    return sum(value for key, value in losses.items() if key.startswith("loss_"))
