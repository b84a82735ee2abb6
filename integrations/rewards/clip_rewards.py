"""CLIP-based rewards: PickScore, HPSv2.1, CLIPScore and the LAION aesthetic predictor.

All four embed the image with a CLIP vision tower (transformers' `CLIPModel`) after the
preprocessing of `preprocess.ImagePreprocessor`; the first three also embed the prompt and score
the cosine similarity of the two L2-normalised embeddings:

| reward     | weights (hub)                                   | score                                   |
|------------|-------------------------------------------------|-----------------------------------------|
| PickScore  | yuvalkirstain/PickScore_v1 (CLIP-H/14 finetune)  | logit_scale.exp() * cos  (about 18-24)   |
| HPSv2.1    | xswu/HPSv2, HPS_v2.1_compressed.pt (open_clip)  | cos (about 0.25-0.40)                   |
| CLIPScore  | openai/clip-vit-large-patch14                   | 100 * max(cos, 0) (torchmetrics)        |
| aesthetic  | CLIP-L/14 + trl-lib/ddpo-aesthetic-predictor MLP| MLP(normalised image embedding) (1-10)  |

Papers report PickScore divided by 100 (the V-GRPO table's 0.227 -> 0.241): use `scale=0.01`.
"""

from __future__ import annotations

import os
import re

import torch
import torch.nn.functional as F
from torch import nn

from vgrpo_lib.extras import needs_extra
from .base import Reward, register_reward
from .loading import load_config_and_processors, load_weights, resolve_local_files_only
from .preprocess import ImagePreprocessor

__all__ = [
    "PICKSCORE_MODEL", "CLIP_H14", "CLIP_L14", "CLIPSimilarity", "PickScore", "HPSv21", "open_clip_to_transformers",
    "CLIPScore", "ScoreMLP", "LAIONAesthetic",
]

PICKSCORE_MODEL = "yuvalkirstain/PickScore_v1"
CLIP_H14 = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
HPSV21_REPO, HPSV21_FILE = "xswu/HPSv2", "HPS_v2.1_compressed.pt"
CLIP_L14 = "openai/clip-vit-large-patch14"
AESTHETIC_REPO, AESTHETIC_FILE = "trl-lib/ddpo-aesthetic-predictor", "aesthetic-model.pth"


class CLIPSimilarity(Reward):
    """Shared embedding code: a transformers `CLIPModel`, its tokenizer and a torch preprocessor.

    Args:
        model: a `CLIPModel` (frozen, eval mode).
        tokenizer: its tokenizer; prompts are padded/truncated to the text tower's context length.
        preprocess: an `ImagePreprocessor` built from the model's image processor config.
    """

    def __init__(self, model: nn.Module, tokenizer, preprocess: ImagePreprocessor):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.preprocess = preprocess
        self.max_length = min(tokenizer.model_max_length, model.config.text_config.max_position_embeddings)

    def image_embeddings(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) in [0, 1] -> (B, projection_dim) unit-norm image embeddings."""
        pixels = self.preprocess(images).to(self.model.dtype)
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        return F.normalize(self.model.visual_projection(pooled).float(), dim=-1)

    def text_embeddings(self, prompts: list[str]) -> torch.Tensor:
        """B prompts -> (B, projection_dim) unit-norm text embeddings."""
        tokens = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=self.max_length,
                                return_tensors="pt").to(self.device)
        pooled = self.model.text_model(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).pooler_output
        return F.normalize(self.model.text_projection(pooled).float(), dim=-1)

    def cosine(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """(B,) cosine similarity of each image with its own prompt."""
        return (self.image_embeddings(images) * self.text_embeddings(prompts)).sum(-1)


def _load_clip(model_name: str, processor_name: str, purpose: str, local_files_only: bool | None, dtype):
    with needs_extra("rewards", f"Loading {purpose}"):
        from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    local = resolve_local_files_only(local_files_only)
    model = load_weights(lambda: CLIPModel.from_pretrained(model_name, local_files_only=local), model_name, purpose)
    if dtype is not None:
        model = model.to(dtype)
    tokenizer = load_weights(lambda: AutoTokenizer.from_pretrained(processor_name, local_files_only=local),
                             processor_name, f"{purpose} (its tokenizer)")
    image_processor = load_weights(lambda: AutoImageProcessor.from_pretrained(processor_name, local_files_only=local),
                                   processor_name, f"{purpose} (its image processor config)")
    return model, tokenizer, ImagePreprocessor.from_image_processor(image_processor)


class PickScore(CLIPSimilarity):
    """PickScore (Kirstain et al., 2023): a CLIP-H/14 finetuned on Pick-a-Pic human preferences.

    score = scale * logit_scale.exp() * cos(image, prompt); `scale=0.01` gives the numbers that
    diffusion-RL papers report.
    """

    def __init__(self, model, tokenizer, preprocess, scale: float = 1.0):
        super().__init__(model, tokenizer, preprocess)
        self.scale = scale

    @classmethod
    def from_pretrained(cls, model: str = PICKSCORE_MODEL, processor: str = CLIP_H14, scale: float = 1.0,
                        local_files_only: bool | None = None, dtype: torch.dtype | None = None) -> "PickScore":
        """Load by hub name or local directory (the model and, separately, the CLIP-H processor)."""
        return cls(*_load_clip(model, processor, "the PickScore reward", local_files_only, dtype), scale=scale)

    def score(self, images, prompts):
        return self.scale * self.model.logit_scale.exp().float() * self.cosine(images, prompts)



class HPSv21(CLIPSimilarity):
    """HPSv2.1 (Wu et al., 2023): an open_clip ViT-H/14 finetuned on Human Preference Dataset v2.

    score = cos(image, prompt), the value HPSv2's `score()` returns (V-GRPO's FLUX table:
    0.313 -> 0.372).

    The official weights are an open_clip checkpoint. open_clip is not a dependency here: its
    ViT-H/14 is architecturally the transformers `CLIPModel` of
    "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", so `from_pretrained` builds that model from the
    laion config and loads the HPS weights through `open_clip_to_transformers`, a key renaming
    (plus splitting the fused q/k/v projections and transposing the output projections).
    """

    @classmethod
    def from_pretrained(cls, checkpoint: str = HPSV21_REPO, filename: str = HPSV21_FILE, base: str = CLIP_H14,
                        local_files_only: bool | None = None, dtype: torch.dtype | None = None) -> "HPSv21":
        """Load the HPSv2.1 open_clip checkpoint into a transformers CLIPModel.

        Args:
            checkpoint: a local .pt file, or a hub repo holding `filename`.
            filename: the checkpoint file inside the hub repo.
            base: hub name or directory of a transformers CLIP-H/14 (config, tokenizer, image
                processor; its weights are not loaded).
        """
        purpose = "the HPSv2.1 reward"
        with needs_extra("rewards", "The HPSv2.1 reward"):
            from transformers import CLIPConfig, CLIPModel

        local = resolve_local_files_only(local_files_only)
        path = _local_or_hub_file(checkpoint, filename, local, purpose)
        config, tokenizer, image_processor = load_config_and_processors(CLIPConfig, base, local, purpose, "CLIP-H/14")
        state = torch.load(path, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state)
        model = CLIPModel(config)
        _load_strict_params(model, open_clip_to_transformers(state))
        if dtype is not None:
            model = model.to(dtype)
        return cls(model, tokenizer, ImagePreprocessor.from_image_processor(image_processor))

    def score(self, images, prompts):
        return self.cosine(images, prompts)


def open_clip_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename an open_clip CLIP state dict (ViT image tower, standard text tower) to transformers' CLIPModel.

    open_clip stores attention as one fused `in_proj_weight` (3W, W) in q, k, v order (torch's
    `nn.MultiheadAttention`), and the two output projections as (width, embed) matrices applied as
    `x @ proj`; transformers has separate q/k/v Linear layers and (embed, width) Linear weights.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        key = key.removeprefix("module.")
        if key in ("text_projection", "visual.proj"):
            out["text_projection.weight" if key == "text_projection" else "visual_projection.weight"] = value.t().contiguous()
            continue
        if key.endswith("attn_mask"):
            continue
        tower, rest = ("vision_model", key[len("visual."):]) if key.startswith("visual.") else ("text_model", key)
        block = re.match(r"transformer\.resblocks\.(\d+)\.(.+)", rest)
        if block:
            layer, name = block.groups()
            prefix = f"{tower}.encoder.layers.{layer}."
            if name.startswith("attn.in_proj_"):
                kind = name.rsplit("_", 1)[1]
                for proj, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                    out[f"{prefix}self_attn.{proj}.{kind}"] = part.contiguous()
                continue
            out[prefix + _BLOCK_NAMES[name.rsplit(".", 1)[0]] + "." + name.rsplit(".", 1)[1]] = value
            continue
        if rest in _TOP_LEVEL_NAMES[tower]:
            out[_TOP_LEVEL_NAMES[tower][rest]] = value
            continue
        raise KeyError(f"unexpected open_clip key {key!r}")
    return out


_BLOCK_NAMES = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
                "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
_TOP_LEVEL_NAMES = {
    "text_model": {
        "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
        "positional_embedding": "text_model.embeddings.position_embedding.weight",
        "ln_final.weight": "text_model.final_layer_norm.weight",
        "ln_final.bias": "text_model.final_layer_norm.bias",
        "logit_scale": "logit_scale",
    },
    "vision_model": {
        "class_embedding": "vision_model.embeddings.class_embedding",
        "positional_embedding": "vision_model.embeddings.position_embedding.weight",
        "conv1.weight": "vision_model.embeddings.patch_embedding.weight",
        "ln_pre.weight": "vision_model.pre_layrnorm.weight",
        "ln_pre.bias": "vision_model.pre_layrnorm.bias",
        "ln_post.weight": "vision_model.post_layernorm.weight",
        "ln_post.bias": "vision_model.post_layernorm.bias",
    },
}


def _load_strict_params(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """load_state_dict that tolerates only missing buffers (position ids), never missing weights."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    params = dict(model.named_parameters())
    missing = [k for k in missing if k in params]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {missing[:8]}, unexpected {unexpected[:8]}")


def _local_or_hub_file(checkpoint: str, filename: str, local_files_only: bool, purpose: str) -> str:
    if os.path.isfile(checkpoint):
        return checkpoint
    from huggingface_hub import hf_hub_download

    return load_weights(lambda: hf_hub_download(checkpoint, filename, local_files_only=local_files_only),
                        f"{checkpoint}/{filename}", purpose)


class CLIPScore(CLIPSimilarity):
    """CLIPScore (Hessel et al., 2021): prompt-image agreement under an off-the-shelf CLIP.

    score = weight * max(cos, 0); weight=100 is torchmetrics' convention, Hessel et al. use 2.5.
    """

    def __init__(self, model, tokenizer, preprocess, weight: float = 100.0):
        super().__init__(model, tokenizer, preprocess)
        self.weight = weight

    @classmethod
    def from_pretrained(cls, model: str = CLIP_L14, processor: str | None = None, weight: float = 100.0,
                        local_files_only: bool | None = None, dtype: torch.dtype | None = None) -> "CLIPScore":
        """Load any transformers CLIP checkpoint (processor defaults to the model's own)."""
        return cls(*_load_clip(model, processor or model, "the CLIPScore reward", local_files_only, dtype), weight=weight)

    def score(self, images, prompts):
        return self.weight * self.cosine(images, prompts).clamp(min=0)


class ScoreMLP(nn.Module):
    """The 5-layer MLP score head of the LAION aesthetic predictor (on a unit-norm CLIP image
    embedding) and of ImageReward (on BLIP's fused [CLS] feature): the same layout in both releases,
    with state-dict keys `layers.{0,2,4,6,7}`; the dropouts are inert at inference.
    """

    def __init__(self, embed_dim: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(embed_dim, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.layers(embeddings)


class LAIONAesthetic(CLIPSimilarity):
    """LAION aesthetic score (about 1-10): the MLP head on CLIP ViT-L/14 image embeddings; the prompt is unused.

    DDPO's aesthetic reward; the head weights are the LAION "sac+logos+ava1-l14-linearMSE" predictor,
    mirrored on the hub as trl-lib/ddpo-aesthetic-predictor/aesthetic-model.pth.
    """

    def __init__(self, model, tokenizer, preprocess, head: ScoreMLP):
        super().__init__(model, tokenizer, preprocess)
        self.head = head.eval().requires_grad_(False)

    @classmethod
    def from_pretrained(cls, clip: str = CLIP_L14, head: str = AESTHETIC_REPO, head_filename: str = AESTHETIC_FILE,
                        local_files_only: bool | None = None, dtype: torch.dtype | None = None) -> "LAIONAesthetic":
        """Load the CLIP tower (hub name or directory) and the MLP head (.pth file or hub repo)."""
        purpose = "the LAION aesthetic reward"
        model, tokenizer, preprocess = _load_clip(clip, clip, purpose, local_files_only, dtype)
        path = _local_or_hub_file(head, head_filename, resolve_local_files_only(local_files_only), purpose)
        mlp = ScoreMLP(model.config.projection_dim)
        mlp.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return cls(model, tokenizer, preprocess, mlp)

    def score(self, images, prompts):
        return self.head(self.image_embeddings(images)).squeeze(-1)


register_reward("pickscore")(PickScore.from_pretrained)
register_reward("hpsv21")(HPSv21.from_pretrained)
register_reward("clipscore")(CLIPScore.from_pretrained)
register_reward("aesthetic")(LAIONAesthetic.from_pretrained)
