"""Pilot for MNIST-SD3's second flow stage (numbers only), run after an exact rebuild of stage 1.

1. Rebuilds the shipped pipeline's computation (VAE_RECIPE, then FLOW_RECIPE) and compares its transformer,
   cast to float16, with the shipped weights: the reproducibility check of `pretrain mnist_sd3`'s first stage.
2. Continues with rectified flow on numbers only (number_share 1.0) at a lower rate, measuring the CFG-free
   digit and number accuracies (the card's sample sets) every 250 steps and keeping each snapshot.
Usage: python -m vgrpo_lib.benchmarks.analysis.mnist_sd3_stage2_pilot STEPS LR > results/mnist-sd3-pipeline/stage2_pilot.log
"""

from __future__ import annotations

import json, sys, time, torch
from vgrpo_lib.integrations.rewards.simple import ocr_engine
from diffusers import StableDiffusion3Pipeline
from diffusers.models.attention_processor import JointAttnProcessor2_0
from vgrpo_lib.integrations.packed_weights import unpacked_folder
from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained
from vgrpo_lib.integrations.testbed.mnist_sd3.build import PIPELINE_DIR, build_pipeline
from vgrpo_lib.integrations.testbed.mnist_sd3.train import (EVAL, FLOW_RECIPE, VAE_RECIPE, latent_pools, sample_accuracy,
                                                  set_latent_statistics, train_flow, train_vae)

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(2)
    STEPS, LR = int(argv[1]), float(argv[2])
    clf, eng = load_pretrained("classifier"), ocr_engine()
    T0 = time.perf_counter()
    def rec(**kw):
        kw["time"] = round(time.perf_counter() - T0); print(json.dumps(kw), flush=True)
    pipe = build_pipeline(seed=0)
    train_vae(pipe.vae, log=print, **VAE_RECIPE)
    recipe = dict(FLOW_RECIPE)
    pools = latent_pools(pipe.vae, recipe.pop("pool_seed"), recipe.pop("number_repeats"))
    set_latent_statistics(pipe.vae, torch.cat([pools[t][0].flatten() for t in ("digit", "number")]))
    train_flow(pipe, pools, log=print, **recipe)
    shipped = StableDiffusion3Pipeline.from_pretrained(unpacked_folder(PIPELINE_DIR), torch_dtype=torch.float16)
    for name in ("transformer", "text_encoder", "text_encoder_2", "vae"):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(shipped, name).state_dict()
        diff = max((mine[k].half().float() - theirs[k].float()).abs().max().item() for k in theirs)
        rec(stage="reproduce", module=name, max_abs_diff_fp16=diff)
    rec(stage="reproduce", shift=pipe.vae.config.shift_factor, scale=pipe.vae.config.scaling_factor,
        shipped_shift=shipped.vae.config.shift_factor, shipped_scale=shipped.vae.config.scaling_factor)
    del shipped
    torch.save({k: getattr(pipe, k).state_dict() for k in ("transformer", "text_encoder", "text_encoder_2", "vae")}, "/tmp/s2/stage1.pt")
    def measure_now(step, p):
        proc = p.transformer.attn_processors
        p.transformer.set_attn_processor(JointAttnProcessor2_0())
        for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.eval()
        accs = {f"{t}_cfg1": sample_accuracy(p, clf, eng, t, EVAL["per_prompt"][t], 1.0, EVAL["seed"]) for t in ("digit", "number")}
        rec(stage="numbers", step=step, **accs)
        torch.save({k: getattr(p, k).state_dict() for k in ("transformer", "text_encoder", "text_encoder_2")}, f"/tmp/s2/stage2_{step}.pt")
        p.transformer.set_attn_processor(proc)
        for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.train()
    measure_now(0, pipe)
    stage2 = {**recipe, "steps": STEPS, "number_share": 1.0, "lr": LR, "seed": 300}
    train_flow(pipe, pools, log=print, callback=lambda s, p: measure_now(s, p) if s % 250 == 0 else None, **stage2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
