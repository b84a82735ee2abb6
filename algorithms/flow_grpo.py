"""Flow-GRPO (Liu et al., 2025): generation as a T-step MDP through an SDE with the ODE's marginals.

    rollout   the SDE sampler, recording each stochastic transition (z, z') and its log-density under the
              behaviour policy (MixGRPO: SDE steps only inside a sliding window, ODE elsewhere)
    prepare   one training row per recorded transition, carrying its sample's advantage
    loss      FlowGRPOLoss: per-transition clipped ratio, optional closed-form Gaussian KL to the base policy

Cost per sample and iteration: rollout steps + one forward per trained transition per epoch.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from algorithms.base import Algorithm, expand_rows
from vgrpo_lib.control import SDEWindow
from vgrpo_lib.losses import FlowGRPOLoss
from vgrpo_lib.samplers import sample_sde


class FlowGRPO(Algorithm):
    name = "flow_grpo"

    def __init__(self, config, policies, sample_shape, grid):
        super().__init__(config, policies, sample_shape, grid)
        c = config.flow_grpo
        self.window = (
            None
            if c.window_size is None
            else SDEWindow(config.rollout.num_steps, c.window_size, shift_interval=c.window_shift_interval)
        )
        self.loss_module = FlowGRPOLoss(
            self.policy,
            clip_epsilon=c.clip_epsilon,
            noise_level=c.noise_level,
            log_prob_reduction=c.log_prob_reduction,
            adv_clip=c.adv_clip,
            ref_model=self.reference if c.kl_coef is not None else None,
            kl_coef=c.kl_coef,
        )

    @staticmethod
    def needs_reference(config) -> bool:
        return config.flow_grpo.kl_coef is not None

    @torch.no_grad()
    def rollout(self, cond, group, generator, iteration):
        c = self.config.flow_grpo
        noise = self.shard.randn((group.shape[0], *self.sample_shape), generator)
        sample, trajectory = sample_sde(
            self.policy,
            noise,
            self.grid,
            cond,
            noise_level=c.noise_level,
            sde_steps=None if self.window is None else self.window(iteration),
            # sample_sde draws each step's noise for the local batch: independent per process (not bitwise a
            # 1-process run, unlike the initial noise); the shared generator stays in sync.
            generator=self.shard.independent_generator(generator),
            log_prob_reduction=c.log_prob_reduction,
        )
        return TensorDict(
            {"sample": sample, "cond": cond, "group": group, "trajectory": trajectory}, batch_size=[group.shape[0]]
        )

    def prepare(self, batch: TensorDict, generator: torch.Generator) -> TensorDict:
        trajectory = batch["trajectory"]
        steps = trajectory.shape[1]
        rows = trajectory.exclude("log_prob")
        rows["old_log_prob"] = trajectory["log_prob"]
        rows["advantage"] = expand_rows(batch["advantage"], steps)
        rows["cond"] = expand_rows(batch["cond"], steps)
        return rows.reshape(-1)

    def trained_steps(self) -> int:
        return self.config.rollout.num_steps if self.window is None else self.window.size

    def nfe(self) -> dict[str, int]:
        per_epoch = self.trained_steps() * (2 if self.needs_reference(self.config) else 1)
        return {"rollout": self.config.rollout.num_steps, "prepare": 0, "update": per_epoch * self.config.optim.epochs}
