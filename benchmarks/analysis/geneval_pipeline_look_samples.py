"""Sample grids (CFG 1 and 4, two held-out specs per category, noise seed 0) of a pilot snapshot and the reward
detector's raw detections (score > 0.2). Usage: python -m vgrpo_lib.benchmarks.analysis.geneval_pipeline_look_samples SNAPSHOTS STEP"""

from __future__ import annotations

import sys, torch
from pathlib import Path
from vgrpo_lib.integrations.testbed.geneval_digits import pipeline as G
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import geneval_specs
from vgrpo_lib.integrations.testbed.geneval_digits.reward import geneval_digits_scorer
from vgrpo_lib.integrations.figures import write_labelled_grid

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(2)
    snap, step = Path(argv[1]), int(argv[2])
    pipe = G.build_geneval_pipeline(seed=0)
    vae = torch.load(snap / "vae.pt"); pipe.vae.load_state_dict(vae["vae"])
    vae = torch.load(snap / "vae.pt"); pipe.vae.load_state_dict(vae["vae"])
    pipe.vae.register_to_config(shift_factor=vae["vae_config"]["shift_factor"], scaling_factor=vae["vae_config"]["scaling_factor"])
    for k, v in torch.load(snap / f"flow_{step}.pt").items(): getattr(pipe, k).load_state_dict(v)
    for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2): m.eval()
    specs = [s for tag in ("single_object","two_object","counting","colors","position","color_attr") for s in [x for x in geneval_specs("eval") if x["tag"]==tag][:2]]
    det = geneval_digits_scorer("digit_detector").detector
    for cfg in (1.0, 4.0):
        im = G.sample_compositions(pipe, specs, cfg, seed=0)
        print(cfg, "mean pixel", im.mean().item(), "max", im.amax(dim=(1,2,3)).tolist())
        for s, d in zip(specs, det(im)):
            print(s["prompt"], [(x.label, round(x.score, 2)) for x in d if x.score > 0.2])
        write_labelled_grid(im, [s["prompt"] for s in specs], f"cfg {cfg}", f"results/mnist-sd3-geneval-pipeline/samples_step{step}_cfg{int(cfg)}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
