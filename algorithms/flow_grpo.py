"""Flow-GRPO (Liu et al., 2025): generation as a T-step MDP through an SDE with the ODE's marginals.

    rollout   the SDE sampler (Flow-GRPO's SDE, or coefficients-preserving sampling: ``flow_grpo.sde_type=cps``),
              recording each stochastic transition (z, z') and its log-density under the behaviour policy (MixGRPO: SDE steps only inside a sliding window, ODE elsewhere), with CFG when
              ``cfg_scale`` is not 1 (the official recipe: 4.5)
    prepare   one training row per trained transition, carrying its sample's advantage: the first
              ``int(num_steps * timestep_fraction)`` steps (official: 0.99, i.e. 9 of 10), and only samples with
              a non-zero advantage when ``filter_zero_advantage`` (official)
    loss      FlowGRPOLoss: per-transition clipped ratio, optional closed-form Gaussian KL to the base policy
              (``kl_form``: exact, or the official per-step form); with CFG the unconditional branch is detached

Cost per sample and iteration: rollout steps + one forward per trained transition per epoch (each doubled by
CFG, and by the reference's forward when a KL is on). Subclasses (GRPO-Guard, Flow-GRPO-Fast) change the loss
class or which steps are stochastic.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from vgrpo_lib.algorithms.base import Algorithm
from vgrpo_lib.batches import flow_grpo_batch
from vgrpo_lib.control import SDEWindow
from vgrpo_lib.losses import FlowGRPOLoss
from vgrpo_lib.samplers import classifier_free_guidance, sample_sde

__all__ = ["FlowGRPO"]


class FlowGRPO(Algorithm):
    """Flow-GRPO from ``config.flow_grpo``: the recording SDE rollout (MixGRPO: a sliding window), one training row
    per transition and :class:`FlowGRPOLoss` (see the module docstring)."""

    name = "flow_grpo"
    loss_class = FlowGRPOLoss
    record_mean = False  # the rollout also records each step's mean (GRPO-Guard's ratio normalisation)

    def __init__(self, config, policies, sample_shape, grid):
        super().__init__(config, policies, sample_shape, grid)
        c = config.flow_grpo
        self.window = (
            None
            if c.window_size is None
            else SDEWindow(config.rollout.num_steps, c.window_size, shift_interval=c.window_shift_interval)
        )
        if c.cfg_scale != 1.0 and policies.null_cond is None:
            raise ValueError(f"flow_grpo.cfg_scale={c.cfg_scale} needs a task with an unconditional condition (null_cond).")
        # Rollout and loss see the guided velocity; its unconditional branch carries no gradient (official).
        self.guided_policy = classifier_free_guidance(self.policy, policies.null_cond, c.cfg_scale, detach_uncond=True)
        reference = None if c.ref_kl_coef is None else classifier_free_guidance(self.reference, policies.null_cond, c.cfg_scale)
        self.loss_module = self.loss_class(
            self.guided_policy,
            clip_range=c.clip_range,
            noise_level=c.noise_level,
            log_prob_reduction=c.log_prob_reduction,
            advantage_clip=config.advantage.clip,  # as the trainer's GroupAdvantage: one bound, so clamped once
            ref_model=reference,
            ref_kl_coef=c.ref_kl_coef,
            kl_form=c.kl_form,
            sde_type=c.sde_type,
        )

    @staticmethod
    def needs_reference(config) -> bool:
        return config.flow_grpo.ref_kl_coef is not None

    def sde_steps(self, iteration: int, generator: torch.Generator) -> list[int] | None:
        """The stochastic (and recorded) steps of this iteration's rollout; None: every step that has noise."""
        return None if self.window is None else self.window(iteration)

    @torch.no_grad()
    def rollout(self, cond, group, generator, iteration):
        c = self.config.flow_grpo
        noise = self.shard.randn((group.shape[0], *self.sample_shape), generator)
        sample, trajectory = sample_sde(
            self.guided_policy,
            noise,
            self.grid,
            cond,
            noise_level=c.noise_level,
            sde_steps=self.sde_steps(iteration, generator),
            # sample_sde draws each step's noise for the local batch: independent per process (not bitwise a
            # 1-process run, unlike the initial noise); the shared generator stays in sync.
            generator=self.shard.independent_generator(generator),
            log_prob_reduction=c.log_prob_reduction,
            sde_type=c.sde_type,
            record_mean=self.record_mean,
        )
        return TensorDict(
            {"sample": sample, "cond": cond, "group": group, "trajectory": trajectory}, batch_size=[group.shape[0]]
        )

    def prepare(self, batch: TensorDict, generator: torch.Generator) -> TensorDict:
        if self.config.flow_grpo.filter_zero_advantage:
            batch = self._filter_zero_advantage(batch, generator)
        rows = flow_grpo_batch(batch["trajectory"], batch["advantage"], batch["cond"], num_steps=self.trained_steps())
        return rows.reshape(-1)

    def _filter_zero_advantage(self, batch: TensorDict, generator: torch.Generator) -> TensorDict:
        """The official filter (``scripts/train_sd3.py``): samples whose advantage is exactly 0 (groups with equal
        rewards) are not trained. As there, random zero-advantage samples are kept back so that the count is a
        multiple of the minibatches; when every advantage is 0 the batch is kept whole (its policy gradient is
        0; the official would fail on an empty batch)."""
        if self.shard.world_size > 1 and self.config.optim.minibatch_size is not None:
            raise ValueError(
                "flow_grpo.filter_zero_advantage leaves each process its own number of rows: with several processes "
                "set optim.minibatches (a number of gradient steps) instead of optim.minibatch_size."
            )
        keep = batch["advantage"] != 0
        kept = int(keep.sum())
        if kept == 0:
            return batch
        short = -kept % (self.config.optim.minibatches or 1)
        if short:
            zero = (~keep).nonzero().squeeze(1)
            keep[zero[torch.randperm(zero.numel(), generator=generator)[:short]]] = True
        return batch[keep]

    def trained_steps(self) -> int:
        """SDE steps trained per sample and epoch (the window's size with MixGRPO)."""
        if self.window is not None:
            return self.window.size
        # A CPS step to t = 0 has no noise: never stochastic, never trained.
        noisy = sum(1 for t_next in self.grid[1:] if self.config.flow_grpo.sde_type != "cps" or t_next > 0.0)
        return min(int(self.config.rollout.num_steps * self.config.flow_grpo.timestep_fraction), noisy)

    def nfe(self) -> dict[str, int]:
        guidance = 2 if self.config.flow_grpo.cfg_scale != 1.0 else 1
        per_epoch = self.trained_steps() * guidance * (2 if self.needs_reference(self.config) else 1)
        return {"rollout": self.config.rollout.num_steps * guidance, "prepare": 0,
                "update": per_epoch * self.config.optim.epochs}
