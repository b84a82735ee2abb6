"""The reward zoo: every reward is `reward(images, prompts) -> (B,) float32`, registered by name.

    from vgrpo_lib.integrations.rewards import get_reward, available_rewards, MultiReward
    pick = get_reward("pickscore").to("cuda")          # loads yuvalkirstain/PickScore_v1
    scores = pick(images, prompts)                      # images (B, 3, H, W) in [0, 1]
    multi = MultiReward({"pickscore": 1.0, "ocr": 0.5})
    out = multi(images, prompts)                        # out.per_reward (B, 2), out.total (B,)

Registered names: pickscore, hpsv21, clipscore, aesthetic, imagereward (pretrained weights needed;
`MissingWeightsError` says which when they are absent), ocr, jpeg_compressibility (weight-free,
work offline) and geneval (needs a detector plug-in).
"""

from .base import MultiReward, MultiRewardOutput, Reward, available_rewards, get_reward, register_reward
from .clip_rewards import CLIPScore, HPSv21, LAIONAesthetic, PickScore, ScoreMLP, open_clip_to_transformers
from .geneval import (
    GENEVAL_TAGS, Detection, GenEvalResult, GenEvalReward, GenEvalRules, flow_grpo_score, geneval_correct,
    geneval_table, load_geneval_metadata, relative_position, select_objects,
)
from .image_reward import ImageReward, image_reward_to_transformers
from .loading import MissingWeightsError
from .preprocess import ImagePreprocessor
from .simple import JPEGCompressibility, OCRReward, quoted_text, text_similarity

__all__ = [
    "CLIPScore", "Detection", "GENEVAL_TAGS", "GenEvalResult", "GenEvalReward", "GenEvalRules", "HPSv21",
    "ImagePreprocessor", "ImageReward", "JPEGCompressibility", "LAIONAesthetic", "MissingWeightsError",
    "MultiReward", "MultiRewardOutput", "OCRReward", "PickScore", "Reward", "ScoreMLP", "available_rewards",
    "flow_grpo_score", "geneval_correct", "geneval_table", "get_reward", "image_reward_to_transformers",
    "load_geneval_metadata", "open_clip_to_transformers", "quoted_text", "register_reward", "relative_position",
    "select_objects", "text_similarity",
]
