"""Your own model and reward through the project's trainer: a 2-D flow-matching toy, without editing the project.

A tiny velocity MLP is pretrained (a few seconds) on a mixture of 8 Gaussians on a circle; the reward prefers the
mode at (2, 0). The model, the data and the reward are wrapped as a *task*: an object with the members of
`vgrpo_lib.algorithms.tasks.TaskProtocol` (no base class). V-GRPO then trains it twice:

1. in Python, `Trainer(config, run_dir, task=make_task())`;
2. on the command line, `vgrpo train --task custom_task:make_task` (an import path to a zero-argument factory;
   the folder of this file on PYTHONPATH). The run's config.json keeps the import path, so `vgrpo train --resume`
   rebuilds the task from it.

In both, the evaluation reward rises (asserted). Run it (about 30 s on one CPU core):

    python docs/examples/custom_task.py
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from vgrpo_lib import sample_euler, time_grid
from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.tasks import check_task
from vgrpo_lib.algorithms.trainer import Trainer

TARGET = torch.tensor([2.0, 0.0])  # the mode the reward prefers


# -- 1. the model: any callable model(x_t, t, cond) -> v (vgrpo_lib.VelocityModel) ----------------------------------


class VelocityMLP(nn.Module):
    """``model(x_t, t, cond) -> v``: ``x_t`` ``(N, 2)``, ``t`` ``(N,)`` in [0, 1] (1 = noise), ``cond`` unused (None)."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, 2))

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond=None) -> torch.Tensor:
        return self.net(torch.cat([x_t, t[:, None]], dim=1))


def mixture(n: int, generator: torch.Generator) -> torch.Tensor:
    """``(n, 2)`` points from 8 Gaussians (std 0.1) on the circle of radius 2."""
    angle = torch.randint(0, 8, (n,), generator=generator) * (2 * math.pi / 8)
    centres = 2.0 * torch.stack([angle.cos(), angle.sin()], dim=1)
    return centres + 0.1 * torch.randn(n, 2, generator=generator)


@functools.lru_cache(maxsize=1)
def pretrained(steps: int = 1500, seed: int = 0) -> VelocityMLP:
    """Flow matching on the mixture: ``x_t = (1 - t) x + t eps``, target velocity ``eps - x`` (rectified flow)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = VelocityMLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains fastest on one thread (no contention on a busy machine)
    try:
        for _ in range(steps):
            x = mixture(256, generator)
            eps = torch.randn(x.shape, generator=generator)
            t = torch.rand(x.shape[0], generator=generator)
            x_t = (1 - t[:, None]) * x + t[:, None] * eps
            loss = (model(x_t, t) - (eps - x)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.requires_grad_(False).eval()


# -- 2. the reward: rewards (N,) for decoded samples and their prompts ------------------------------------------------


def reward(points: torch.Tensor, prompts) -> torch.Tensor:
    """``exp(-|x - TARGET|^2)``: 1 at the preferred mode, about 0.1 at its neighbours, ``(N,)``."""
    return torch.exp(-(points - TARGET).pow(2).sum(dim=1))


# -- 3. the task: what the trainer calls (vgrpo_lib.algorithms.tasks.TaskProtocol) ---------------------------------


class Toy2DTask:
    """Unconditional 2-D flow matching as a task: one prompt (id 0), ``cond`` None, samples are the points."""

    sample_shape = (2,)
    evaluation_metrics = {"near_target": "share of samples within 0.5 of the preferred mode"}

    def __init__(self, base: VelocityMLP):
        self.base = base

    def sample_prompts(self, num_prompts: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.zeros(num_prompts, dtype=torch.long)

    def condition(self, prompts: torch.Tensor) -> None:
        return None

    def load_policy(self) -> nn.Module:
        return copy.deepcopy(self.base).train().requires_grad_(True)

    def reference_policy(self, policy: nn.Module) -> nn.Module:
        return copy.deepcopy(policy).requires_grad_(False)

    def decode(self, samples: torch.Tensor) -> torch.Tensor:
        return samples  # the reward reads the points themselves

    def reward(self):
        return reward

    def eval_prompts(self, per_prompt: int) -> torch.Tensor:
        return torch.zeros(per_prompt, dtype=torch.long)

    @torch.no_grad()
    def sample(self, policy: nn.Module, prompts: torch.Tensor, num_steps: int = 20,
               generator: torch.Generator | None = None) -> torch.Tensor:
        noise = torch.randn((len(prompts), *self.sample_shape), generator=generator)
        return sample_euler(policy, noise, time_grid(num_steps))

    def evaluate(self, points: torch.Tensor, prompts: torch.Tensor) -> dict:
        scores = reward(points, prompts)
        near = ((points - TARGET).norm(dim=1) < 0.5).float().mean().item()
        return {"reward_mean": scores.mean().item(), "reward_std": scores.std().item(), "near_target": near}

    def write_samples(self, points: torch.Tensor, prompts, path, title: str = "") -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(3, 3))
        axes.scatter(points[:, 0], points[:, 1], s=2)
        axes.set(xlim=(-3, 3), ylim=(-3, 3), title=title[:40])
        figure.savefig(path)
        plt.close(figure)
        return Path(path)


def make_task() -> Toy2DTask:
    """The factory that ``vgrpo train --task custom_task:make_task`` calls (no argument)."""
    return Toy2DTask(pretrained())


# -- 4. train it: in Python and on the command line ---------------------------------------------------------------

SETTINGS = [
    "iterations=16", "prompts_per_iteration=4", "group_size=16", "rollout.num_steps=10", "optim.lr=3e-3",
    "vgrpo.ref_kl_coef=0.1", "eval.every=0", "eval.per_prompt=512", "eval.num_steps=10", "checkpoint_every=8",
    "log.backend=csv",
]
"""A short run: 16 iterations of 4 prompts x 16 samples; evaluations at the start and the end."""


def main() -> None:
    torch.set_num_threads(1)
    check_task(make_task())  # what the trainer checks first: every missing member would be named here
    with tempfile.TemporaryDirectory() as tmp:
        # (a) Python: any object satisfying the protocol; config.json records the task as "__main__.Toy2DTask".
        config = TrainConfig.for_algo("vgrpo", overrides=SETTINGS)
        evaluations = Trainer(config, Path(tmp) / "python", task=make_task(), progress=False).train()
        first, last = evaluations[0]["reward_mean"], evaluations[-1]["reward_mean"]
        print(f"Trainer(task=obj):       eval reward {first:.3f} -> {last:.3f}")
        assert last > first + 0.05, (first, last)

        # (b) The command line: `vgrpo train --task custom_task:make_task ...` with this folder on PYTHONPATH.
        here = str(Path(__file__).resolve().parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1"}
        out = Path(tmp) / "cli"
        command = [sys.executable, "-m", "vgrpo_lib.algorithms.cli", "train", "--task", "custom_task:make_task",
                   "--out", str(out), *SETTINGS]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]  # an error is one line: `vgrpo train: error: ...`
        assert json.loads((out / "config.json").read_text())["task"] == "custom_task:make_task"  # --resume rebuilds it
        rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
        first, last = rows[0]["reward_mean"], rows[-1]["reward_mean"]
        print(f"vgrpo train --task custom_task:make_task: eval reward {first:.3f} -> {last:.3f}")
        assert last > first + 0.05, (first, last)


if __name__ == "__main__":
    main()
