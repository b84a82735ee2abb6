"""MNIST-SD3-GenEval: a second shipped ``StableDiffusion3Pipeline`` that draws GenEval's digit compositions.

The MNIST-SD3 architecture (``mnist_sd3.build.build_pipeline``: the same CLIP-L/G, VAE and transformer
configs) with GenEval's prompt vocabulary (``VOCABULARY``) and a ``CANVAS`` x ``CANVAS`` canvas (16x16
latents, 64 image tokens), trained from scratch by MNIST-SD3's own code on the synthetic compositions of
``compositions.compose`` (MNIST-5k ``"train"`` digits, tinted, scaled, placed so that every spec holds) in the
``LAYOUT`` layout: ``"slots"``, each object in its own cell of a 2x2 grid at MNIST-SD3's digit scale, the cell
given by the prompt (mention order; a position prompt's pair where its relation says), as MNIST-SD3's numbers sit
in fixed slots. The pilots' ``"free"`` layout (anywhere at any scale, 8,000 steps) and ``"cells"`` layout (random
cells, 3,000 steps) did not learn the prompts: their samples spread one object over several cells or leave the
canvas empty (``results/mnist-sd3-geneval-pipeline/``):

1. VAE (``mnist_sd3.train.train_vae``) on compositions of random ``"train"`` specs, every category equally often,
   stroke pixels weighted 10x in the loss (``reconstruction_loss``: unweighted, the sparse strokes' colours are lost).
2. Flow (``mnist_sd3.train.rectified_flow``): a pool of compositions (``composition_pool``: every ``"train"``
   spec rendered until each category has about ``pool_per_category`` images) is encoded once, the VAE's
   latent statistics are set from it, and every batch draws its samples' categories uniformly, so the six
   GenEval categories train equally (the prompt lists are 77% colour attribution).

Rebuild: ``python -m vgrpo_lib.integrations.testbed.pretrain mnist_sd3_geneval`` (writes ``PIPELINE_DIR`` with its card).
The shipped folder loads with ``StableDiffusion3Pipeline.from_pretrained(unpacked_folder(PIPELINE_DIR))`` (its weights
ship packed: :mod:`vgrpo_lib.integrations.packed_weights`).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import torch

from vgrpo_lib.integrations.rewards.geneval import GENEVAL_TAGS
from vgrpo_lib.integrations.testbed.mnist_sd3.build import CLIP_LENGTH, build_pipeline
from vgrpo_lib.integrations.testbed.mnist_sd3.card import COMPONENTS
from vgrpo_lib.integrations.testbed.mnist_sd3.train import (PIPELINE_DEFAULT_T5_TOKENS, decode, encode_moments, rectified_flow,
                                                  save_pipeline, set_latent_statistics, train_vae)

from .compositions import CANVAS, compose
from .prompts import geneval_specs

__all__ = [
    "PIPELINE_DIR", "IMAGE_SIZE", "REBUILD_COMMAND", "LAYOUT", "VAE_RECIPE", "FLOW_RECIPE", "EVAL", "VOCABULARY",
    "build_geneval_pipeline", "composition_batches", "composition_pool", "pool_batches", "flow_stage",
    "sample_compositions", "measure", "describe", "model_card", "pretrain_geneval_pipeline",
]

PIPELINE_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "mnist_sd3_geneval"
IMAGE_SIZE = (CANVAS, CANVAS)
REBUILD_COMMAND = "python -m vgrpo_lib.integrations.testbed.pretrain mnist_sd3_geneval"
LAYOUT = "slots"

VAE_RECIPE = dict(steps=1000, batch_size=16, lr=2e-3, kl=1e-6, ink_weight=10.0, seed=110)
FLOW_RECIPE = dict(steps=5000, batch_size=32, lr=1e-3, warmup=100, p_uncond=0.1, seed=210, pool_seed=211,
                   pool_per_category=1000)
EVAL = dict(seed=1234, num_steps=20, guidance_scales=(1.0, 4.0), per_prompt=1)
"""The card's sample evaluation: every held-out (``"eval"``) spec ``per_prompt`` times, 20 Euler steps."""


def _vocabulary() -> tuple[str, ...]:
    words = {w for spec in geneval_specs("all") for w in re.findall("[a-z]+", spec["prompt"])}
    return tuple(sorted(words))


VOCABULARY = _vocabulary()
"""Every word of every GenEval digit prompt: one CLIP token each (digits go by character, "4s" is 4, s)."""


def build_geneval_pipeline(seed: int = 0):
    """The untrained pipeline: MNIST-SD3's configs with ``VOCABULARY`` and the ``IMAGE_SIZE`` canvas. A ValueError
    names the limit if a GenEval digit prompt would not fit ``CLIP_LENGTH`` tokens (it would be cut silently)."""
    pipe = build_pipeline(seed, vocabulary=VOCABULARY, image_sizes=(IMAGE_SIZE,))
    longest = max(len(pipe.tokenizer(spec["prompt"]).input_ids) for spec in geneval_specs("all"))
    if longest > CLIP_LENGTH:
        raise ValueError(f"a GenEval digit prompt takes {longest} CLIP tokens; CLIP_LENGTH is {CLIP_LENGTH}")
    return pipe


def _train_specs_by_category() -> list[list[dict]]:
    return [geneval_specs("train", (tag,)) for tag in GENEVAL_TAGS]


def composition_batches(batch_size: int, generator: torch.Generator):
    """Endless VAE batches ``(batch_size, 3, CANVAS, CANVAS)`` in [0, 1]: compositions of ``"train"`` specs in
    ``LAYOUT``, each sample's category uniform over GenEval's six."""
    categories = _train_specs_by_category()
    while True:
        tags = torch.randint(len(categories), (batch_size,), generator=generator).tolist()
        picks = torch.rand(batch_size, generator=generator).tolist()
        specs = [categories[c][int(u * len(categories[c]))] for c, u in zip(tags, picks)]
        yield compose(specs, "train", generator, layout=LAYOUT).images


def composition_pool(vae, seed: int, per_category: int) -> dict:
    """The flow's training latents: every ``"train"`` spec rendered in ``LAYOUT``
    ``ceil(per_category / specs in its category)`` times (fresh digits, colours and places each time), encoded once.

    Returns ``{"means", "stds"}`` (N, 4, 16, 16) unscaled posterior moments, ``"prompts"`` (N) and ``"category"``
    (N,) int64 index into GENEVAL_TAGS."""
    generator = torch.Generator().manual_seed(seed)
    specs = [s for members in _train_specs_by_category()
             for s in members for _ in range(math.ceil(per_category / len(members)))]
    images = torch.cat([compose(chunk, "train", generator, layout=LAYOUT).images for chunk in _chunks(specs, 500)])
    means, stds = encode_moments(vae, images)
    return {"means": means, "stds": stds, "prompts": [s["prompt"] for s in specs],
            "category": torch.tensor([GENEVAL_TAGS.index(s["tag"]) for s in specs])}


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def pool_batches(pool: dict, batch_size: int, scale: float, shift: float):
    """``rectified_flow``'s source on ``pool``: each sample's category uniform, then a pool item of it."""
    members = [torch.nonzero(pool["category"] == c)[:, 0] for c in range(len(GENEVAL_TAGS))]
    counts = torch.tensor([len(m) for m in members])
    table = torch.nn.utils.rnn.pad_sequence(members, batch_first=True)

    def batches(gen: torch.Generator):
        while True:
            category = torch.randint(len(members), (batch_size,), generator=gen)
            idx = table[category, (torch.rand(batch_size, generator=gen) * counts[category]).long()]
            means = pool["means"][idx]
            z = (means + pool["stds"][idx] * torch.randn(means.shape, generator=gen) - shift) * scale
            yield "compositions", z, [pool["prompts"][i] for i in idx.tolist()]

    return batches


def flow_stage(pipe, *, pool_seed: int, pool_per_category: int, batch_size: int, log=print, **recipe) -> None:
    """After the VAE: encode the pool, set the VAE's latent statistics from it, train the flow."""
    start = time.perf_counter()
    pool = composition_pool(pipe.vae, pool_seed, pool_per_category)
    set_latent_statistics(pipe.vae, pool["means"].flatten())
    log(f"{len(pool['prompts'])} compositions encoded ({time.perf_counter() - start:.0f} s); shift_factor "
        f"{pipe.vae.config.shift_factor}, scaling_factor {pipe.vae.config.scaling_factor}")
    batches = pool_batches(pool, batch_size, pipe.vae.config.scaling_factor, pipe.vae.config.shift_factor)
    rectified_flow(pipe, batches, log=log, **recipe)


@torch.no_grad()
def sample_compositions(pipe, specs: list[dict], guidance_scale: float, seed: int, num_steps: int = 20,
                        max_sequence_length: int = 0, batch: int = 128) -> torch.Tensor:
    """The pipeline's images ``(N, 3, CANVAS, CANVAS)`` in [0, 1] for the specs' prompts, noise from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    pipe.set_progress_bar_config(disable=True)
    prompts = [s["prompt"] for s in specs]
    return torch.cat([pipe(chunk, height=CANVAS, width=CANVAS, num_inference_steps=num_steps,
                           guidance_scale=guidance_scale, generator=gen, max_sequence_length=max_sequence_length,
                           output_type="pt").images for chunk in _chunks(prompts, batch)])


def measure(pipe, scorers: dict | None = None) -> dict:
    """The card's numbers: GenEval's table (reward detector and judge) of the VAE round trip of held-out
    compositions (in ``LAYOUT``) beside the exact renderings, and of the pipeline's samples per guidance scale."""
    from .reward import geneval_digits_table

    specs = [s for s in geneval_specs("eval") for _ in range(EVAL["per_prompt"])]
    exact = compose(specs, "eval", torch.Generator().manual_seed(EVAL["seed"]), layout=LAYOUT).images
    means, _ = encode_moments(pipe.vae, exact)
    recon = decode(pipe.vae, (means - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor)
    out = {"renderings": geneval_digits_table(exact, specs, scorers),
           "vae_round_trip": geneval_digits_table(recon, specs, scorers)}
    for scale in EVAL["guidance_scales"]:
        images = sample_compositions(pipe, specs, scale, EVAL["seed"], EVAL["num_steps"])
        out[f"cfg{scale:g}"] = geneval_digits_table(images, specs, scorers)
    images = sample_compositions(pipe, specs, 1.0, EVAL["seed"], EVAL["num_steps"], PIPELINE_DEFAULT_T5_TOKENS)
    out["cfg1/t5_tokens256"] = geneval_digits_table(images, specs, scorers)
    return out


def describe(pipe, metrics: dict, vae_recipe: dict, flow_recipe: dict, seconds: dict) -> dict:
    """The card as plain data (MNIST-SD3's fields, with this pipeline's evaluation and vocabulary)."""
    return {"components": {name: {"class": type(getattr(pipe, name)).__name__,
                                  "parameters": sum(p.numel() for p in getattr(pipe, name).parameters())}
                           for name in COMPONENTS},
            "tokenizer_vocabulary": len(pipe.tokenizer), "clip_length": CLIP_LENGTH, "canvas": CANVAS, "layout": LAYOUT,
            "vae_latent_statistics": {"shift_factor": pipe.vae.config.shift_factor,
                                      "scaling_factor": pipe.vae.config.scaling_factor},
            "vae_recipe": vae_recipe, "flow_recipe": flow_recipe, "evaluation": EVAL, "seconds": seconds,
            "torch_threads": torch.get_num_threads(), "metrics": metrics}


def _table_row(name: str, table: dict) -> str:
    return f"| {name} | " + " | ".join(f"{table[k]:.3f}" for k in (*GENEVAL_TAGS, "overall")) + " |"


def model_card(card: dict) -> str:
    """The README.md of the shipped folder, every number taken from ``card``."""
    m, s, flow = card["metrics"], card["seconds"], card["flow_recipe"]
    rows = [_table_row(f"{label}, {reader}", m[key][reader])
            for key, label in (("renderings", "exact renderings"), ("vae_round_trip", "VAE round trip"),
                               ("cfg1", "samples, CFG-free"), ("cfg4", "samples, CFG 4"),
                               ("cfg1/t5_tokens256", "samples, CFG-free, 256 zero tokens"))
            for reader in ("detector", "judge")]
    return f"""# MNIST-SD3-GenEval: a `StableDiffusion3Pipeline` that draws GenEval's prompts with digits

MNIST-SD3's architecture (see `../mnist_sd3/README.md`) with GenEval's prompt vocabulary
({card['tokenizer_vocabulary']} tokens, {card['clip_length']} per prompt) on a {card['canvas']}x{card['canvas']}
canvas, trained from scratch on synthetic compositions of MNIST-5k `train` digits (tinted, scaled, placed so
that each GenEval spec holds; layout `{card['layout']}`). Built and measured by `{REBUILD_COMMAND}` (code:
`integrations/testbed/geneval_digits/pipeline.py`); float16, safetensors, {card['folder_bytes'] / 1e6:.1f} MB (shipped packed: byte planes and xz).

```python
import torch
from diffusers import StableDiffusion3Pipeline
from vgrpo_lib.integrations.packed_weights import unpacked_folder
folder = unpacked_folder("integrations/testbed/checkpoints/mnist_sd3_geneval")  # plain, unpacked once into a cache
# dtype= as diffusers 0.42 names it (older releases: torch_dtype=)
pipe = StableDiffusion3Pipeline.from_pretrained(folder, dtype=torch.float32)
image = pipe("a red 3 and a blue 8", height={card['canvas']}, width={card['canvas']}, num_inference_steps=20,
             guidance_scale=4.0).images[0]
```

## Training ({s['total_s'] / 60:.1f} minutes, {card['torch_threads']} torch threads, 2-core machine)
{s.get('note', '')}
- VAE ({s['vae_s'] / 60:.1f} min): {card['vae_recipe']['steps']} AdamW steps of {card['vae_recipe']['batch_size']}
  compositions of random `train` specs (category uniform); L1 + MSE (stroke pixels weighted
  {card['vae_recipe']['ink_weight']:g}x) + {card['vae_recipe']['kl']:g} KL.
- Transformer and both CLIP text encoders, jointly, by rectified flow: {flow['steps']} AdamW steps of
  {flow['batch_size']} (lr {flow['lr']:g} constant after {flow['warmup']} warmup steps), each sample's GenEval
  category uniform, from a pool of about {flow['pool_per_category']} compositions per category; caption dropout
  {flow['p_uncond']}. The step count was chosen by a pilot (`results/mnist-sd3-geneval-pipeline/`) for a CFG-free base
  inside the 0.15-0.6 band of GenEval overall.

## Measured: GenEval's table on the {_eval_samples(card)} held-out samples ({card['evaluation']['num_steps']} Euler steps, noise seed {card['evaluation']['seed']})
"detector" is the reward detector (GenEval's rules, `vgrpo_lib.integrations.rewards.geneval`), "judge" the independent
detector trained on a disjoint split (never a reward).

| images, reader | {' | '.join(GENEVAL_TAGS)} | overall |
|---|{'---|' * (len(GENEVAL_TAGS) + 1)}
{chr(10).join(rows)}

Raw numbers: `card.json` in this folder.
"""


def _eval_samples(card: dict) -> int:
    return len(geneval_specs("eval")) * card["evaluation"]["per_prompt"]


def pretrain_geneval_pipeline(log=print, vae_recipe: dict = VAE_RECIPE, flow_recipe: dict = FLOW_RECIPE,
                              folder: Path = PIPELINE_DIR) -> dict:
    """The whole rebuild: build, VAE, flow, measure, save to ``folder``; returns the card."""
    start = time.perf_counter()
    pipe = build_geneval_pipeline(seed=0)
    train_vae(pipe.vae, log=log, batches=composition_batches, **vae_recipe)
    vae_seconds = time.perf_counter() - start
    flow_stage(pipe, log=log, **flow_recipe)
    train_seconds = time.perf_counter() - start
    log("measuring the samples ...")
    metrics = measure(pipe)
    card = describe(pipe, metrics, vae_recipe, flow_recipe, {
        "vae_s": round(vae_seconds), "train_s": round(train_seconds), "total_s": round(time.perf_counter() - start)})
    save_pipeline(pipe, card, folder, readme=model_card)
    return card
