"""Headroom pilot for MNIST-SD3 (issue 10's 15-75% CFG-free band on both tasks): the shipped rebuild's VAE
(VAE_RECIPE), then the flow with less digit signal (FLOW_RECIPE with number_share and digit_batch overridden),
measuring the card's CFG-free digit and number accuracies (train.EVAL sample sets) every EVAL_EVERY steps from
step EVAL_FROM (defaults 1000 and 1000); with SNAPSHOT_DIR, the flow's modules are saved there at every measured
step (``flow_{step}.pt``, what ``finalize.py`` reads). The callbacks touch no training random stream, so the
snapshot at step k is the computation of ``pretrain mnist_sd3`` with these recipe values and ``steps=k``.
Usage: python -m vgrpo_lib.benchmarks.analysis.mnist_sd3_headroom_pilot STEPS NUMBER_SHARE DIGIT_BATCH [EVAL_FROM EVAL_EVERY SNAPSHOT_DIR] > LOG
"""

from __future__ import annotations

import json, os, sys, time, torch
from vgrpo_lib.integrations.rewards.simple import ocr_engine
from diffusers.models.attention_processor import JointAttnProcessor2_0
from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained
from vgrpo_lib.integrations.testbed.mnist_sd3.build import build_pipeline
from vgrpo_lib.integrations.testbed.mnist_sd3.train import (EVAL, FLOW_RECIPE, VAE_RECIPE, latent_pools, sample_accuracy,
                                                  set_latent_statistics, train_flow, train_vae)

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(2)
    STEPS, SHARE, DIGIT_BATCH = int(argv[1]), float(argv[2]), int(argv[3])
    EVAL_FROM, EVAL_EVERY = (int(argv[4]), int(argv[5])) if len(argv) > 5 else (1000, 1000)
    SNAPSHOT_DIR = argv[6] if len(argv) > 6 else None
    clf, eng = load_pretrained("classifier"), ocr_engine()
    T0 = time.perf_counter()
    def rec(**kw):
        kw["time"] = round(time.perf_counter() - T0); print(json.dumps(kw), flush=True)
    pipe = build_pipeline(seed=0)
    train_vae(pipe.vae, log=lambda line: None, **VAE_RECIPE)
    rec(stage="vae")
    recipe = {**FLOW_RECIPE, "steps": STEPS, "number_share": SHARE, "digit_batch": DIGIT_BATCH}
    rec(stage="recipe", **recipe)
    pools = latent_pools(pipe.vae, recipe.pop("pool_seed"), recipe.pop("number_repeats"))
    set_latent_statistics(pipe.vae, torch.cat([pools[t][0].flatten() for t in ("digit", "number")]))
    rec(stage="latents", shift_factor=pipe.vae.config.shift_factor, scaling_factor=pipe.vae.config.scaling_factor)
    if SNAPSHOT_DIR:
        os.makedirs(SNAPSHOT_DIR, exist_ok=True)
    def measure_now(step, p):
        if step < EVAL_FROM or (step - EVAL_FROM) % EVAL_EVERY: return
        if SNAPSHOT_DIR:
            torch.save({k: getattr(p, k).state_dict() for k in ("transformer", "text_encoder", "text_encoder_2", "vae")},
                       f"{SNAPSHOT_DIR}/flow_{step}.pt")
        proc = p.transformer.attn_processors
        p.transformer.set_attn_processor(JointAttnProcessor2_0())
        for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.eval()
        rec(stage="flow", step=step, **{f"{t}_cfg1": sample_accuracy(p, clf, eng, t, EVAL["per_prompt"][t], 1.0, EVAL["seed"])
                                        for t in ("digit", "number")})
        p.transformer.set_attn_processor(proc)
        for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.train()
    train_flow(pipe, pools, log=lambda line: None, callback=measure_now, **recipe)
    rec(stage="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
