"""Tiny random SD3 / FLUX / FLUX.2 / Qwen-Image diffusers pipelines built offline (no hub files), saved with
``save_pretrained``.

Every component is the real class with a tiny config: transformer, AutoencoderKL, two CLIP text encoders
(+ T5 for SD3's third encoder and FLUX's second), the flow-matching scheduler, and tokenizers built in code
from a byte-level vocabulary (CLIP BPE without merges, a character-level T5 unigram), so the pipelines'
own ``encode_prompt`` runs end to end. Images are 16x16 pixels (latents 4x8x8). FLUX.2 (dev: Mistral3, klein:
Qwen3) and Qwen-Image (Qwen2.5-VL) get decoder-only text encoders with the layer counts their pipelines read and
a character-level tokenizer with a chat template (`chat_tokenizer`), and their own autoencoders
(``AutoencoderKLFlux2``, ``AutoencoderKLQwenImage``).
"""

from __future__ import annotations

from pathlib import Path

import torch

IMAGE_SIZE = 16
LATENT_CHANNELS = 4
CLIP_LENGTH = 8  # CLIP tokens per prompt (tokenizer.model_max_length)
T5_LENGTH = 8  # pass as max_sequence_length


def _bytes_to_unicode() -> list[str]:
    """The 256 printable stand-ins GPT-2 / CLIP byte-level BPE uses for the bytes."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    extra = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(extra))]


def clip_tokenizer():
    from transformers import CLIPTokenizer

    chars = _bytes_to_unicode()
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for token in chars + [c + "</w>" for c in chars]:
        vocab[token] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=CLIP_LENGTH)


def t5_tokenizer():
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(c, -1.0) for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=T5_LENGTH)


def _clip_encoder(vocab_size: int, with_projection: bool = True):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                            num_attention_heads=2, max_position_embeddings=CLIP_LENGTH, projection_dim=8,
                            bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(config)


def _t5_encoder(vocab_size: int, d_model: int = 16):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                   relative_attention_num_buckets=8, decoder_start_token_id=0))


def _vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS, block_out_channels=(8, 8),
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         layers_per_block=1, norm_num_groups=4, scaling_factor=1.5, shift_factor=0.1)


def save_tiny_sd3(path: str | Path, seed: int = 0) -> Path:
    """A tiny StableDiffusion3Pipeline (both CLIPs + T5) written to ``path``; returns ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    clip, t5 = clip_tokenizer(), t5_tokenizer()
    # prompt_embeds = [CLIP-L hidden | CLIP-G hidden] padded to T5's width, then T5 tokens: joint dim = T5 d_model.
    transformer = SD3Transformer2DModel(sample_size=IMAGE_SIZE // 2, patch_size=2, in_channels=LATENT_CHANNELS,
                                        num_layers=2, attention_head_dim=8, num_attention_heads=2,
                                        joint_attention_dim=16, caption_projection_dim=16, pooled_projection_dim=16,
                                        out_channels=LATENT_CHANNELS, pos_embed_max_size=16)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=_vae(),
        text_encoder=_clip_encoder(len(clip)), tokenizer=clip, text_encoder_2=_clip_encoder(len(clip)),
        tokenizer_2=clip_tokenizer(), text_encoder_3=_t5_encoder(len(t5)), tokenizer_3=t5,
    )
    pipe.save_pretrained(path)
    return Path(path)


def save_tiny_flux(path: str | Path, seed: int = 0) -> Path:
    """A tiny FluxPipeline (CLIP pooled + T5 tokens, guidance-distilled like FLUX.1-dev) written to ``path``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    clip, t5 = clip_tokenizer(), t5_tokenizer()
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=1,
                                         num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
                                         joint_attention_dim=16, pooled_projection_dim=8, guidance_embeds=True,
                                         axes_dims_rope=(2, 2, 4))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxPipeline(transformer=transformer, scheduler=scheduler, vae=_vae(), text_encoder=_clip_encoder(len(clip), with_projection=False),
                        tokenizer=clip, text_encoder_2=_t5_encoder(len(t5)), tokenizer_2=t5)
    pipe.save_pretrained(path)
    return Path(path)


WAN_FRAMES = 5  # video frames: 2 latent frames through the causal VAE's 4x temporal compression


def _wan_transformer():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                 in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, text_dim=16, freq_dim=16,
                                 ffn_dim=16, num_layers=1, rope_max_seq_len=32)


def save_tiny_wan(path: str | Path, seed: int = 0, two_experts: bool = False) -> Path:
    """A tiny WanPipeline written to ``path`` (UMT5 + the causal video VAE + UniPC with flow sigmas, shift 3);
    ``two_experts``: Wan 2.2's layout, a second transformer ``transformer_2`` below ``boundary_ratio=0.875``.
    Videos of ``WAN_FRAMES`` frames of 16x16 pixels are latents ``(4, 2, 4, 4)`` (VAE 4x in time and space)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    tokenizer = t5_tokenizer()
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), d_model=16, d_kv=8, d_ff=32, num_layers=1,
                                               num_heads=2, relative_attention_num_buckets=8, decoder_start_token_id=0))
    vae = AutoencoderKLWan(base_dim=4, z_dim=LATENT_CHANNELS, dim_mult=[1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[True, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
                           latents_std=[1.5, 0.5, 2.0, 1.0], scale_factor_spatial=4)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    experts = {"transformer_2": _wan_transformer(), "boundary_ratio": 0.875} if two_experts else {}
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                       transformer=_wan_transformer(), **experts)
    pipe.save_pretrained(path)
    return Path(path)


# -- FLUX.2 (dev, klein) and Qwen-Image: chat-template tokenizers and decoder-only text encoders -------------------

CHAT_SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
# Renders the user turns only: the real templates' system messages would fill a tiny max_sequence_length.
USER_TURNS_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|im_start|>{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{{ c['text'] }}{% endfor %}{% endif %}<|im_end|>{% endif %}{% endfor %}"
)
CHAT_LENGTH = 16  # pass as max_sequence_length (FLUX.2 pads every prompt to it)


def chat_tokenizer(template: str = USER_TURNS_TEMPLATE):
    """A character-level ``PreTrainedTokenizerFast`` (printable ASCII and newline) with a pad token and a chat
    template, built in code: what the FLUX.2 and Qwen-Image pipelines call (``apply_chat_template``, padding)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(CHAT_SPECIALS + chars)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=CHAT_SPECIALS[2:], model_max_length=1024)
    fast.chat_template = template
    return fast


def _mistral3_encoder(vocab_size: int):
    """FLUX.2-dev's Mistral3ForConditionalGeneration, tiny: 30 text layers (the pipeline reads layers 10, 20, 30)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    text = MistralConfig(vocab_size=vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=30,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4, max_position_embeddings=64)
    vision = PixtralVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 image_size=16, patch_size=8, head_dim=4)
    return Mistral3ForConditionalGeneration(Mistral3Config(vision_config=vision, text_config=text, image_token_index=1,
                                                           spatial_merge_size=1))


def _qwen3_encoder(vocab_size: int):
    """FLUX.2 klein's Qwen3ForCausalLM, tiny: 27 layers (the pipeline reads layers 9, 18, 27)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=27,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                                        max_position_embeddings=64))


FLUX2_IMAGE_SIZE = 16  # latents (16, 4, 4): 4 channels x 2x2 patches of the 2x VAE latent (8x8)


def save_tiny_flux2(path: str | Path, klein: bool = False, seed: int = 0) -> Path:
    """A tiny Flux2Pipeline (guidance-distilled like FLUX.2-dev, Mistral3 encoder) or, with ``klein``, a
    Flux2KleinPipeline (no guidance embedding, Qwen3 encoder) written to ``path``. The VAE's batch-norm statistics
    are random, so the latent normalisation is exercised."""
    from diffusers import (AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Pipeline,
                           Flux2Transformer2DModel)

    torch.manual_seed(seed)
    tokenizer = chat_tokenizer()
    transformer = Flux2Transformer2DModel(patch_size=1, in_channels=4 * LATENT_CHANNELS, num_layers=1,
                                          num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
                                          joint_attention_dim=3 * 8, timestep_guidance_channels=16, mlp_ratio=2.0,
                                          axes_dims_rope=(2, 2, 2, 2), guidance_embeds=not klein)
    vae = AutoencoderKLFlux2(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                             up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1,
                             latent_channels=LATENT_CHANNELS, norm_num_groups=4, sample_size=FLUX2_IMAGE_SIZE)
    vae.bn.running_mean.normal_(0.0, 0.5)
    vae.bn.running_var.uniform_(0.5, 2.0)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    pipeline_class, encoder = (Flux2KleinPipeline, _qwen3_encoder) if klein else (Flux2Pipeline, _mistral3_encoder)
    pipe = pipeline_class(scheduler=scheduler, vae=vae, text_encoder=encoder(len(tokenizer)), tokenizer=tokenizer,
                          transformer=transformer)
    pipe.save_pretrained(path)
    return Path(path)


QWEN_IMAGE_SIZE = 16  # latents (4, 8, 8) at the tiny VAE's scale 2: 16 tokens of 2x2 patches
# Text tokens per prompt (pass as max_sequence_length): the character-level tokenizer spends ~130 tokens on the
# pipeline's own system template (its first 34 dropped), so the prompt follows after them.
QWEN_IMAGE_LENGTH = 192


def save_tiny_qwen_image(path: str | Path, seed: int = 0) -> Path:
    """A tiny QwenImagePipeline written to ``path``: Qwen2.5-VL text encoder (2 layers; the pipeline reads the last
    hidden state), the one-frame video VAE with non-trivial ``latents_mean`` / ``latents_std``, and Qwen-Image's
    scheduler config (dynamic shift over 256..8192 tokens, max shift 0.9, ``shift_terminal`` 0.02)."""
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    tokenizer = chat_tokenizer()
    text = dict(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, bos_token_id=2,
                eos_token_id=3, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]})
    vision = dict(depth=1, hidden_size=8, intermediate_size=16, num_heads=2, out_hidden_size=16, patch_size=2,
                  spatial_merge_size=1, temporal_patch_size=1, fullatt_block_indexes=[0])
    encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=1,
                                                                  video_token_id=1, vision_start_token_id=1))
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=LATENT_CHANNELS, dim_mult=[1, 2], num_res_blocks=1, attn_scales=[],
                                 temperal_downsample=[False], latents_mean=[0.1, -0.2, 0.3, 0.0],
                                 latents_std=[1.5, 0.7, 1.2, 2.0])
    transformer = QwenImageTransformer2DModel(patch_size=2, in_channels=4 * LATENT_CHANNELS, out_channels=LATENT_CHANNELS,
                                              num_layers=1, attention_head_dim=8, num_attention_heads=2,
                                              joint_attention_dim=16, axes_dims_rope=(2, 2, 4))
    scheduler = FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192,
                                                max_shift=0.9, shift=1.0, shift_terminal=0.02, use_dynamic_shifting=True,
                                                time_shift_type="exponential")
    pipe = QwenImagePipeline(scheduler=scheduler, vae=vae, text_encoder=encoder, tokenizer=tokenizer,
                             transformer=transformer)
    pipe.save_pretrained(path)
    return Path(path)
