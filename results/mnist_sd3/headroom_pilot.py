"""Headroom pilot for MNIST-SD3 (issue 10's 15-75% CFG-free band on both tasks): the shipped rebuild's VAE
(VAE_RECIPE), then the flow with less digit signal (FLOW_RECIPE with number_share and digit_batch overridden),
measuring the card's CFG-free digit and number accuracies (train.EVAL sample sets) every 1000 steps.
Usage: PYTHONPATH=. python results/mnist_sd3/headroom_pilot.py STEPS NUMBER_SHARE DIGIT_BATCH > results/mnist_sd3/headroom_pilot.log
"""
import json, sys, time, torch
torch.set_num_threads(2)
from rapidocr_onnxruntime import RapidOCR
from diffusers.models.attention_processor import JointAttnProcessor2_0
from integrations.testbed.checkpoints import load_pretrained
from integrations.testbed.mnist_sd3.build import build_pipeline
from integrations.testbed.mnist_sd3.train import (EVAL, FLOW_RECIPE, VAE_RECIPE, latent_pools, sample_accuracy,
                                                  set_latent_statistics, train_flow, train_vae)
STEPS, SHARE, DIGIT_BATCH = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
clf, eng = load_pretrained("classifier"), RapidOCR()
T0 = time.perf_counter()
def rec(**kw):
    kw["time"] = round(time.perf_counter() - T0); print(json.dumps(kw), flush=True)
pipe = build_pipeline(seed=0)
train_vae(pipe.vae, log=lambda line: None, **VAE_RECIPE)
recipe = {**FLOW_RECIPE, "steps": STEPS, "number_share": SHARE, "digit_batch": DIGIT_BATCH}
rec(stage="recipe", **recipe)
pools = latent_pools(pipe.vae, recipe.pop("pool_seed"), recipe.pop("number_repeats"))
set_latent_statistics(pipe.vae, torch.cat([pools[t][0].flatten() for t in ("digit", "number")]))
def measure_now(step, p):
    if step % 1000: return
    proc = p.transformer.attn_processors
    p.transformer.set_attn_processor(JointAttnProcessor2_0())
    for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.eval()
    rec(stage="flow", step=step, **{f"{t}_cfg1": sample_accuracy(p, clf, eng, t, EVAL["per_prompt"][t], 1.0, EVAL["seed"])
                                    for t in ("digit", "number")})
    p.transformer.set_attn_processor(proc)
    for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.train()
train_flow(pipe, pools, log=lambda line: None, callback=measure_now, **recipe)
