"""Measure a pilot snapshot of MNIST-SD3-GenEval with the card's measurement (`pipeline.measure`) and, with `save`,
write the shipped folder from it (`save_pipeline` with this pipeline's model card): the snapshot at flow step k is
the rebuild `python -m vgrpo_lib.integrations.testbed.pretrain mnist_sd3_geneval` with FLOW_RECIPE steps=k (constant rate).
Usage: python -m vgrpo_lib.benchmarks.analysis.geneval_pipeline_finalize SNAPSHOTS STEP [save] [PILOT_SECONDS VAE_SECONDS]
"""

from __future__ import annotations

import json, sys, time
from pathlib import Path
import torch
from vgrpo_lib.integrations.testbed.geneval_digits import pipeline as G
from vgrpo_lib.integrations.testbed.mnist_sd3.train import save_pipeline

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(2)
    snapshots, step, save = Path(argv[1]), int(argv[2]), len(argv) > 3 and argv[3] == "save"
    pipe = G.build_geneval_pipeline(seed=0)
    vae = torch.load(snapshots / "vae.pt")
    pipe.vae.load_state_dict(vae["vae"])
    pipe.vae.register_to_config(shift_factor=vae["vae_config"]["shift_factor"], scaling_factor=vae["vae_config"]["scaling_factor"])
    for k, v in torch.load(snapshots / f"flow_{step}.pt").items():
        getattr(pipe, k).load_state_dict(v)
    for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
        m.eval()
    t = time.perf_counter()
    metrics = G.measure(pipe)
    print(json.dumps({"step": step, "measure_s": round(time.perf_counter() - t), **metrics}), flush=True)
    if save:
        pilot_s, vae_s = (int(argv[4]), int(argv[5])) if len(argv) > 5 else (0, 0)
        card = G.describe(pipe, metrics, G.VAE_RECIPE, {**G.FLOW_RECIPE, "steps": step},
                          {"vae_s": vae_s, "train_s": pilot_s, "total_s": pilot_s,
                           "note": "wall times of the pilot run (results/mnist-sd3-geneval-pipeline/pilot.py) up to this snapshot, "
                                   "including its periodic evaluations"})
        save_pipeline(pipe, card, G.PIPELINE_DIR, readme=G.model_card)
    return 0


if __name__ == "__main__":
    sys.exit(main())
