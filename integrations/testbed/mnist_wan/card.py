"""The MNIST-Wan model card: ``describe`` gathers the measured facts, ``model_card`` writes the README."""

from __future__ import annotations

import os

import torch

from .build import FLOW_SHIFT, TEXT_LENGTH
from .prompts import motion_prompts
from .render import DIRECTIONS, FRAME_SIZE, FRAMES, SPEED

__all__ = ["REBUILD_COMMAND", "COMPONENTS", "describe", "model_card"]

REBUILD_COMMAND = "python -m vgrpo_lib.integrations.testbed.mnist_wan.train --work runs/mnist_wan"
COMPONENTS = ("transformer", "vae", "text_encoder")


def describe(pipe, metrics: dict, vae_recipe: dict, flow_recipe: dict, evaluation: dict, seconds: dict) -> dict:
    """The card as plain data: component classes and sizes, recipes, evaluation settings, timings, metrics."""
    return {
        "components": {name: {"class": type(getattr(pipe, name)).__name__,
                              "parameters": sum(p.numel() for p in getattr(pipe, name).parameters())}
                       for name in COMPONENTS},
        "tokenizer_vocabulary": len(pipe.tokenizer), "text_length": TEXT_LENGTH, "flow_shift": FLOW_SHIFT,
        "clip": {"frames": FRAMES, "size": list(FRAME_SIZE), "speed_px_per_frame": SPEED, "directions": DIRECTIONS},
        "vae_latent_statistics": {"latents_mean": pipe.vae.config.latents_mean,
                                  "latents_std": pipe.vae.config.latents_std},
        "vae_recipe": vae_recipe, "flow_recipe": flow_recipe, "evaluation": evaluation,
        "seconds": seconds, "torch_threads": torch.get_num_threads(), "load_average_at_end": os.getloadavg(),
        "metrics": metrics,
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def model_card(card: dict) -> str:
    """The README.md of the shipped folder, every number taken from ``card``."""
    m, ev, vr, fr = card["metrics"], card["evaluation"], card["vae_recipe"], card["flow_recipe"]
    sizes = "\n".join(f"| `{name}` | `{c['class']}` | {c['parameters'] / 1e6:.2f}M |"
                      for name, c in card["components"].items())
    rows = "\n".join(
        f"| {scale:g} | {c['reward_mean']:.3f} | {_pct(c['digit_accuracy'])} | {_pct(c['direction_accuracy'])} | "
        f"{_pct(c['both_accuracy'])} | {_pct(c['judge_digit_accuracy'])} | {_pct(c['judge_direction_accuracy'])} | "
        f"{_pct(c['judge_both_accuracy'])} |" for scale in ev["guidance_scales"] for c in [m[f"cfg{scale:g}"]])
    vae = m["vae_round_trip"]
    clip = card["clip"]
    return f"""# MNIST-Wan: a `WanPipeline` trained on moving MNIST digits on one CPU core

Every component is the real diffusers / transformers class in a small config, stored in float16 with
`save_pretrained` (safetensors, {card['folder_bytes'] / 1e6:.1f} MB in all, shipped packed: byte planes and xz). Built and measured by
`{REBUILD_COMMAND}` (resumable; code: `integrations/testbed/mnist_wan/`).

```python
import torch
from diffusers import WanPipeline
from vgrpo_lib.integrations.packed_weights import unpacked_folder
folder = unpacked_folder("integrations/testbed/checkpoints/mnist_wan")  # the plain folder, unpacked once into a cache
pipe = WanPipeline.from_pretrained(folder, dtype=torch.float32)
clip = pipe("a 3 moving left", height=32, width=32, num_frames={clip['frames']}, num_inference_steps=20,
            guidance_scale=4.0, max_sequence_length={card['text_length']}, output_type="pt").frames  # (1, F, 3, H, W)
```

## Components
| folder | class | parameters |
|---|---|---|
{sizes}

- Tokenizer: a word-level `T5TokenizerFast` (unigram, as UMT5's) built in code from the prompt vocabulary
  ({card['tokenizer_vocabulary']} pieces); prompts are read as {card['text_length']} tokens: pass
  `max_sequence_length={card['text_length']}` (the transformer was trained with exactly that many text tokens).
- Scheduler: `UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
  flow_shift={card['flow_shift']})`, Wan's own.
- VAE: the causal 3-D `AutoencoderKLWan` with two down stages (4x space, 4x time; {clip['frames']} frames of
  {clip['size'][0]}x{clip['size'][1]} -> 16 x 3 x 8 x 8), `latents_mean` / `latents_std` per channel from the
  training latents, as Wan sets them.

## Data and training ({card['torch_threads']} torch thread)
Clips: a real MNIST-5k `train` digit, white on black, moving {clip['speed_px_per_frame']} pixel per frame
{', '.join(clip['directions'])}; prompts such as "a 3 moving left" ({len(motion_prompts('train'))} `train` prompts;
the {len(motion_prompts('eval'))} `eval` prompts are held-out phrasings).
- VAE: {vr['steps']} AdamW steps of {vr['batch_size']} fresh clips, L1 + MSE + {vr['kl']:g} KL, lr {vr['lr']:g}.
- Transformer and UMT5 encoder jointly from scratch by rectified flow in the scheduler's conventions
  (`x_t = (1 - t) x + t eps`, target `eps - x`, `timestep = 1000 t`, `t` logit-normal): {fr['steps']} AdamW steps
  of {fr['batch_size']} (lr {fr['lr']:g}, constant after {fr['warmup']} warmup steps); caption dropout to `""`
  with probability {fr['p_uncond']}.
- Seconds: {card['seconds']}.

## Measured
- VAE round trip on 200 held-out MNIST `eval` clips: digit accuracy {_pct(vae['reconstruction_digit_accuracy'])}
  (originals {_pct(vae['original_digit_accuracy'])}), centre-of-mass direction accuracy
  {_pct(vae['reconstruction_direction_accuracy'])} (originals {_pct(vae['original_direction_accuracy'])}).
- Samples on the held-out prompts ({ev['per_prompt']} per prompt), {ev['num_steps']} UniPC steps, noise seed
  {ev['seed']}. Reward: the `motion` reward (the testbed classifier's frame-mean probability of the prompted digit
  times the centre-of-mass velocity along the prompted direction, clipped to [0, 1]). Digit: the class
  probabilities averaged over the frames' 28x28 windows around the ink's centre of mass (the testbed classifier,
  a CNN); direction: the least-squares velocity of the ink's centre of mass, nearest of the four directions.
  Judge (never a reward): the MLP judge trained on a disjoint split, majority over the frames, and block
  matching (the one-pixel shift that best predicts each next frame) for the direction.

| guidance | reward | digit | direction | both | judge digit | judge direction | judge both |
|---|---|---|---|---|---|---|---|
{rows}

Raw numbers: `card.json` in this folder.
"""
