"""Training and measuring the MNIST-SD3 pipeline (``python -m vgrpo_lib.integrations.testbed.pretrain mnist_sd3``).

Two stages, both seeded and bitwise deterministic on one machine at a fixed thread count; both use a
constant learning rate after warmup, so the first k steps of a longer run ARE the run of k steps (how
the pilot chose the step counts):

1. VAE (``train_vae``): ``AutoencoderKL`` on the MNIST-5k ``"train"`` digits rendered 32x32 in the five
   tints, half of every batch whole digits and half 32x32 windows of rendered numbers (so that the
   seams between neighbouring digits are in-distribution too). Loss: L1 + MSE on pixels plus a tiny KL
   (``VAE_RECIPE["kl"]``), AdamW at a constant rate after a warmup.
2. Flow (``flow_stage``): the training images are encoded once (``latent_pools``), ``set_latent_statistics``
   sets ``shift_factor`` / ``scaling_factor`` to the mean and 1 / std of their posterior means, as SD3
   does, so the transformer sees latents of unit scale: ``z = (mean + std * eps - shift) * scale``.
   Then the transformer and both CLIP text encoders train jointly (``train_flow``): rectified flow in the pipeline's
   conventions: ``x_t = (1 - t) z + t eps``, velocity target ``eps - z``, ``timestep = 1000 t``, ``t``
   logit-normal (SD3's training density); white digits and white numbers of the ``"train"`` prompts,
   one geometry per batch; the prompt of a sample is replaced by ``""`` with probability ``p_uncond``
   (caption dropout, so classifier-free guidance works).

Without T5 the pipeline appends ``max_sequence_length`` zero tokens to the prompt (256 by default,
``T5_TOKENS`` = 0 in the presets). Identical tokens stay identical through every layer, so ``m`` of them
act exactly like one token whose attention logit is raised by ``log m``; ``MultiplicityAttnProcessor``
trains with that one token at ``m = 256`` for half the batches and without it for the other half, at
the cost of one token, so both the cheap preset call and the pipeline's default call are in-distribution.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import JointAttnProcessor2_0

from vgrpo_lib.integrations.packed_weights import pack_folder
from vgrpo_lib.integrations.testbed.data import load_mnist

from .build import PIPELINE_DIR, T5_TOKENS, build_pipeline, null_t5
from .card import describe, model_card
from .prompts import digit_prompts, number_prompts
from .render import (DIGIT_SIZE, NUMBER_SIZE, TINT_NAMES, TINTS, classifier_view, ocr_view, render_digits,
                     render_numbers)

__all__ = [
    "PIPELINE_DEFAULT_T5_TOKENS", "VAE_RECIPE", "FLOW_RECIPE", "optimizer_step", "vae_batches", "reconstruction_loss",
    "train_vae", "encode_moments", "set_latent_statistics", "decode", "round_trip_accuracy",
    "MultiplicityAttnProcessor", "encode_text", "latent_pools", "flow_batch", "flow_stage", "train_flow",
    "rectified_flow", "ocr_read", "sample_accuracy", "EVAL", "ocr_ceiling", "measure", "write_pipeline", "save_pipeline",
    "pretrain_mnist_sd3",
]

PIPELINE_DEFAULT_T5_TOKENS = 256  # StableDiffusion3Pipeline's default max_sequence_length

VAE_RECIPE = dict(steps=1200, batch_size=32, lr=2e-3, kl=1e-6, seed=100)
FLOW_RECIPE = dict(steps=4500, digit_batch=16, number_batch=32, number_share=0.95, lr=1e-3, warmup=100,
                   p_uncond=0.1, seed=200, pool_seed=201, number_repeats=2)


def optimizer_step(opt, sched, loss: torch.Tensor, clip_params=None) -> None:
    """One AdamW step on ``loss`` and one scheduler step; gradient norm clipped at 1 over ``clip_params`` if given."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip_params is not None:
        torch.nn.utils.clip_grad_norm_(clip_params, 1.0)
    opt.step()
    sched.step()


def vae_batches(digits: torch.Tensor, labels: torch.Tensor, batch_size: int, generator: torch.Generator):
    """Endless VAE batches ``(batch_size, 3, 32, 32)``: half tinted digits, half tinted 32x32 windows of numbers."""
    half = batch_size // 2
    while True:
        idx = torch.randint(0, len(labels), (half,), generator=generator)
        singles = render_digits(digits[idx], torch.randint(0, len(TINTS), (half,), generator=generator))
        numbers = [str(n) for n in torch.randint(10, 1000, (batch_size - half,), generator=generator).tolist()]
        wide = render_numbers(digits, labels, numbers, generator,
                              torch.randint(0, len(TINTS), (len(numbers),), generator=generator))
        x0 = torch.randint(0, NUMBER_SIZE[1] - DIGIT_SIZE[1] + 1, (len(numbers),), generator=generator)
        cols = x0[:, None] + torch.arange(DIGIT_SIZE[1])  # (n, 32) window columns
        windows = wide.gather(3, cols[:, None, None, :].expand(-1, 3, DIGIT_SIZE[0], -1))
        yield torch.cat([singles, windows])


def reconstruction_loss(recon: torch.Tensor, x: torch.Tensor, ink_weight: float = 1.0) -> torch.Tensor:
    """L1 + MSE between ``recon`` and ``x`` (model space), each pixel weighted ``ink_weight`` where ``x`` has ink
    (any channel above 0.1 in [0, 1]) and 1 on the background, normalised by the mean weight.

    On sparse canvases the background dominates a plain mean: a composition VAE trained with ``ink_weight`` 1
    tied the red and green channels (red and green strokes came back yellow), while 10 reads 99.7% of the
    colours back (``results/mnist-sd3-geneval-pipeline/vae_colour_probe.log``). ``ink_weight`` 1 is MNIST-SD3's plain
    ``l1_loss + mse_loss`` (the same float operations, so its rebuild stays bitwise identical)."""
    if ink_weight == 1.0:
        return F.l1_loss(recon, x) + F.mse_loss(recon, x)
    ink = (x.amax(1, keepdim=True) + 1) / 2 > 0.1  # x in [-1, 1]: ink where a channel exceeds 0.1 in [0, 1]
    weight = 1 + (ink_weight - 1) * ink.to(x.dtype)
    error = recon - x
    return (weight * (error.abs() + error.pow(2))).mean() / weight.mean()


def train_vae(vae, *, steps: int, batch_size: int, lr: float, kl: float, seed: int, ink_weight: float = 1.0,
              log=print, callback=None, batches=None) -> None:
    """Fit ``vae`` (an ``AutoencoderKL``) to images in model space ``[-1, 1]`` (see the module doc).

    ``batches(batch_size, generator)`` is the endless source of images in [0, 1] (default: MNIST-SD3's
    tinted digits and number windows, ``vae_batches``); the loss is ``reconstruction_loss`` (``ink_weight``)
    plus ``kl`` times the posterior's KL. AdamW, linear warmup over 50 steps, then a constant rate (so the
    first k steps of a longer run are a run of k steps). ``callback(step, vae)`` after every step."""
    if batches is None:
        digits, labels = load_mnist("train")

        def batches(size, generator):
            return vae_batches(digits, labels, size, generator)

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50))
    source = batches(batch_size, gen)
    vae.train()
    start = time.perf_counter()
    for step in range(steps):
        x = next(source) * 2 - 1
        posterior = vae.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
        recon = vae.decode(z).sample
        loss = reconstruction_loss(recon, x, ink_weight) + kl * posterior.kl().mean()
        optimizer_step(opt, sched, loss)
        if (step + 1) % 100 == 0 or step == 0:
            log(f"vae step {step + 1}/{steps} loss {loss.item():.4f} ({time.perf_counter() - start:.0f} s)")
        if callback is not None:
            callback(step + 1, vae)
    vae.eval()


@torch.no_grad()
def encode_moments(vae, images: torch.Tensor, batch: int = 250) -> tuple[torch.Tensor, torch.Tensor]:
    """Posterior mean and std of ``images`` ``(N, 3, H, W)`` in [0, 1], unscaled: two ``(N, 4, H/4, W/4)``; any VAE
    and layout its ``encode`` takes (MNIST-Wan: clips ``(N, 3, F, H, W)``), ``batch`` at a time."""
    means, stds = [], []
    for chunk in images.split(batch):
        dist = vae.encode(chunk * 2 - 1).latent_dist
        means.append(dist.mean)
        stds.append(dist.std)
    return torch.cat(means), torch.cat(stds)


def set_latent_statistics(vae, means: torch.Tensor) -> None:
    """SD3's latent normalisation: ``shift_factor`` = mean, ``scaling_factor`` = 1 / std of the posterior means."""
    vae.register_to_config(shift_factor=round(means.mean().item(), 4), scaling_factor=round(1.0 / means.std().item(), 4))


@torch.no_grad()
def decode(vae, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents -> images in [0, 1] (the pipeline's own un-normalisation)."""
    x = vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor).sample
    return ((x + 1) / 2).clamp(0, 1)


@torch.no_grad()
def round_trip_accuracy(vae, classifier, digits: torch.Tensor, labels: torch.Tensor, tint_ids: torch.Tensor) -> dict:
    """Classifier accuracy on rendered ``digits`` and on their VAE reconstructions (posterior means)."""
    images = render_digits(digits, tint_ids)
    means, _ = encode_moments(vae, images)
    recon = decode(vae, (means - vae.config.shift_factor) * vae.config.scaling_factor)
    original = (classifier(classifier_view(images)).argmax(-1) == labels).float().mean().item()
    reconstructed = (classifier(classifier_view(recon)).argmax(-1) == labels).float().mean().item()
    return {"original_accuracy": original, "reconstruction_accuracy": reconstructed,
            "ratio": reconstructed / original, "pixel_mae": (recon - images).abs().mean().item()}


class MultiplicityAttnProcessor(JointAttnProcessor2_0):
    """SD3 joint attention in which context token ``j`` counts ``multiplicity[j]`` times.

    Softmax over keys with ``m`` identical copies of a key/value equals one copy whose logit is raised by
    ``log m``; identical tokens stay identical through every joint block (same input, same query, same
    output), so one token with multiplicity ``m`` reproduces ``m`` of them exactly. ``multiplicity``
    ``(L_context,)`` (set by the caller before a forward) covers the context tokens; image tokens count
    once. The projections follow diffusers' ``JointAttnProcessor2_0.__call__`` (whose SDPA call takes
    no mask); only the additive log-multiplicity bias is new.
    """

    multiplicity: torch.Tensor | None = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        if self.multiplicity is None or encoder_hidden_states is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states)
        b, n_img, _ = hidden_states.shape
        heads = attn.heads

        def split(x):
            return x.view(b, -1, heads, x.shape[-1] // heads).transpose(1, 2)

        q, k, v = split(attn.to_q(hidden_states)), split(attn.to_k(hidden_states)), split(attn.to_v(hidden_states))
        if attn.norm_q is not None:
            q, k = attn.norm_q(q), attn.norm_k(k)
        cq = split(attn.add_q_proj(encoder_hidden_states))
        ck = split(attn.add_k_proj(encoder_hidden_states))
        cv = split(attn.add_v_proj(encoder_hidden_states))
        if attn.norm_added_q is not None:
            cq, ck = attn.norm_added_q(cq), attn.norm_added_k(ck)
        bias = torch.cat([torch.zeros(n_img, dtype=q.dtype), self.multiplicity.to(q.dtype).log()])
        out = F.scaled_dot_product_attention(torch.cat([q, cq], 2), torch.cat([k, ck], 2), torch.cat([v, cv], 2),
                                             attn_mask=bias[None])
        out = out.transpose(1, 2).reshape(b, -1, heads * q.shape[-1])
        img, ctx = out[:, :n_img], out[:, n_img:]
        if not attn.context_pre_only:
            ctx = attn.to_add_out(ctx)
        return attn.to_out[1](attn.to_out[0](img)), ctx


def encode_text(pipe, prompts: list[str], zero_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``pipe.encode_prompt`` WITH gradients (the text encoders train jointly): prompt embeds
    ``(B, CLIP_LENGTH + zero_tokens, joint_dim)`` (CLIP tokens, then ``zero_tokens`` in {0, 1} of T5's zero
    tokens) and pooled ``(B, pooled_dim)``."""
    embeds, _, pooled, _ = pipe.encode_prompt(prompts, None, None, do_classifier_free_guidance=False,
                                              max_sequence_length=zero_tokens)
    return embeds, pooled


def latent_pools(vae, seed: int, number_repeats: int) -> dict:
    """Unscaled posterior moments of the flow's training images, per task, with their prompts' targets.

    ``"digit"``: the 3,000 white ``"train"`` digits (targets: digit ints); ``"number"``: every ``"train"``
    number drawn ``number_repeats`` times with fresh handwriting (targets: number strings).
    Returns ``{task: (means (N, 4, h, w), stds (N, 4, h, w), targets)}``.
    """
    digits, labels = load_mnist("train")
    numbers = [n for _, n in number_prompts("train")] * number_repeats
    wide = render_numbers(digits, labels, numbers, torch.Generator().manual_seed(seed))
    return {"digit": (*encode_moments(vae, render_digits(digits)), labels.tolist()),
            "number": (*encode_moments(vae, wide), numbers)}


def flow_batch(pools: dict, task: str, batch_size: int, scale: float, shift: float, gen: torch.Generator):
    """One rectified-flow batch of ``task``: latents ``z`` ``(B, 4, h, w)`` (normalised) and their prompts."""
    means, stds, targets = pools[task]
    idx = torch.randint(0, len(targets), (batch_size,), generator=gen)
    z = (means[idx] + stds[idx] * torch.randn(means[idx].shape, generator=gen) - shift) * scale
    if task == "digit":
        train = digit_prompts("train")
        per_digit = [[p for p, d in train if d == k] for k in range(10)]
        pick = torch.randint(0, len(per_digit[0]), (batch_size,), generator=gen).tolist()
        prompts = [per_digit[targets[i]][j] for i, j in zip(idx.tolist(), pick)]
    else:
        prompts = [f"the number {targets[i]}" for i in idx.tolist()]
    return z, prompts


def flow_stage(pipe, *, pool_seed: int, number_repeats: int, log=print, **recipe) -> None:
    """After the VAE: encode the training pools, set the VAE's latent statistics from them, train the flow."""
    start = time.perf_counter()
    pools = latent_pools(pipe.vae, pool_seed, number_repeats)
    set_latent_statistics(pipe.vae, torch.cat([pools[task][0].flatten() for task in ("digit", "number")]))
    log(f"latent pools encoded ({time.perf_counter() - start:.0f} s); shift_factor {pipe.vae.config.shift_factor}, "
        f"scaling_factor {pipe.vae.config.scaling_factor}")
    train_flow(pipe, pools, log=log, **recipe)


def train_flow(pipe, pools: dict, *, steps: int, digit_batch: int, number_batch: int, number_share: float, lr: float,
               warmup: int, p_uncond: float, seed: int, log=print, callback=None) -> None:
    """Rectified flow for ``pipe.transformer`` with both CLIP encoders trained jointly (see the module doc) on
    MNIST-SD3's two tasks: every step draws its task (``"number"`` with probability ``number_share``), then a
    batch of it (``flow_batch``); the step itself is ``rectified_flow``'s."""

    def batches(gen: torch.Generator):
        while True:
            task = "number" if torch.rand((), generator=gen) < number_share else "digit"
            z, prompts = flow_batch(pools, task, number_batch if task == "number" else digit_batch, scale, shift, gen)
            yield task, z, prompts

    scale, shift = pipe.vae.config.scaling_factor, pipe.vae.config.shift_factor
    rectified_flow(pipe, batches, steps=steps, lr=lr, warmup=warmup, p_uncond=p_uncond, seed=seed, log=log,
                   callback=callback)


def rectified_flow(pipe, batches, *, steps: int, lr: float, warmup: int, p_uncond: float, seed: int, log=print,
                   callback=None) -> None:
    """Train ``pipe.transformer`` and both CLIP encoders by rectified flow on ``batches(generator)``, an endless
    source of ``(name, z, prompts)`` (normalised latents ``(B, 4, h, w)``, B prompts) drawn from the run's one
    generator (seeded by ``seed``).

    Every step replaces a prompt by ``""`` with probability ``p_uncond`` (caption dropout), draws whether the
    T5 zero tokens are absent or 256 (one token with multiplicity 256), each with probability 1/2, and
    ``t`` = sigmoid(N(0, 1)) per sample. AdamW, linear warmup, then a constant rate; gradient norm clipped at
    1. ``callback(step, pipe)`` after every step.
    """
    gen = torch.Generator().manual_seed(seed)
    modules = [pipe.transformer, pipe.text_encoder, pipe.text_encoder_2]
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    processor = MultiplicityAttnProcessor()
    pipe.transformer.set_attn_processor(processor)
    for m in modules:
        m.train()
    source = batches(gen)
    start = time.perf_counter()
    for step in range(steps):
        name, z, prompts = next(source)
        drop = (torch.rand(len(prompts), generator=gen) < p_uncond).tolist()
        prompts = ["" if d else p for p, d in zip(prompts, drop)]
        with_t5 = bool(torch.rand((), generator=gen) < 0.5)
        embeds, pooled = encode_text(pipe, prompts, zero_tokens=int(with_t5))
        processor.multiplicity = torch.ones(embeds.shape[1])
        if with_t5:
            processor.multiplicity[-1] = PIPELINE_DEFAULT_T5_TOKENS
        t = torch.sigmoid(torch.randn(len(prompts), generator=gen))
        eps = torch.randn(z.shape, generator=gen)
        x_t = (1 - t[:, None, None, None]) * z + t[:, None, None, None] * eps
        v = pipe.transformer(hidden_states=x_t, timestep=1000 * t, encoder_hidden_states=embeds,
                             pooled_projections=pooled, return_dict=False)[0]
        loss = F.mse_loss(v, eps - z)
        optimizer_step(opt, sched, loss, clip_params=params)
        if (step + 1) % 50 == 0 or step == 0:
            log(f"flow step {step + 1}/{steps} {name} loss {loss.item():.4f} ({time.perf_counter() - start:.0f} s)")
        if callback is not None:
            callback(step + 1, pipe)
    pipe.transformer.set_attn_processor(JointAttnProcessor2_0())
    for m in modules:
        m.eval()


def ocr_read(images: torch.Tensor, engine) -> list[str]:
    """rapidocr's recognition-only reading of number images ``(B, 3, 32, 96)`` via ``ocr_view`` (spaces removed)."""
    from vgrpo_lib.integrations.rewards.simple import to_uint8_hwc

    texts = []
    for array in to_uint8_hwc(ocr_view(images)):
        results, _ = engine(array, use_det=False, use_cls=False, use_rec=True)
        texts.append("".join(text for text, confidence in results or [] if confidence > 0).replace(" ", ""))
    return texts


@torch.no_grad()
def sample_accuracy(pipe, classifier, ocr_engine, task: str, per_prompt: int, guidance_scale: float, seed: int,
                    num_steps: int = 20, max_sequence_length: int = 0, batch: int = 128) -> float:
    """Accuracy of the pipeline's own samples on the task's ``"eval"`` prompts (``per_prompt`` each).

    ``"digit"``: the testbed classifier's argmax on ``classifier_view`` equals the prompted digit;
    ``"number"``: rapidocr's reading (``ocr_read``) equals the prompted number exactly. The noise of
    sample i comes from ``seed`` through the pipeline's generator, so every call is reproducible.
    """
    pairs = digit_prompts("eval") if task == "digit" else number_prompts("eval")
    prompts = [p for p, _ in pairs for _ in range(per_prompt)]
    targets = [y for _, y in pairs for _ in range(per_prompt)]
    height, width = DIGIT_SIZE if task == "digit" else NUMBER_SIZE
    gen = torch.Generator().manual_seed(seed)
    pipe.set_progress_bar_config(disable=True)
    correct = 0
    for lo in range(0, len(prompts), batch):
        images = pipe(prompts[lo:lo + batch], height=height, width=width, num_inference_steps=num_steps,
                      guidance_scale=guidance_scale, generator=gen, max_sequence_length=max_sequence_length,
                      output_type="pt").images
        chunk = targets[lo:lo + batch]
        if task == "digit":
            predicted = classifier(classifier_view(images)).argmax(-1).tolist()
        else:
            predicted = ocr_read(images, ocr_engine)
        correct += sum(p == y for p, y in zip(predicted, chunk))
    return correct / len(prompts)


EVAL = dict(seed=1234, num_steps=20, guidance_scales=(1.0, 4.0), per_prompt={"digit": 5, "number": 2})


@torch.no_grad()
def ocr_ceiling(engine, per_prompt: int, seed: int) -> float:
    """Exact-match rate of ``ocr_read`` on REAL handwritten numbers: the eval numbers drawn with the
    ``"eval"`` MNIST digits (``per_prompt`` renderings each), the best any generator can score."""
    digits, labels = load_mnist("eval")
    numbers = [n for _, n in number_prompts("eval") for _ in range(per_prompt)]
    images = render_numbers(digits, labels, numbers, torch.Generator().manual_seed(seed))
    return sum(a == b for a, b in zip(ocr_read(images, engine), numbers)) / len(numbers)


def measure(pipe, classifier, engine) -> dict:
    """The model card's numbers: VAE round trip, OCR ceiling, sample accuracies per task and guidance scale
    (with ``max_sequence_length=T5_TOKENS``, and CFG-free with the pipeline's default 256 zero tokens)."""
    digits, labels = load_mnist("eval")
    per_tint = {name: round_trip_accuracy(pipe.vae, classifier, digits, labels, torch.full_like(labels, i))
                for i, name in enumerate(TINT_NAMES)}
    out = {"vae_round_trip": {"white": per_tint["white"], "per_tint": per_tint},
           "ocr_ceiling_real_numbers": ocr_ceiling(engine, EVAL["per_prompt"]["number"], EVAL["seed"])}
    for task in ("digit", "number"):
        for scale in EVAL["guidance_scales"]:
            out[f"{task}/cfg{scale:g}"] = sample_accuracy(pipe, classifier, engine, task, EVAL["per_prompt"][task],
                                                          scale, EVAL["seed"], EVAL["num_steps"], T5_TOKENS)
        out[f"{task}/cfg1/t5_tokens256"] = sample_accuracy(pipe, classifier, engine, task, EVAL["per_prompt"][task], 1.0,
                                                           EVAL["seed"], EVAL["num_steps"], PIPELINE_DEFAULT_T5_TOKENS)
    return out


def write_pipeline(pipe, card: dict, folder: Path, readme) -> None:
    """Write ``pipe`` in float16 with ``save_pretrained`` (safetensors), its weights then packed
    (:func:`~vgrpo_lib.integrations.packed_weights.pack_folder`: ``from_pretrained(unpacked_folder(folder))`` loads
    it), plus ``card.json`` (the card and ``folder_bytes``, the plain folder's size before packing) and the model card
    ``readme(card)`` as ``README.md``, into ``folder``, replacing it as a whole (written next to it, then renamed).
    The shipped MNIST-SD3, MNIST-SD3-GenEval and MNIST-Wan folders are written by it."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.to(torch.float16).save_pretrained(tmp, safe_serialization=True)
    pipe.to(torch.float32)
    card = {**card, "folder_bytes": sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())}
    pack_folder(tmp)
    (tmp / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    (tmp / "README.md").write_text(readme(card))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def save_pipeline(pipe, card: dict, folder: Path = PIPELINE_DIR, readme=model_card) -> None:
    """:func:`write_pipeline` of the T5-free ``pipe`` with ``null_t5`` as its third text encoder, so that a plain
    ``from_pretrained`` of the unpacked folder loads; ``pipe`` is T5-free again afterwards."""
    encoder, tokenizer = null_t5()
    pipe.register_modules(text_encoder_3=encoder, tokenizer_3=tokenizer)
    try:
        write_pipeline(pipe, card, folder, readme)
    finally:
        pipe.register_modules(text_encoder_3=None, tokenizer_3=None)


def pretrain_mnist_sd3(log=print, vae_recipe: dict = VAE_RECIPE, flow_recipe: dict = FLOW_RECIPE) -> dict:
    """The whole rebuild: build, train the VAE, then the flow, measure, save to ``PIPELINE_DIR``; returns the card."""
    from vgrpo_lib.integrations.rewards.simple import ocr_engine
    from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained

    engine = ocr_engine("Pretraining MNIST-SD3 (its OCR measurement)")

    start = time.perf_counter()
    pipe = build_pipeline(seed=0)
    train_vae(pipe.vae, log=log, **vae_recipe)
    vae_seconds = time.perf_counter() - start
    flow_stage(pipe, log=log, **flow_recipe)
    train_seconds = time.perf_counter() - start
    log("measuring the samples ...")
    metrics = measure(pipe, load_pretrained("classifier"), engine)
    card = describe(pipe, metrics, vae_recipe, flow_recipe, {
        "vae_s": round(vae_seconds), "train_s": round(train_seconds), "total_s": round(time.perf_counter() - start)})
    save_pipeline(pipe, card)
    return card
