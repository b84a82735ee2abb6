"""Why the composition VAE loses colours: per-object colour confusion (crop_colors on the exact boxes) of VAE round
trips, for the pilot's VAE loss (L1 + MSE on every pixel) against an ink-weighted loss (stroke pixels, where any
channel exceeds 0.1, weighted INK_WEIGHT times), same steps, batches and seed.
Usage: python -m vgrpo_lib.benchmarks.analysis.geneval_pipeline_vae_colour_probe STEPS INK_WEIGHT... > ...vae_colour_probe.log
"""

from __future__ import annotations

import json, sys, time, torch
import torch.nn.functional as F
from vgrpo_lib.integrations.testbed.geneval_digits import pipeline as G
from vgrpo_lib.integrations.testbed.geneval_digits.compositions import compose
from vgrpo_lib.integrations.testbed.geneval_digits.detector import crop_colors
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import COLORS, geneval_specs
from vgrpo_lib.integrations.testbed.mnist_sd3.build import build_vae
from vgrpo_lib.integrations.testbed.mnist_sd3.train import decode, encode_moments, optimizer_step

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(1)
    STEPS = int(argv[1])
    specs = [s for s in geneval_specs("eval") if s["tag"] in ("colors", "color_attr")]
    comp = compose(specs, "eval", torch.Generator().manual_seed(0))
    def confusion(images):
        m = torch.zeros(len(COLORS), len(COLORS), dtype=torch.long)
        for i in range(len(specs)):
            keep = comp.present[i]
            for truth, name in zip(comp.colors[i][keep].tolist(), crop_colors(images[i], comp.boxes[i][keep])):
                m[truth, COLORS.index(name)] += 1
        return m
    print(json.dumps({"colours": COLORS, "exact_confusion": confusion(comp.images).tolist()}), flush=True)
    for ink_weight in map(float, argv[2:]):
        torch.manual_seed(0)
        vae = build_vae(64)
        gen = torch.Generator().manual_seed(G.VAE_RECIPE["seed"])
        opt = torch.optim.AdamW(vae.parameters(), lr=G.VAE_RECIPE["lr"], weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
        source = G.composition_batches(G.VAE_RECIPE["batch_size"], gen)
        t0 = time.perf_counter()
        for step in range(STEPS):
            x01 = next(source); x = x01 * 2 - 1
            w = 1 + (ink_weight - 1) * (x01.amax(1, keepdim=True) > 0.1).float()
            post = vae.encode(x).latent_dist
            recon = vae.decode(post.mean + post.std * torch.randn(post.mean.shape, generator=gen)).sample
            err = recon - x
            loss = (w * (err.abs() + err.pow(2))).mean() / w.mean() + 1e-6 * post.kl().mean()
            optimizer_step(opt, sched, loss)
        vae.eval()
        with torch.no_grad():
            means, _ = encode_moments(vae, comp.images)
            recon = decode(vae, means)
        m = confusion(recon)
        print(json.dumps({"ink_weight": ink_weight, "steps": STEPS, "seconds": round(time.perf_counter() - t0),
                          "colour_accuracy": (m.diag().sum() / m.sum()).item(), "confusion": m.tolist()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
