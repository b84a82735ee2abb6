"""ImageReward (Xu et al., 2023) on transformers' BLIP modules.

ImageReward is a BLIP model trained on human preference rankings: the ViT-L/16 image tokens are
cross-attended by the BERT-style BLIP text encoder reading the prompt, and a 5-layer MLP maps the
fused [CLS] feature to a scalar that is standardised with the training-set mean and std:

    reward = (MLP(text_encoder(prompt, cross-attending ViT(image))[:, 0]) - 0.16717) / 1.03334

transformers ships the two BLIP towers (`BlipVisionModel`, `BlipTextModel` with cross-attention),
so only the head and the checkpoint conversion live here. The official checkpoint
(THUDM/ImageReward, ImageReward.pt) is in the original BLIP layout; `image_reward_to_transformers`
renames its keys the way transformers' own BLIP conversion script does. Images are 224 x 224
(ImageReward's setting, not BLIP-ITM's 384), prompts 35 tokens, tokenised as in ImageReward's
`score` (the [CLS] first token is kept).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from vgrpo_lib.extras import needs_extra
from .base import Reward, register_reward
from .clip_rewards import ScoreMLP, _load_strict_params, _local_or_hub_file
from .loading import load_config_and_processors, resolve_local_files_only
from .preprocess import ImagePreprocessor

__all__ = ["BLIP_BASE", "ImageReward", "image_reward_to_transformers"]

IMAGE_REWARD_REPO, IMAGE_REWARD_FILE = "THUDM/ImageReward", "ImageReward.pt"
BLIP_BASE = "Salesforce/blip-itm-large-coco"
REWARD_MEAN, REWARD_STD = 0.16717362830052426, 1.0333394966054072


class ImageReward(Reward):
    """The ImageReward score of each (image, prompt) pair, (B,), about -2..2 (higher is preferred).

    Args:
        vision_model: a transformers `BlipVisionModel` (ViT-L/16 at 224 px for the release).
        text_encoder: a `BlipTextModel(add_pooling_layer=False)` with cross-attention.
        tokenizer: the BLIP BERT tokenizer.
        preprocess: torch preprocessing (224 crop, CLIP mean/std).
        head: the `ScoreMLP` on the 768-d fused feature.
    """

    def __init__(self, vision_model: nn.Module, text_encoder: nn.Module, tokenizer, preprocess: ImagePreprocessor,
                 head: ScoreMLP, max_length: int = 35):
        super().__init__()
        self.vision_model = vision_model.eval().requires_grad_(False)
        self.text_encoder = text_encoder.eval().requires_grad_(False)
        self.head = head.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.preprocess = preprocess
        self.max_length = max_length

    @classmethod
    def from_pretrained(cls, checkpoint: str = IMAGE_REWARD_REPO, filename: str = IMAGE_REWARD_FILE,
                        blip: str = BLIP_BASE, image_size: int = 224, local_files_only: bool | None = None,
                        dtype: torch.dtype | None = None) -> "ImageReward":
        """Load the original ImageReward checkpoint into transformers BLIP towers.

        Args:
            checkpoint: a local ImageReward.pt, or a hub repo holding `filename`.
            blip: hub name or directory of a transformers BLIP-ITM (ViT-L) whose config, tokenizer and
                image-processor statistics are used (its weights are not loaded).
            image_size: the input resolution ImageReward was trained at (224).
        """
        with needs_extra("rewards", "The ImageReward reward"):
            from transformers import BlipConfig, BlipVisionModel
            from transformers.models.blip.modeling_blip_text import BlipTextModel

        purpose = "the ImageReward reward"
        local = resolve_local_files_only(local_files_only)
        path = _local_or_hub_file(checkpoint, filename, local, purpose)
        config, tokenizer, image_processor = load_config_and_processors(BlipConfig, blip, local, purpose, "BLIP")
        config.vision_config.image_size = image_size
        vision, text = BlipVisionModel(config.vision_config), BlipTextModel(config.text_config, add_pooling_layer=False)
        head = ScoreMLP(config.text_config.hidden_size)
        state = torch.load(path, map_location="cpu", weights_only=True)
        converted = image_reward_to_transformers(state.get("state_dict", state))
        for prefix, module in (("vision_model.", vision), ("text_encoder.", text), ("head.", head)):
            _load_strict_params(module, {k[len(prefix):]: v for k, v in converted.items() if k.startswith(prefix)})
        preprocess = ImagePreprocessor(image_size, (image_size, image_size), image_processor.image_mean,
                                       image_processor.image_std)
        reward = cls(vision, text, tokenizer, preprocess, head)
        return reward.to(dtype) if dtype is not None else reward

    def score(self, images, prompts):
        pixels = self.preprocess(images).to(self.vision_model.dtype)
        image_tokens = self.vision_model(pixel_values=pixels).last_hidden_state
        image_mask = torch.ones(image_tokens.shape[:-1], dtype=torch.long, device=image_tokens.device)
        tokens = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=self.max_length,
                                return_tensors="pt").to(image_tokens.device)
        fused = self.text_encoder(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask,
                                  encoder_hidden_states=image_tokens, encoder_attention_mask=image_mask).last_hidden_state
        raw = self.head(fused[:, 0].float()).squeeze(-1)
        return (raw - REWARD_MEAN) / REWARD_STD


_VISION_RENAMES = (
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.", "embeddings.patch_embedding."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blocks\.(\d+)\.mlp\.", r"encoder.layers.\1.mlp."),
    (r"^norm\.", "post_layernorm."),
)


def image_reward_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename an ImageReward.pt state dict to `vision_model.*` / `text_encoder.*` / `head.*` keys.

    Only the modules the score uses are kept (the BLIP projection and matching heads that may sit in
    the checkpoint are dropped). The vision tower's fused qkv layout is identical in both (B, N, 3,
    heads, head_dim), and the BLIP text encoder's key names are the same in both codebases.
    """
    out = {}
    for key, value in state.items():
        if key.startswith("blip.visual_encoder."):
            name = key[len("blip.visual_encoder."):]
            for pattern, replacement in _VISION_RENAMES:
                renamed = re.sub(pattern, replacement, name)
                if renamed != name:
                    out["vision_model." + renamed] = value
                    break
            else:
                raise KeyError(f"unexpected ImageReward vision key {key!r}")
        elif key.startswith("blip.text_encoder.") and not key.endswith("position_ids"):
            out["text_encoder." + key[len("blip.text_encoder."):]] = value
        elif key.startswith("mlp.layers."):
            out["head." + key[len("mlp."):]] = value
    return out


register_reward("imagereward")(ImageReward.from_pretrained)
