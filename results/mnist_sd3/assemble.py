"""Assemble the shipped folder from the pilot's snapshots (VAE step 400, flow step K), measure, save."""
import sys, time, torch
torch.set_num_threads(1)
from rapidocr_onnxruntime import RapidOCR
from integrations.testbed.checkpoints import load_pretrained
from integrations.testbed.mnist_sd3.build import build_pipeline
from integrations.testbed.mnist_sd3 import train as T
from integrations.testbed.mnist_sd3.card import describe
k = int(sys.argv[1]); vae_s = float(sys.argv[2]); flow_s = float(sys.argv[3])
pipe = build_pipeline(0)
pipe.vae.load_state_dict(torch.load("/tmp/vae_400.pt"))
cfg = torch.load("/tmp/flowF_vaeconfig.pt")
pipe.vae.register_to_config(shift_factor=cfg["shift_factor"], scaling_factor=cfg["scaling_factor"])
for name, state in torch.load(f"/tmp/flowF_{k}.pt").items():
    getattr(pipe, name).load_state_dict(state)
for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2): m.eval()
t = time.time()
metrics = T.measure(pipe, load_pretrained("classifier"), RapidOCR())
eval_s = time.time() - t
print(metrics, eval_s, flush=True)
note = ("Wall times of the pilot runs that produced these weights (the same computation as the rebuild: constant "
        "learning rates after warmup, so step k of the pilot IS a run of k steps), INCLUDING the pilots' periodic "
        f"evaluations (VAE every 100 steps, flow every 250 steps), on a 2-core machine shared with 5 other jobs "
        f"(load average 8-11); the measurements below took {eval_s / 60:.1f} min.")
card = describe(pipe, metrics, T.VAE_RECIPE, dict(T.FLOW_RECIPE, steps=k),
                {"vae_s": round(vae_s), "train_s": round(vae_s + flow_s), "total_s": round(vae_s + flow_s + eval_s), "note": note})
T.save_pipeline(pipe, card)
print(card, flush=True)
