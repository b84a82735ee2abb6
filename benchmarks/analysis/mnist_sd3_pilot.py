"""Pilot for the MNIST-SD3 rebuild: VAE 1200 steps (per-tint round trip every 200), then flow with evals every 500."""

from __future__ import annotations

import json, time, torch, sys
from vgrpo_lib.integrations.rewards.simple import ocr_engine
from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained
from vgrpo_lib.integrations.testbed.data import load_mnist
from vgrpo_lib.integrations.testbed.mnist_sd3.build import build_pipeline
from vgrpo_lib.integrations.testbed.mnist_sd3.render import TINT_NAMES
from vgrpo_lib.integrations.testbed.mnist_sd3.train import (round_trip_accuracy, train_vae, latent_pools, set_latent_statistics,
    train_flow, sample_accuracy, encode_moments)
from vgrpo_lib.integrations.testbed.mnist_sd3.train import MultiplicityAttnProcessor
from diffusers.models.attention_processor import JointAttnProcessor2_0

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(2)
    VAE_STEPS, FLOW_STEPS = int(argv[1]), int(argv[2])
    clf = load_pretrained("classifier"); eng = ocr_engine()
    clf = load_pretrained("classifier"); eng = ocr_engine()
    d, l = load_mnist("eval"); d, l = d[:200], l[:200]
    d, l = load_mnist("eval"); d, l = d[:200], l[:200]
    log = open("/tmp/s/pilot.jsonl", "a")
    def rec(**kw):
        kw["time"] = round(time.perf_counter() - T0); print(json.dumps(kw), flush=True); log.write(json.dumps(kw) + "\n"); log.flush()
    T0 = time.perf_counter()
    pipe = build_pipeline(seed=0)
    def vae_cb(step, vae):
        if step % 200 == 0:
            vae.eval()
            m, _ = encode_moments(vae, torch.rand(8, 3, 32, 32))
            vae.register_to_config(shift_factor=0.0, scaling_factor=1.0)
            r = {n: round(round_trip_accuracy(vae, clf, d, l, torch.full_like(l, i))["ratio"], 3) for i, n in enumerate(TINT_NAMES)}
            rec(stage="vae", step=step, ratios=r)
            torch.save(vae.state_dict(), f"/tmp/s/vae_{step}.pt")
            vae.train()
    train_vae(pipe.vae, steps=VAE_STEPS, batch_size=32, lr=2e-3, kl=1e-6, seed=100, log=print, callback=vae_cb)
    pools = latent_pools(pipe.vae, 201, 2)
    set_latent_statistics(pipe.vae, torch.cat([pools[t][0].flatten() for t in ("digit", "number")]))
    rec(stage="pools", shift=pipe.vae.config.shift_factor, scale=pipe.vae.config.scaling_factor)
    def flow_cb(step, p):
        if step % 500 == 0:
            proc = p.transformer.attn_processors
            p.transformer.set_attn_processor(JointAttnProcessor2_0())
            for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.eval()
            accs = {"digit_cfg1": sample_accuracy(p, clf, eng, "digit", 2, 1.0, 1234),
                    "number_cfg1": sample_accuracy(p, clf, eng, "number", 1, 1.0, 1234),
                    "number_cfg4": sample_accuracy(p, clf, eng, "number", 1, 4.0, 1234)}
            rec(stage="flow", step=step, **accs)
            torch.save({k: getattr(p, k).state_dict() for k in ("transformer", "text_encoder", "text_encoder_2", "vae")}, f"/tmp/s/flow_{step}.pt")
            p.transformer.set_attn_processor(proc)
            for m in (p.transformer, p.text_encoder, p.text_encoder_2): m.train()
    train_flow(pipe, pools, steps=FLOW_STEPS, digit_batch=64, number_batch=32, number_share=0.7, lr=1e-3, warmup=100,
               p_uncond=0.1, seed=200, log=print, callback=flow_cb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
