"""The MNIST-SD3 pipeline's components: real diffusers / transformers classes in small configs.

``build_pipeline(seed)`` returns an untrained ``StableDiffusion3Pipeline`` with the final
configs; ``python -m vgrpo_lib.integrations.testbed.pretrain mnist_sd3`` trains it and writes it to
``PIPELINE_DIR`` with ``save_pretrained``, its weights packed (load it with
``StableDiffusion3Pipeline.from_pretrained(unpacked_folder(PIPELINE_DIR))``, :mod:`vgrpo_lib.integrations.packed_weights`).

* Tokenizers: two ``CLIPTokenizer`` built in code from ``prompts.VOCABULARY``: every vocabulary word
  is one token (a chain of BPE merges spells it), any other lower-case text falls back to single
  characters, and CLIP's pre-tokenizer splits numerals into single digits ("407" -> 4, 0, 7), so
  unseen numbers are sequences of known tokens. ``CLIP_LENGTH`` tokens per prompt.
* Text encoders: ``CLIPTextModelWithProjection`` x 2 (a small "CLIP-L" and a wider "CLIP-G"). The
  conditioning is SD3's T5-free mode: ``max_sequence_length`` zero tokens after the CLIP tokens (see
  ``T5_TOKENS``). Training and the hub path run without T5 (``text_encoder_3=None``); the saved folder
  holds a null T5 (``null_t5``: a ``T5EncoderModel`` whose every weight is zero, so its output is exactly
  the zero tokens), so that a plain ``StableDiffusion3Pipeline.from_pretrained`` of the unpacked folder loads and
  conditions exactly as the T5-free pipeline does.
* VAE: ``AutoencoderKL``, 3 blocks of 16/32/64 channels (4x downsampling), 4 latent channels, no
  attention (fully convolutional), 0.65M parameters.
* Transformer: ``SD3Transformer2DModel``, 4 joint blocks of 4 heads x 32, patch 2 (16 image tokens
  for 32x32, 48 for 32x96).
* Scheduler: ``FlowMatchEulerDiscreteScheduler(shift=SCHEDULER_SHIFT)``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vgrpo_lib.extras import needs_extra

from .prompts import VOCABULARY
from .render import DIGIT_SIZE, LATENT_CHANNELS, NUMBER_SIZE, VAE_DOWNSAMPLE

__all__ = [
    "PIPELINE_DIR", "CLIP_LENGTH", "T5_TOKENS", "SCHEDULER_SHIFT", "CLIP_L", "CLIP_G", "JOINT_ATTENTION_DIM",
    "POOLED_DIM", "TRANSFORMER", "VAE_BLOCKS", "NULL_T5", "clip_tokenizer", "null_t5", "build_vae", "build_transformer",
    "build_pipeline",
]

PIPELINE_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "mnist_sd3"

CLIP_LENGTH = 12  # CLIP tokens per prompt, start and end tokens included
T5_TOKENS = 0
"""The cheap ``max_sequence_length``: no zero tokens after the CLIP tokens. The transformer was trained
with 0 and with the pipeline's default 256 zero tokens, so both calls are in-distribution; other counts
were not trained."""
SCHEDULER_SHIFT = 1.0
CLIP_L = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, projection_dim=64)
CLIP_G = dict(hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2, projection_dim=64)
JOINT_ATTENTION_DIM = CLIP_L["hidden_size"] + CLIP_G["hidden_size"]
POOLED_DIM = CLIP_L["projection_dim"] + CLIP_G["projection_dim"]
TRANSFORMER = dict(num_layers=4, attention_head_dim=32, num_attention_heads=4, patch_size=2)
VAE_BLOCKS = (16, 32, 64)
NULL_T5 = dict(d_kv=8, d_ff=8, num_layers=1, num_heads=1)
_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
_SPECIALS = ("<|startoftext|>", "<|endoftext|>")


def clip_tokenizer(vocabulary: tuple[str, ...] = VOCABULARY):
    """A word-level ``CLIPTokenizer``: each word of ``vocabulary`` (default: the MNIST-SD3 prompts' ``VOCABULARY``)
    is one token, other text goes by character.

    Every word is spelled by a chain of merges, left to right. BPE applies the earliest merge first, so one
    word's chain can pre-empt another's ("re" of "red" splits "three" into th, re, e); each word that does not
    come out whole gets merges of the pieces it does come out as, appended until every word is one token."""
    with needs_extra("diffusers", "The MNIST-SD3 pipeline"):
        from transformers import CLIPTokenizer

    vocab = {token: i for i, token in enumerate(_SPECIALS)}
    merges = []

    def add(token: str) -> None:
        vocab.setdefault(token, len(vocab))

    def chain(pieces: list[str]) -> None:
        prefix = pieces[0]
        for piece in pieces[1:]:
            merges.append((prefix, piece))
            prefix = prefix + piece
            add(prefix)

    def build():
        return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=CLIP_LENGTH, unk_token="<|endoftext|>",
                             bos_token="<|startoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>")

    for c in _CHARACTERS:
        add(c)
        add(c + "</w>")
    for word in vocabulary:
        chain([*word[:-1], word[-1] + "</w>"])
    tokenizer = build()
    while broken := [pieces for word in vocabulary if len(pieces := tokenizer.tokenize(word)) > 1]:
        chain(broken[0])
        tokenizer = build()
    return tokenizer


def null_t5():
    """SD3's third text encoder as a placeholder: ``(T5EncoderModel, T5TokenizerFast)`` whose every weight is
    zero, so any prompt encodes to ``(B, max_sequence_length, JOINT_ATTENTION_DIM)`` exact zeros (SD3's
    T5-free conditioning) in any dtype. The tokenizer is T5's with only its four special tokens."""
    with needs_extra("diffusers", "The MNIST-SD3 pipeline"):
        from transformers import T5Config, T5EncoderModel, T5TokenizerFast

    tokenizer = T5TokenizerFast(extra_ids=0)
    encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), d_model=JOINT_ATTENTION_DIM, **NULL_T5))
    with torch.no_grad():
        for parameter in encoder.parameters():
            parameter.zero_()
    return encoder.eval(), tokenizer


def _clip_encoder(vocab_size: int, sizes: dict):
    with needs_extra("diffusers", "The MNIST-SD3 pipeline"):
        from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=vocab_size, max_position_embeddings=CLIP_LENGTH, bos_token_id=0,
                            eos_token_id=1, pad_token_id=1, **sizes)
    return CLIPTextModelWithProjection(config)


def build_vae(sample_size: int = DIGIT_SIZE[0]):
    """The untrained ``AutoencoderKL``: RGB -> 4 latent channels at 1/4 resolution (scaling set by training)."""
    with needs_extra("diffusers", "The MNIST-SD3 pipeline"):
        from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS,
                         block_out_channels=VAE_BLOCKS, down_block_types=("DownEncoderBlock2D",) * len(VAE_BLOCKS),
                         up_block_types=("UpDecoderBlock2D",) * len(VAE_BLOCKS), layers_per_block=1,
                         norm_num_groups=16, mid_block_add_attention=False, sample_size=sample_size, scaling_factor=1.0,
                         shift_factor=0.0)


def build_transformer(image_sizes: tuple[tuple[int, int], ...] = (DIGIT_SIZE, NUMBER_SIZE)):
    """The untrained ``SD3Transformer2DModel`` for images of ``image_sizes`` (default: the digit and number tasks;
    default sample size: the first size's latents, position embeddings up to the widest side)."""
    with needs_extra("diffusers", "The MNIST-SD3 pipeline"):
        from diffusers import SD3Transformer2DModel

    inner = TRANSFORMER["num_attention_heads"] * TRANSFORMER["attention_head_dim"]
    widest = max(max(size) for size in image_sizes) // VAE_DOWNSAMPLE // TRANSFORMER["patch_size"]
    return SD3Transformer2DModel(sample_size=image_sizes[0][0] // VAE_DOWNSAMPLE, in_channels=LATENT_CHANNELS,
                                 out_channels=LATENT_CHANNELS, joint_attention_dim=JOINT_ATTENTION_DIM,
                                 caption_projection_dim=inner, pooled_projection_dim=POOLED_DIM,
                                 pos_embed_max_size=widest, **TRANSFORMER)


def build_pipeline(seed: int = 0, vocabulary: tuple[str, ...] = VOCABULARY,
                   image_sizes: tuple[tuple[int, int], ...] = (DIGIT_SIZE, NUMBER_SIZE)):
    """An untrained MNIST-SD3 ``StableDiffusion3Pipeline`` (float32, CPU) with the final configs; ``vocabulary``
    and ``image_sizes`` (the defaults are MNIST-SD3's) let a sibling pipeline on other prompts and canvases (the
    GenEval compositions) use the same architecture."""
    with needs_extra("diffusers", "The MNIST-SD3 pipeline"):
        from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    tokenizer, tokenizer_2 = clip_tokenizer(vocabulary), clip_tokenizer(vocabulary)
    transformer, vae = build_transformer(image_sizes), build_vae(image_sizes[0][0])
    text_encoder, text_encoder_2 = _clip_encoder(len(tokenizer), CLIP_L), _clip_encoder(len(tokenizer_2), CLIP_G)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=SCHEDULER_SHIFT), vae=vae,
        text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
        text_encoder_3=None, tokenizer_3=None,
    )
