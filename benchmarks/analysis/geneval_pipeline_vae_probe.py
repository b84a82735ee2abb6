"""Probe: does MNIST-SD3's shipped VAE (trained on 32x32 tinted digits and number windows) carry GenEval compositions
(64x64, digits scaled 22-34 px)? GenEval overall (reward detector and judge) on exact renderings vs VAE round trips,
and the cost of one rectified-flow step of the MNIST-SD3 transformer at 16x16 latents.
Usage: python -m vgrpo_lib.benchmarks.analysis.geneval_pipeline_vae_probe > results/mnist-sd3-geneval-pipeline/vae_probe.log
"""

from __future__ import annotations

import sys
import json, time, torch
from diffusers import StableDiffusion3Pipeline
from vgrpo_lib.integrations.packed_weights import unpacked_folder
from vgrpo_lib.integrations.testbed.mnist_sd3.build import PIPELINE_DIR
from vgrpo_lib.integrations.testbed.mnist_sd3.train import encode_moments, decode
from vgrpo_lib.integrations.testbed.geneval_digits.compositions import compose
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import geneval_specs
from vgrpo_lib.integrations.testbed.geneval_digits.reward import geneval_digits_table

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(1)
    pipe = StableDiffusion3Pipeline.from_pretrained(unpacked_folder(PIPELINE_DIR), torch_dtype=torch.float32)
    specs = [s for s in geneval_specs("eval") for _ in range(2)]
    comp = compose(specs, "eval", torch.Generator().manual_seed(0))
    means, stds = encode_moments(pipe.vae, comp.images)
    recon = decode(pipe.vae, (means - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor)
    print(json.dumps({"images": len(specs), "latent_mean": means.mean().item(), "latent_std": means.std().item(),
                      "pixel_mae": (recon - comp.images).abs().mean().item(),
                      "exact": geneval_digits_table(comp.images, specs), "round_trip": geneval_digits_table(recon, specs)}))
    z = torch.randn(32, 4, 16, 16)
    embeds, _, pooled, _ = pipe.encode_prompt(["a red 3 and a blue 8"] * 32, None, None, do_classifier_free_guidance=False, max_sequence_length=0)
    embeds, pooled = embeds.detach(), pooled.detach()
    params = list(pipe.transformer.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4)
    for i in range(6):
        if i == 1: t0 = time.perf_counter()
        v = pipe.transformer(hidden_states=z, timestep=torch.full((32,), 500.0), encoder_hidden_states=embeds, pooled_projections=pooled, return_dict=False)[0]
        loss = v.pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
    print(json.dumps({"flow_step_s_batch32_16x16_1thread": (time.perf_counter() - t0) / 5}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
