"""The MNIST-SD3 model card: ``describe`` gathers the measured facts, ``model_card`` writes the README."""

from __future__ import annotations

import os

import torch

from .build import CLIP_LENGTH, SCHEDULER_SHIFT, T5_TOKENS

__all__ = ["REBUILD_COMMAND", "COMPONENTS", "describe", "model_card"]

REBUILD_COMMAND = "python -m vgrpo_lib.integrations.testbed.pretrain mnist_sd3"
COMPONENTS = ("transformer", "vae", "text_encoder", "text_encoder_2")


def describe(pipe, metrics: dict, vae_recipe: dict, flow_recipe: dict, seconds: dict) -> dict:
    """The card as plain data: component classes and sizes, recipes, evaluation settings, timings, metrics."""
    from .train import EVAL

    return {
        "components": {name: {"class": type(getattr(pipe, name)).__name__,
                              "parameters": sum(p.numel() for p in getattr(pipe, name).parameters())}
                       for name in COMPONENTS},
        "tokenizer_vocabulary": len(pipe.tokenizer), "clip_length": CLIP_LENGTH,
        "scheduler_shift": SCHEDULER_SHIFT, "t5_tokens": T5_TOKENS,
        "vae_latent_statistics": {"shift_factor": pipe.vae.config.shift_factor,
                                  "scaling_factor": pipe.vae.config.scaling_factor},
        "vae_recipe": vae_recipe, "flow_recipe": flow_recipe, "evaluation": EVAL,
        "seconds": seconds, "torch_threads": torch.get_num_threads(), "load_average_at_end": os.getloadavg(),
        "metrics": metrics,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def model_card(card: dict) -> str:
    """The README.md of the shipped folder, every number taken from ``card``."""
    m, ev = card["metrics"], card["evaluation"]
    sizes = "\n".join(f"| `{name}` | `{c['class']}` | {c['parameters'] / 1e6:.2f}M |"
                      for name, c in card["components"].items())
    vae = m["vae_round_trip"]
    tints = ", ".join(f"{name} {_pct(r['ratio'])}" for name, r in vae["per_tint"].items())
    rows = "\n".join(
        f"| {task} | {_pct(m[f'{task}/cfg1'])} | {_pct(m[f'{task}/cfg4'])} | {_pct(m[f'{task}/cfg1/t5_tokens256'])} |"
        for task in ("digit", "number"))
    s = card["seconds"]
    return f"""# MNIST-SD3: a `StableDiffusion3Pipeline` trained on MNIST on two CPU cores

Every component is the real diffusers / transformers class in a small config, stored in float16 with
`save_pretrained` (safetensors, {card['folder_bytes'] / 1e6:.1f} MB in all, shipped packed: byte planes and xz). Built and measured by
`{REBUILD_COMMAND}` (code: `integrations/testbed/mnist_sd3/`).

```python
import torch
from diffusers import StableDiffusion3Pipeline
from vgrpo_lib.integrations.packed_weights import unpacked_folder
folder = unpacked_folder("integrations/testbed/checkpoints/mnist_sd3")  # the plain folder, unpacked once into a cache
# dtype= as diffusers 0.42 names it (older releases: torch_dtype=)
pipe = StableDiffusion3Pipeline.from_pretrained(folder, dtype=torch.float32)
image = pipe("the number 42", height=32, width=96, num_inference_steps=20, guidance_scale=4.0).images[0]
# the same conditioning, cheaper: no T5 and no zero tokens (what the `mnist-sd3` preset does)
pipe = StableDiffusion3Pipeline.from_pretrained(folder, text_encoder_3=None, tokenizer_3=None, dtype=torch.float32)
image = pipe("the number 42", height=32, width=96, num_inference_steps=20, guidance_scale=4.0,
             max_sequence_length={card['t5_tokens']}).images[0]
```

## Components
| folder | class | parameters |
|---|---|---|
{sizes}

- Tokenizers: two word-level `CLIPTokenizer`s built in code from the prompt vocabulary
  ({card['tokenizer_vocabulary']} tokens; numerals go digit by digit), {card['clip_length']} tokens per prompt.
- T5: SD3's T5-free conditioning, `max_sequence_length` zero tokens after the CLIP tokens. The folder's
  `text_encoder_3` is a null `T5EncoderModel` (every weight zero, 9k parameters; `tokenizer_3` is T5's with
  its four special tokens), so a plain `from_pretrained` loads and its output is exactly those zero tokens;
  loading with `text_encoder_3=None, tokenizer_3=None` gives the same conditioning without running it. The
  transformer was trained with no zero tokens (`max_sequence_length={card['t5_tokens']}`, the cheap call the
  `mnist-sd3` preset makes) and with the pipeline's default 256 (one token counted 256 times in the
  attention, which is exact), so both calls are in-distribution; other counts were not trained.
- Scheduler: `FlowMatchEulerDiscreteScheduler(shift={card['scheduler_shift']})` (no shift: 8x8 to 8x24 latents
  are far below the 1024-pixel resolution SD3's shift 3 is set for).
- VAE: 4x downsampling, 4 latent channels (32x32 -> 4x8x8, 32x96 -> 4x8x24), `shift_factor`
  {card['vae_latent_statistics']['shift_factor']}, `scaling_factor` {card['vae_latent_statistics']['scaling_factor']}
  (mean and 1/std of the training latents, as SD3 sets them).

## Training ({s['total_s'] / 60:.1f} minutes in all, {card['torch_threads']} torch threads, on a 2-core machine)
{s.get('note', '')}
- VAE ({s['vae_s'] / 60:.1f} min): {card['vae_recipe']['steps']} AdamW steps of {card['vae_recipe']['batch_size']}
  MNIST-5k `train` digits rendered 32x32 in five tints (white, red, green, blue, yellow), half whole digits, half
  32x32 windows of rendered numbers; L1 + MSE + {card['vae_recipe']['kl']:g} KL; lr {card['vae_recipe']['lr']:g}.
- Transformer and both CLIP text encoders (the text-encoder choice: trained, not frozen) trained jointly from scratch by rectified flow in the scheduler's
  conventions (`x_t = (1 - t) x + t eps`, target `eps - x`, `timestep = 1000 t`, `t` logit-normal):
  {card['flow_recipe']['steps']} AdamW steps (lr {card['flow_recipe']['lr']:g}, constant after
  {card['flow_recipe']['warmup']} warmup steps), each a batch of one task: {card['flow_recipe']['digit_batch']} white
  digits (the 50 `train` phrasings) or {card['flow_recipe']['number_batch']} white numbers (the 882 `train`
  numbers, each in {card['flow_recipe']['number_repeats']} handwritings), numbers with probability
  {card['flow_recipe']['number_share']}; caption dropout to `""` with probability {card['flow_recipe']['p_uncond']}.
  The number of steps: a pilot evaluated every 500 steps; the numbers' CFG-free accuracy was still rising at the
  end while the digits' had passed 75%, and the last step was kept for the OCR task's sake (its CFG-free
  accuracy is the lowest of both tasks; see the table).

## Measured
- VAE round trip on the 500 held-out MNIST `eval` digits, the testbed digit classifier's accuracy on
  reconstructions relative to the originals: white {_pct(vae['white']['ratio'])}
  ({_pct(vae['white']['reconstruction_accuracy'])} vs {_pct(vae['white']['original_accuracy'])}); per tint: {tints}.
- OCR ceiling: rapidocr (recognition only, on the inverted, 2x upscaled image) reads
  {_pct(m['ocr_ceiling_real_numbers'])} of REAL handwritten MNIST numbers (the eval numbers drawn with eval
  digits) exactly; no generator can score higher on the number task.
- Samples on the held-out prompts ({ev['per_prompt']['digit']} per digit prompt x 30, {ev['per_prompt']['number']} per
  number x 108), {ev['num_steps']} Euler steps, noise seed {ev['seed']}; digit: the testbed classifier reads the
  prompted digit; number: rapidocr's reading equals the prompted number exactly.

| task | CFG-free | CFG 4 | CFG-free, the default `max_sequence_length=256` |
|---|---|---|---|
{rows}

Raw numbers: `card.json` in this folder.
"""
