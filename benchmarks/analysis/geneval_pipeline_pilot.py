"""Pilot of the MNIST-SD3-GenEval rebuild: exactly `pretrain_geneval_pipeline`'s computation (VAE_RECIPE, then
FLOW_RECIPE with FLOW_STEPS steps, THREADS torch threads (default 2, the pretrain command's)), with measurements as callbacks that touch no training
random stream: GenEval's table of the VAE round trip every 250 VAE steps, and of CFG-free samples (every held-out
spec once, 20 steps) every 1000 flow steps; fp32 snapshots of every flow measurement go to SNAPSHOTS.
Both stages use a constant rate after warmup, so snapshot k IS the rebuild with FLOW_RECIPE steps=k.
Usage: python -u -m vgrpo_lib.benchmarks.analysis.geneval_pipeline_pilot FLOW_STEPS SNAPSHOTS [THREADS] > results/mnist-sd3-geneval-pipeline/pilot.log
"""

from __future__ import annotations

import json, sys, time
from pathlib import Path
import torch
from diffusers.models.attention_processor import JointAttnProcessor2_0
from vgrpo_lib.integrations.testbed.geneval_digits import pipeline as G
from vgrpo_lib.integrations.testbed.geneval_digits.compositions import compose
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import geneval_specs
from vgrpo_lib.integrations.testbed.geneval_digits.reward import geneval_digits_scorer, geneval_digits_table
from vgrpo_lib.integrations.testbed.mnist_sd3.train import decode, encode_moments, train_vae

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    STEPS, OUT = int(argv[1]), Path(argv[2])
    torch.set_num_threads(int(argv[3]) if len(argv) > 3 else 2)
    OUT.mkdir(parents=True, exist_ok=True)
    scorers = {"detector": geneval_digits_scorer("digit_detector"), "judge": geneval_digits_scorer("digit_detector_judge")}
    specs = geneval_specs("eval")
    exact = compose(specs, "eval", torch.Generator().manual_seed(G.EVAL["seed"]), layout=G.LAYOUT).images
    T0 = time.perf_counter()
    def rec(**kw):
        kw["time"] = round(time.perf_counter() - T0); print(json.dumps(kw), flush=True)
    def vae_probe(step, vae):
        if step % 250: return
        vae.eval()
        with torch.no_grad():
            means, _ = encode_moments(vae, exact)
            recon = decode(vae, means)  # scaling 1, shift 0 until the flow stage sets them
        rec(stage="vae", step=step, pixel_mae=(recon - exact).abs().mean().item(), **geneval_digits_table(recon, specs, scorers))
        vae.train()
    def flow_probe(step, p):
        if step % 1000: return
        if not (OUT / "vae.pt").exists():  # frozen from here on, its latent statistics set: any snapshot can be finalized
            torch.save({"vae": p.vae.state_dict(), "vae_config": dict(p.vae.config)}, OUT / "vae.pt")
        procs = p.transformer.attn_processors
        p.transformer.set_attn_processor(JointAttnProcessor2_0())
        for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.eval()
        images = G.sample_compositions(p, specs, 1.0, G.EVAL["seed"], G.EVAL["num_steps"])
        rec(stage="flow", step=step, **geneval_digits_table(images, specs, scorers))
        torch.save({k: getattr(p, k).state_dict() for k in ("transformer", "text_encoder", "text_encoder_2")}, OUT / f"flow_{step}.pt")
        p.transformer.set_attn_processor(procs)
        for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.train()
    pipe = G.build_geneval_pipeline(seed=0)
    train_vae(pipe.vae, log=print, batches=G.composition_batches, callback=vae_probe, **G.VAE_RECIPE)
    G.flow_stage(pipe, log=print, **{**G.FLOW_RECIPE, "steps": STEPS}, callback=flow_probe)
    rec(stage="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
