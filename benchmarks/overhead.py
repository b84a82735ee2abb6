"""Library overhead: one V-GRPO update through ELBOSurrogate + VGRPOLoss vs a hand-written torch step.

Both compute the same math on the same model (the testbed's 784-dim residual-MLP velocity network), B = 64,
K = 4, stratified group-shared pairs, adaptive x-prediction weighting, clipped ratio, forward + backward.
The two are interleaved in one process (A, B, A, B, ...) so that machine noise hits both alike; the figure
is the median of per-round time ratios (library / hand-written). Target: <= 1.05.

    python -m vgrpo_lib.benchmarks.overhead [--rounds 30] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from tensordict import TensorDict

from vgrpo_lib.integrations.testbed.models import VelocityMLP
from vgrpo_lib import ELBOSurrogate, VGRPOLoss

__all__ = ["hand_written_step", "library_step", "run", "main"]

BATCH, PAIRS, GROUP = 64, 4, 8


def hand_written_step(model, sample, cond, t, noise, old_log_prob, advantage, clip):
    """The V-GRPO update written directly in torch (the reference for the overhead figure)."""
    batch, k = t.shape
    x = sample.unsqueeze(1).expand(batch, k, *sample.shape[1:])
    tt = t.view(batch, k, 1, 1, 1)
    z = (1 - tt) * x + tt * noise
    v = model(z.reshape(batch * k, *sample.shape[1:]), t.reshape(-1), cond.repeat_interleave(k)).view_as(z)
    error = z - tt * v - x
    scale = error.detach().abs().mean(dim=(2, 3, 4)).clamp_min(1e-5)
    log_prob = -(error.square().mean(dim=(2, 3, 4)) / scale).mean(dim=1)
    ratio = torch.exp(log_prob - old_log_prob)
    loss = -torch.minimum(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage).mean()
    loss.backward()
    return loss


def library_step(loss_module, batch):
    loss = loss_module(batch)["loss_objective"]
    loss.backward()
    return loss


def run(rounds: int = 30, warmup: int = 3, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = VelocityMLP(image_shape=(1, 28, 28), width=512, depth=4)
    torch.nn.init.normal_(model.out.weight, std=0.01)
    sample = torch.randn(BATCH, 1, 28, 28)
    cond = torch.arange(BATCH) % 10
    group = torch.arange(BATCH) // GROUP
    estimator = ELBOSurrogate(num_pairs=PAIRS)
    pairs = estimator.sample_pairs(sample, group, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        old = estimator(model, sample, cond, pairs) - 0.001
    advantage = torch.randn(BATCH)
    loss_module = VGRPOLoss(model, estimator, clip_range=0.01)
    batch = TensorDict(
        {"sample": sample, "cond": cond, "advantage": advantage, "pairs": pairs, "old_log_prob": old}, [BATCH]
    )
    args = (model, sample, cond, pairs["t"], pairs["noise"], old, advantage, 0.01)
    same = torch.allclose(library_step(loss_module, batch), hand_written_step(*args), rtol=1e-5, atol=1e-6)
    if not same:
        raise AssertionError("The library and the hand-written step disagree: the comparison would be meaningless.")

    def timed(fn, *fn_args):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        fn(*fn_args)
        return time.perf_counter() - start

    library, hand = [], []
    for i in range(warmup + rounds):
        first, second = (timed(library_step, loss_module, batch), timed(hand_written_step, *args))
        if i >= warmup:
            library.append(first)
            hand.append(second)
    ratios = [a / b for a, b in zip(library, hand)]
    return {
        "batch": BATCH,
        "num_pairs": PAIRS,
        "rounds": rounds,
        "library_median_s": statistics.median(library),
        "hand_written_median_s": statistics.median(hand),
        "median_ratio": statistics.median(ratios),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = run(args.rounds)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
