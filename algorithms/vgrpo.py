"""V-GRPO (Tang et al., 2026): GRPO with the whole generation as ONE action and the ELBO surrogate as its
log-likelihood.

    rollout   any deterministic ODE solver (the objective does not depend on the trajectory)
    prepare   K timestep-noise pairs per sample (shared by the prompt group), and the behaviour policy's
              surrogates s_old on them, in micro-batches (skipped with one gradient step per rollout: the ratio
              is then exactly 1 and s_theta.detach() stands in, which saves K forwards per sample); with
              vgrpo.adaptive_pairs, on a measured iteration, also the noise of those surrogates, from which the
              next iterations' K is chosen (vgrpo_lib.control.PairCountController)
    loss      VGRPOLoss: clipped ratio exp(s_theta - s_old), optional x-space KL to the behaviour / base policy

Cost per sample and iteration: rollout steps + K without grad (unless single-step) + K per gradient step.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from vgrpo_lib.algorithms.base import Algorithm
from vgrpo_lib.algorithms.step_control import parse_adaptive_pairs
from vgrpo_lib.batches import old_surrogate, vgrpo_batch
from vgrpo_lib.control import PairCountController
from vgrpo_lib.diagnostics import pair_noise
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.losses import VGRPOLoss

__all__ = ["VGRPO"]


class VGRPO(Algorithm):
    """V-GRPO from ``config.vgrpo``: an ODE rollout, K stored pairs per sample and :class:`VGRPOLoss` (see the
    module docstring). Built with the policies, the sample shape ``[*D]`` and the rollout grid (floats 1 -> 0)."""

    name = "vgrpo"
    # K chosen from the measured noise (vgrpo.adaptive_pairs; class defaults: off, as for FPO, which reuses the rest)
    pair_control: PairCountController | None = None
    measuring = False  # whether this iteration measures the noise
    noise_share = float("nan")  # the last noise share measured

    def __init__(self, config, policies, sample_shape, grid):
        super().__init__(config, policies, sample_shape, grid)
        c = config.vgrpo
        if c.behaviour_kl_coef is not None and self.single_step:
            raise ValueError(
                "vgrpo.behaviour_kl_coef (KL to the behaviour policy) is inert with one gradient step per rollout; "
                "use optim.epochs > 1 or a minibatch_size, or vgrpo.ref_kl_coef for a KL to the base policy."
            )
        self.estimator = ELBOSurrogate(c.num_pairs, c.timesteps, c.sharing, c.weighting, chunk_size=c.chunk_size, noise=c.noise)
        if c.adaptive_pairs is not None:
            self.pair_control = parse_adaptive_pairs(c.adaptive_pairs, "vgrpo.adaptive_pairs", c.num_pairs,
                                                     c.noise == "antithetic")
        self.loss_module = VGRPOLoss(
            self.policy,
            self.estimator,
            clip_range=c.clip_range,
            behaviour_kl_coef=c.behaviour_kl_coef,
            ref_model=self.reference if c.ref_kl_coef is not None else None,
            ref_kl_coef=c.ref_kl_coef,
            on_policy=self.single_step,
        )

    @staticmethod
    def needs_reference(config) -> bool:
        return config.vgrpo.ref_kl_coef is not None

    def prepare(self, batch: TensorDict, generator: torch.Generator) -> TensorDict:
        if self.pair_control is not None:  # this iteration's K, chosen by the last measurement
            self.estimator.num_pairs = self.pair_control.num_pairs
            self.measuring = self.pair_control.due()
        # Drawn for the global batch on every process (only shapes and group ids are needed), block kept.
        shard = self.shard
        sample, group = shard.global_like(batch["sample"]), shard.all_gather(batch["group"])
        pairs = shard.local(self.estimator.sample_pairs(sample, group, generator))
        return batch.update(vgrpo_batch(self.estimator, batch["sample"], batch["cond"], batch["advantage"], pairs=pairs))

    def prepare_forward(self, rows: TensorDict) -> dict[str, torch.Tensor]:
        """The behaviour policy's (the policy before this rollout's steps) ``"old_log_prob"`` ``(n,)`` on the rows'
        pairs, and its ``"old_x_pred"`` ``(n, K, *D)`` for the KL to it; run unless one step per rollout."""
        keep_x_pred = self.config.vgrpo.behaviour_kl_coef is not None
        return old_surrogate(self.estimator, self.policy, rows["sample"], rows["cond"], rows["pairs"], keep_x_pred,
                             keep_per_pair=self.measuring)

    def prepared(self, rows: TensorDict) -> None:
        """On a measured iteration: the noise of the global batch's surrogates (:func:`pair_noise` of the behaviour
        policy's per-pair terms) sets the K of the next iterations."""
        if not self.measuring:
            return
        shard = self.shard
        measured = pair_noise(shard.all_gather(rows["old_pair_log_prob"]), shard.all_gather(rows["group"]),
                              couples=self.estimator.noise == "antithetic")
        self.noise_share = measured["noise_share"]
        self.pair_control.observe(measured["noise_variance"], measured["signal_variance"])

    def metrics(self) -> dict[str, float]:
        """With ``vgrpo.adaptive_pairs``: ``num_pairs`` (this iteration's K) and ``pair_noise_share`` (the last
        measured noise share, at the K it was measured with)."""
        if self.pair_control is None:
            return {}
        return {"num_pairs": self.estimator.num_pairs, "pair_noise_share": self.noise_share}

    @property
    def nfe_varies_with(self) -> str | None:
        """``vgrpo.adaptive_pairs`` when set: K, and with it the prepare and update NFE, is chosen as the run trains."""
        return None if self.pair_control is None else "vgrpo.adaptive_pairs"

    def nfe(self) -> dict[str, int]:
        k, epochs = self.estimator.num_pairs, self.config.optim.epochs
        reference = k * epochs if self.loss_module.ref_kl_coef is not None else 0
        prepare = k if not self.single_step or self.measuring else 0
        return {**super().nfe(), "prepare": prepare, "update": k * epochs + reference}

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.pair_control is not None:
            state |= {"pair_control": self.pair_control.state_dict(), "pair_noise_share": self.noise_share}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.pair_control is not None:
            self.pair_control.load_state_dict(state["pair_control"])
            self.noise_share = float(state["pair_noise_share"])
