"""The MNIST-Wan pipeline's components: real diffusers / transformers classes in small configs.

``build_pipeline(seed)`` returns an untrained ``WanPipeline`` with the final configs; the pretraining
(:mod:`vgrpo_lib.integrations.testbed.mnist_wan.train`) trains it and writes it with ``save_pretrained``
(load it with ``WanPipeline.from_pretrained``).

* Tokenizer: a ``T5TokenizerFast`` (a unigram model, as UMT5's) built in code from ``prompts.VOCABULARY``:
  every vocabulary word is one piece, any other lower-case text falls back to single characters.
  Prompts are encoded to ``TEXT_LENGTH`` tokens (pass ``max_sequence_length=TEXT_LENGTH``; the pipeline
  zeroes the embeddings past a prompt's end, as for the published model).
* Text encoder: ``UMT5EncoderModel``, 2 layers of width 64, no dropout (training draws no global random
  numbers), trained jointly with the transformer.
* VAE: ``AutoencoderKLWan``, the causal 3-D VAE with two down stages instead of three (4x in space, 4x in
  time: 9 frames of 32x32 -> 16 x 3 x 8 x 8), widths 8/16/32, no attention. ``latents_mean`` / ``latents_std``
  are set from the training latents after the VAE stage (the pipeline un-normalises with them).
* Transformer: ``WanTransformer3DModel``, patch (1, 2, 2) as published, ``TRANSFORMER`` sizes (48 video tokens).
* Scheduler: ``UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
  flow_shift=FLOW_SHIFT)``, Wan's own.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vgrpo_lib.extras import needs_extra

from .prompts import VOCABULARY
from .render import LATENT_CHANNELS, VAE_SPATIAL, VAE_TEMPORAL

__all__ = [
    "PIPELINE_DIR", "TEXT_LENGTH", "FLOW_SHIFT", "TEXT_ENCODER", "TRANSFORMER", "VAE", "tokenizer", "build_text_encoder",
    "build_vae", "build_transformer", "build_scheduler", "build_pipeline",
]

PIPELINE_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "mnist_wan"  # the shipped pipeline
TEXT_LENGTH = 8  # tokens per prompt, end token included: pass as max_sequence_length
FLOW_SHIFT = 3.0  # Wan 2.1's 480p shift; the pretraining draws its times independently of it
TEXT_ENCODER = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
                    relative_attention_max_distance=16, dropout_rate=0.0)
TRANSFORMER = dict(num_attention_heads=4, attention_head_dim=32, ffn_dim=256, num_layers=4, freq_dim=64,
                   patch_size=(1, 2, 2), rope_max_seq_len=64)
VAE = dict(base_dim=8, z_dim=LATENT_CHANNELS, dim_mult=[1, 2, 4], num_res_blocks=1, attn_scales=[],
           temperal_downsample=[True, True], scale_factor_spatial=VAE_SPATIAL, scale_factor_temporal=VAE_TEMPORAL)
_CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
_WORD_SCORE, _CHARACTER_SCORE = -1.0, -10.0  # unigram log-probabilities: a whole word beats any spelling of it


def tokenizer(vocabulary: tuple[str, ...] = VOCABULARY):
    """A word-level ``T5TokenizerFast``: each word of ``vocabulary`` is one piece ``"▁word"``, other text goes by
    character; ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, no sentinel ids."""
    with needs_extra("diffusers", "The MNIST-Wan pipeline"):
        from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", _CHARACTER_SCORE)]
    pieces += [("▁" + word, _WORD_SCORE) for word in vocabulary]
    pieces += [(c, _CHARACTER_SCORE) for c in _CHARACTERS]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=TEXT_LENGTH)


def build_text_encoder(vocab_size: int):
    """The untrained ``UMT5EncoderModel`` of ``TEXT_ENCODER`` sizes over ``vocab_size`` tokens."""
    with needs_extra("diffusers", "The MNIST-Wan pipeline"):
        from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(UMT5Config(vocab_size=vocab_size, pad_token_id=0, eos_token_id=1,
                                       decoder_start_token_id=0, **TEXT_ENCODER))


def build_vae():
    """The untrained ``AutoencoderKLWan`` (latent statistics 0 / 1 until the flow stage sets them)."""
    with needs_extra("diffusers", "The MNIST-Wan pipeline"):
        from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(latents_mean=[0.0] * LATENT_CHANNELS, latents_std=[1.0] * LATENT_CHANNELS, **VAE)


def build_transformer():
    """The untrained ``WanTransformer3DModel`` reading ``TEXT_ENCODER``-wide text and ``LATENT_CHANNELS`` latents."""
    with needs_extra("diffusers", "The MNIST-Wan pipeline"):
        from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS,
                                 text_dim=TEXT_ENCODER["d_model"], **TRANSFORMER)


def build_scheduler(flow_shift: float = FLOW_SHIFT):
    """Wan's scheduler: UniPC on flow sigmas with velocity (``flow_prediction``) outputs and ``flow_shift``."""
    with needs_extra("diffusers", "The MNIST-Wan pipeline"):
        from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=flow_shift)


def build_pipeline(seed: int = 0):
    """An untrained MNIST-Wan ``WanPipeline`` (float32, CPU) with the final configs."""
    with needs_extra("diffusers", "The MNIST-Wan pipeline"):
        from diffusers import WanPipeline

    torch.manual_seed(seed)
    tok = tokenizer()
    return WanPipeline(tokenizer=tok, text_encoder=build_text_encoder(len(tok)), vae=build_vae(),
                       scheduler=build_scheduler(), transformer=build_transformer())
