import torch, time, sys
torch.set_num_threads(1)
from integrations.testbed.mnist_sd3.build import build_pipeline
from integrations.testbed.mnist_sd3 import train as T
from integrations.testbed.checkpoints import load_pretrained
from rapidocr_onnxruntime import RapidOCR
from diffusers.models.attention_processor import JointAttnProcessor2_0
p = build_pipeline(0)
p.vae.load_state_dict(torch.load("/tmp/vae_400.pt")); p.vae.eval()
clf = load_pretrained("classifier"); eng = RapidOCR()
def cb(step, pipe):
    if step % 250 == 0:
        proc = pipe.transformer.attn_processors
        for m in (pipe.transformer, pipe.text_encoder, pipe.text_encoder_2): m.eval()
        pipe.transformer.set_attn_processor(JointAttnProcessor2_0())
        t = time.time()
        res = {f"{task}_cfg{g}": T.sample_accuracy(pipe, clf, eng, task, per_prompt=2 if task == "digit" else 1, guidance_scale=g, seed=5, num_steps=10)
               for task in ("digit", "number") for g in (1.0, 4.0)}
        print(step, res, f"eval {time.time()-t:.0f}s", flush=True)
        torch.save({k: getattr(pipe, k).state_dict() for k in ("transformer", "text_encoder", "text_encoder_2")}, f"/tmp/flowF_{step}.pt")
        torch.save(dict(pipe.vae.config), "/tmp/flowF_vaeconfig.pt")
        pipe.transformer.set_attn_processor(proc)
        for m in (pipe.transformer, pipe.text_encoder, pipe.text_encoder_2): m.train()
recipe = dict(T.FLOW_RECIPE, steps=4000)
T.flow_stage(p, callback=cb, **recipe)
