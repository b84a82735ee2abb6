"""GenEval on digits as a reward and as an independent evaluation, from the shipped detectors.

    reward = geneval_digits_reward()                      # Flow-GRPO's partial credit, for training
    strict = geneval_digits_reward(partial=False)         # GenEval's 0/1 correctness
    judge = geneval_digits_scorer("digit_detector_judge")  # evaluation only, never a reward
    results = judge.evaluate(images, specs)               # per image: tag, correct, score, reasons

Both use GenEval's rules from `vgrpo_lib.integrations.rewards.geneval` (one implementation for hub models and
the testbed), the digit detector as the plug-in and `crop_colors` as the crop colour classifier.
"""

from __future__ import annotations

from vgrpo_lib.integrations.rewards.geneval import GenEvalReward, GenEvalRules, geneval_table
from vgrpo_lib.integrations.testbed.checkpoints import DETECTOR_NAMES, load_pretrained
from vgrpo_lib.integrations.testbed.geneval_digits.detector import DetectorPlugin, crop_colors
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import geneval_specs

__all__ = ["geneval_digits_scorer", "geneval_digits_reward", "geneval_digits_table"]


def geneval_digits_scorer(detector: str = "digit_detector", partial: bool = False,
                          rules: GenEvalRules = GenEvalRules()) -> GenEvalReward:
    """GenEval's rules on the shipped detector `detector` (one of DETECTOR_NAMES), specs of every digit prompt."""
    if detector not in DETECTOR_NAMES:
        raise ValueError(f"unknown detector {detector!r}; valid detectors: {', '.join(DETECTOR_NAMES)}")
    specs = {spec["prompt"]: spec for spec in geneval_specs("all")}
    return GenEvalReward(DetectorPlugin(load_pretrained(detector)), specs, partial=partial, rules=rules,
                         color_classifier=crop_colors)


def geneval_digits_reward(partial: bool = True, rules: GenEvalRules = GenEvalRules()) -> GenEvalReward:
    """The training reward: the reward detector (never the judge) with Flow-GRPO's partial credit by default."""
    return geneval_digits_scorer("digit_detector", partial=partial, rules=rules)


def geneval_digits_table(images, specs, scorers: dict[str, GenEvalReward] | None = None) -> dict[str, dict[str, float]]:
    """GenEval's table (accuracy per category and overall) of images (N, 3, H, W) in [0, 1] against one spec
    each, under the reward detector and the judge side by side: {"detector": table, "judge": table}.

    `scorers` replaces the shipped pair ({"detector": ..., "judge": ...}, built once by the caller to
    avoid reloading). The judge's numbers beside the detector's show reward hacking as a gap.
    """
    scorers = scorers or {"detector": geneval_digits_scorer("digit_detector"),
                          "judge": geneval_digits_scorer("digit_detector_judge")}
    tags = [spec["tag"] for spec in specs]
    return {name: geneval_table(tags, [r.correct for r in scorer.evaluate(images, specs)])
            for name, scorer in scorers.items()}
