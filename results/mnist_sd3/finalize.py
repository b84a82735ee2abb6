import sys, json, time, torch
from rapidocr_onnxruntime import RapidOCR
from integrations.testbed.checkpoints import load_pretrained
from integrations.testbed.mnist_sd3.build import build_pipeline
from integrations.testbed.mnist_sd3.card import describe
from integrations.testbed.mnist_sd3.train import VAE_RECIPE, FLOW_RECIPE, measure, save_pipeline
step = int(sys.argv[1]); save = len(sys.argv) > 2
pipe = build_pipeline(seed=0)
state = torch.load(f"/tmp/s/flow_{step}.pt")
for k, v in state.items(): getattr(pipe, k).load_state_dict(v)
pipe.vae.register_to_config(shift_factor=0.1671, scaling_factor=0.6037)
for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2): m.eval()
t = time.perf_counter()
metrics = measure(pipe, load_pretrained("classifier"), RapidOCR())
print(json.dumps({k: v for k, v in metrics.items() if k != "vae_round_trip"}), time.perf_counter() - t, flush=True)
json.dump(metrics, open(f"/tmp/s/measure_{step}.json", "w"), indent=1)
if save:
    note = ("Wall times of the pilot run that produced these weights (`results/mnist_sd3/pilot.py`: the rebuild's computation, the same seeds, "
            "recipes and code, at 2 torch threads), INCLUDING its periodic evaluations (VAE every 200 steps, flow every 500 "
            "steps, about 40 s each), on the 2-core machine with another job beside it at times; the flow weights are its "
            f"step-{step} snapshot. Measuring the card's numbers took {(time.perf_counter() - t) / 60:.1f} min.")
    card = describe(pipe, metrics, VAE_RECIPE, {**FLOW_RECIPE, "steps": step},
                    {"vae_s": 224, "train_s": 1520, "total_s": 1520, "note": note})
    save_pipeline(pipe, card)
