"""The tasks of the shipped MNIST-SD3 pipelines, built through the hub path like SD3.5-Medium.

    from vgrpo_lib.integrations.tasks.mnist_sd3 import mnist_sd3_task

    task = mnist_sd3_task("digit", lora_rank=8, dtype="float32")   # a DiffusersTask on the shipped pipeline

``mnist_sd3_task(kind, **model_settings)`` is :func:`vgrpo_lib.integrations.tasks.hub.hub_task` on the hub
model ``"mnist-sd3"`` with the task's own prompts, reward, image size, evaluation metrics and labels filled in
where the model settings leave them unset (``None``); nothing else differs from ``sd3.5-medium``: the same
``DiffusersTask``, peft LoRA, adapters-off reference, ``"old"`` adapter, scheduler grid, VAE decode and prompt
cache.

| task    | prompts (train / eval, held out)              | image  | reward                                   | judge |
|---------|-----------------------------------------------|--------|------------------------------------------|-------|
| digit   | "a handwritten seven" (50 / 30 phrasings)     | 32x32  | the testbed CNN classifier's probability | MLP   |
| ocr     | "the number 407" (882 / 108 numbers 10..999)  | 32x96  | rapidocr, 1 - normalised edit distance   | MLP per digit slot |
| geneval | "a red 3 and a blue 8" (GenEval's 6 categories) | 64x64 | Flow-GRPO's partial-credit GenEval score (digit detector) | second detector |
| geneval_ocr | geneval's                                   | 64x64 | geneval's, and rapidocr reading the digits (order-free) | second detector |

``geneval`` (and ``geneval_ocr``, the same task under two rewards) runs on the second shipped pipeline,
MNIST-SD3-GenEval (``geneval_digits.pipeline``, trained on the compositions), through the same
``hub_task("mnist-sd3", path=...)``. Its training prompts are every ``"train"`` spec, repeated so that each of GenEval's six categories is drawn equally often (the raw list is 77% colour
attribution); its evaluation prompts are ``GENEVAL_EVAL_PER_CATEGORY`` held-out specs per category (fewer where
a category has fewer). ``accuracy`` is GenEval's overall score (the mean of the per-category accuracies under
GenEval's rules) by the reward detector, ``judge_accuracy`` the same by the judge detector (a different detector
trained on a disjoint MNIST split, never a reward), and ``geneval/<category>`` / ``judge_geneval/<category>`` the
per-category accuracies; ``accuracy_per_prompt`` is keyed by category.

Evaluation numbers (beside ``reward_mean``, ``diversity``): ``accuracy`` (digit: the reward classifier's top
class is the prompted digit; ocr: the task's reward is 1, i.e. the OCR reads the number in full), ``judge_accuracy`` (the
testbed's MLP judge, a different model family trained on a disjoint MNIST split and never a reward: on the
digit, or on every digit slot of the number), ``judge_gap = accuracy - judge_accuracy`` and
``accuracy_per_prompt`` keyed by the label. For ocr the two accuracies measure different readers (rapidocr
reads real handwritten numbers less often than the MLP reads their digits), so watch the change of the gap
during training, not its level.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from vgrpo_lib.integrations.rewards import MultiReward, get_reward
from vgrpo_lib.integrations.rewards.geneval import GENEVAL_TAGS
from vgrpo_lib.integrations.rewards.loading import MissingWeightsError
from vgrpo_lib.integrations.tasks.hub import TotalReward, hub_task
from vgrpo_lib.integrations.testbed.geneval_digits.compositions import CANVAS, CELLS
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import geneval_specs
from vgrpo_lib.integrations.testbed.geneval_digits.reward import (
    geneval_digits_reward, geneval_digits_scorer, geneval_digits_table,
)
from vgrpo_lib.integrations.testbed.mnist_sd3 import prompts as grammar
from vgrpo_lib.integrations.testbed.mnist_sd3 import render
from vgrpo_lib.integrations.testbed.rewards import DigitProbability
from vgrpo_lib.integrations.testbed.tasks import get_task
from vgrpo_lib.errors import UsageError

__all__ = ["GENEVAL_OCR_WEIGHTS", "MNIST_SD3_TASKS", "MnistSD3Spec", "PromptedDigitProbability", "accuracy_summary",
           "canvas_reading_view", "digit_metrics", "digit_reward", "geneval_category", "geneval_digits_text", "geneval_metrics",
           "geneval_ocr_reward", "geneval_prompts", "geneval_reading_reward", "geneval_reward", "mnist_sd3_task",
           "number_judge", "number_slots", "ocr_metrics", "ocr_reward", "testbed_classifiers"]

GENEVAL_EVAL_PER_CATEGORY = 24


def testbed_classifiers():
    """The testbed's frozen reward classifier (CNN) and independent judge (MLP), shared instances."""
    testbed = get_task("digit")
    return testbed.classifier(), testbed.judge()


class PromptedDigitProbability:
    """The testbed classifier's probability of the prompted digit on decoded RGB images: ``(B,)``.

    ``reward(images, prompts)``: images ``(B, 3, 32, 32)`` in [0, 1] (read through ``render.classifier_view``),
    prompts B digit-task strings (``prompts.parse_digit``).
    """

    def __init__(self):
        self.probability = DigitProbability(testbed_classifiers()[0])

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        digits = torch.tensor([grammar.parse_digit(p) for p in prompts])
        return self.probability(render.classifier_view(images), digits)


def digit_reward() -> PromptedDigitProbability:
    return PromptedDigitProbability()


def ocr_reward():
    """The reward zoo's OCR reward (Flow-GRPO's formula) reading the prompted number: recognition only on the
    inverted, upscaled canvas (``render.ocr_view``)."""
    return get_reward("ocr", target=grammar.parse_number, single_line=True, view=render.ocr_view)


def number_slots(length: int) -> list[int]:
    """Left pixel column of each digit of a ``length``-digit number on the ``NUMBER_SIZE`` canvas (as
    ``render.render_numbers`` places them: ``NUMBER_STRIDE`` apart, centred)."""
    width = render.NUMBER_SIZE[1]
    left = (width - render.MNIST_SIDE - (length - 1) * render.NUMBER_STRIDE) // 2
    return [left + i * render.NUMBER_STRIDE for i in range(length)]


def _per_prompt(correct: torch.Tensor, labels: list) -> dict[str, float]:
    keys = [str(label) for label in labels]
    out: dict[str, list[float]] = {}
    for key, hit in zip(keys, correct.tolist()):
        out.setdefault(key, []).append(float(hit))
    return {key: sum(hits) / len(hits) for key, hits in sorted(out.items())}


def accuracy_summary(correct: torch.Tensor, judged: torch.Tensor, labels: list) -> dict:
    """The headline metrics of a labelled task: ``accuracy`` (the reward side), ``judge_accuracy``, their gap and
    ``accuracy_per_prompt`` keyed by label, from ``(B,)`` booleans ``correct`` / ``judged``."""
    accuracy, judge_accuracy = correct.float().mean().item(), judged.float().mean().item()
    return {"accuracy": accuracy, "judge_accuracy": judge_accuracy, "judge_gap": accuracy - judge_accuracy,
            "accuracy_per_prompt": _per_prompt(correct, labels)}


@torch.no_grad()
def digit_metrics(images: torch.Tensor, prompts: list[str], rewards: torch.Tensor) -> dict:
    """Reward classifier and MLP judge accuracy on decoded digit images ``(B, 3, 32, 32)``."""
    classifier, judge = testbed_classifiers()
    view = render.classifier_view(images)
    digits = torch.tensor([grammar.parse_digit(p) for p in prompts])
    correct = classifier(view).argmax(-1) == digits
    judged = judge(view).argmax(-1) == digits
    return accuracy_summary(correct, judged, digits.tolist())


@torch.no_grad()
def number_judge(images: torch.Tensor, numbers: list[str]) -> torch.Tensor:
    """``(B,)`` bool: the MLP judge reads every digit slot of each number image ``(B, 3, 32, 96)`` right (each
    slot a 28x28 crop where ``render.render_numbers`` draws it)."""
    _, judge = testbed_classifiers()
    grey = render.grey(images).clamp(0, 1)
    top = (render.NUMBER_SIZE[0] - render.MNIST_SIDE) // 2
    side = render.MNIST_SIDE
    correct = torch.ones(len(numbers), dtype=torch.bool)
    for length in sorted({len(n) for n in numbers}):
        rows = torch.tensor([i for i, n in enumerate(numbers) if len(n) == length])
        crops = torch.stack([grey[rows, :, top:top + side, x0:x0 + side] for x0 in number_slots(length)], 1)
        wanted = torch.tensor([[int(c) for c in numbers[i]] for i in rows.tolist()])
        read = judge(crops.flatten(0, 1)).argmax(-1).view(len(rows), length)
        correct[rows] = (read == wanted).all(-1)
    return correct


@torch.no_grad()
def ocr_metrics(images: torch.Tensor, prompts: list[str], rewards: torch.Tensor) -> dict:
    """The ocr task's metrics: ``accuracy`` = share of images whose OCR reward ``rewards`` ``(B,)`` is 1 (the
    number read in full), ``judge_accuracy``: every digit slot read right by the MLP judge."""
    numbers = [grammar.parse_number(p) for p in prompts]
    return accuracy_summary(rewards >= 1.0, number_judge(images, numbers), numbers)


@lru_cache(maxsize=1)
def _geneval_specs() -> dict[str, dict]:
    return {spec["prompt"]: spec for spec in geneval_specs("all")}


def geneval_category(prompt: str) -> str:
    """The GenEval category (``tag``) of a GenEval digit prompt; a ValueError names an unknown prompt."""
    spec = _geneval_specs().get(prompt)
    if spec is None:
        raise ValueError(f"{prompt!r} is not a GenEval digit prompt (vgrpo_lib.integrations.testbed.geneval_digits.prompts)")
    return spec["tag"]


def geneval_prompts(split: str) -> list[tuple[str, str]]:
    """``(prompt, category)`` pairs: ``"train"`` every training spec, repeated so that every category has as many
    entries as the largest; ``"eval"`` up to ``GENEVAL_EVAL_PER_CATEGORY`` held-out specs per category, spread
    evenly over the category's list."""
    groups = [[s["prompt"] for s in geneval_specs(split, (tag,))] for tag in GENEVAL_TAGS]
    if split == "eval":
        groups = [g[::math.ceil(len(g) / GENEVAL_EVAL_PER_CATEGORY)] for g in groups]
    else:
        largest = max(len(g) for g in groups)
        groups = [(g * math.ceil(largest / len(g)))[:largest] for g in groups]
    return [(p, tag) for tag, group in zip(GENEVAL_TAGS, groups) for p in group]


def geneval_reward():
    """Flow-GRPO's partial-credit GenEval score by the shipped reward detector (``geneval_digits_reward``)."""
    return geneval_digits_reward(partial=True)


GENEVAL_OCR_WEIGHTS = {"geneval": 1.0, "ocr": 1.0}
"""Task ``geneval_ocr``: the weights of its two rewards (each normalised in its group first where
``advantage.multi_reward=normalize_then_sum``, the task's preset setting)."""
READING_GAP = 24
"""Blank pixels between the rows of cells in :func:`canvas_reading_view`'s line."""


def geneval_digits_text(prompt: str) -> str:
    """The digits a GenEval digit prompt asks for, one per object, sorted: ``"three 4s"`` -> ``"444"``, ``"a 9 and
    a 2"`` -> ``"29"``, ``"a red 3 above a blue 1"`` -> ``"13"``; a ValueError names an unknown prompt."""
    geneval_category(prompt)  # the error for an unknown prompt
    include = _geneval_specs()[prompt]["include"]
    return "".join(sorted("".join(str(clause["class"]) * clause["count"] for clause in include)))


def canvas_reading_view(images: torch.Tensor, gap: int = READING_GAP, blurs: int = 2) -> torch.Tensor:
    """MNIST-SD3-GenEval canvases ``(B, 3, 64, 64)`` as one line of text for the OCR reader: the canvas's rows of
    cells (``CELLS`` rows of ``CANVAS / CELLS`` pixels, the ``"slots"`` layout's reading order) side by side,
    ``gap`` blank pixels apart, strokes dark on white by their brightest channel (every tint reads dark, where
    luminance leaves a blue stroke faint), softened by ``blurs`` 3x3 box blurs (two: a 5x5 tent; rapidocr reads soft
    print edges better than MNIST's hard ones; on exact renderings of 128 training specs the mean reward rose
    from 0.48 to 0.59, ``results/mnist-sd3-geneval-pipeline/reading_view.log``): ``(B, 3, 32, 2 * 64 + gap)``."""
    if images.shape[-2:] != (CANVAS, CANVAS):
        raise ValueError(f"canvas_reading_view reads {CANVAS}x{CANVAS} canvases, got {tuple(images.shape[-2:])}")
    ink = images.amax(1, keepdim=True).clamp(0, 1)
    rows = ink.split(CANVAS // CELLS, dim=-2)
    blank = ink.new_zeros((*rows[0].shape[:-1], gap))
    line = torch.cat([part for row in rows for part in (row, blank)][:-1], dim=-1)
    for _ in range(blurs):
        line = F.avg_pool2d(line, 3, stride=1, padding=1)  # padded with zeros: no ink
    return (1.0 - line).expand(-1, 3, -1, -1)


def geneval_reading_reward():
    """The reward zoo's OCR reward on a GenEval canvas: rapidocr reads :func:`canvas_reading_view`'s line, scored
    order-free (``multiset_similarity``) against :func:`geneval_digits_text`: does the image show exactly the
    prompt's digits, legibly, wherever they are (an extra copy of a digit costs as a missing one does)."""
    return get_reward("ocr", target=geneval_digits_text, single_line=True, view=canvas_reading_view, order_free=True)


def geneval_ocr_reward():
    """GenEval (the detector's partial credit) and OCR (:func:`geneval_reading_reward`) on the same images, as
    DiffusionNFT's multi-reward runs score one image with several rewards: a ``TotalReward`` whose ``stack`` the
    trainer normalises per reward (``advantage.multi_reward``), weights ``GENEVAL_OCR_WEIGHTS``."""
    rewards = {"geneval": geneval_reward(), "ocr": geneval_reading_reward()}
    return TotalReward(MultiReward(GENEVAL_OCR_WEIGHTS, rewards=rewards))


@lru_cache(maxsize=1)
def _geneval_scorers() -> dict:
    return {"detector": geneval_digits_scorer("digit_detector"), "judge": geneval_digits_scorer("digit_detector_judge")}


@torch.no_grad()
def geneval_metrics(images: torch.Tensor, prompts: list[str], rewards: torch.Tensor) -> dict:
    """GenEval's tables (strict 0/1 correctness, GenEval's rules) of images ``(B, 3, 64, 64)`` by the reward
    detector and the judge: ``accuracy`` / ``judge_accuracy`` (overall), ``geneval/<category>`` /
    ``judge_geneval/<category>``, ``accuracy_per_prompt`` keyed by category."""
    specs = [_geneval_specs()[p] for p in prompts]
    tables = geneval_digits_table(images, specs, _geneval_scorers())
    detector, judge = dict(tables["detector"]), dict(tables["judge"])
    accuracy, judge_accuracy = detector.pop("overall"), judge.pop("overall")
    return {"accuracy": accuracy, "judge_accuracy": judge_accuracy, "judge_gap": accuracy - judge_accuracy,
            "accuracy_per_prompt": detector, **{f"geneval/{k}": v for k, v in detector.items()},
            **{f"judge_geneval/{k}": v for k, v in judge.items()}}


def _geneval_pipeline() -> tuple[Path, str]:
    # imported here: the pipeline module imports diffusers, which only this task's run needs
    from vgrpo_lib.integrations.testbed.geneval_digits import pipeline

    return pipeline.PIPELINE_DIR, pipeline.REBUILD_COMMAND


@dataclass(frozen=True)
class MnistSD3Spec:
    """What one MNIST-SD3 task brings: prompts per split, image size, reward, metrics (and the labels of the
    headline ones), label, and the shipped pipeline it runs on: ``pipeline()`` -> (folder, the command that builds
    it), ``None`` for MNIST-SD3's own."""

    prompts: Callable[[str], list[tuple[str, object]]]
    image_size: tuple[int, int]
    reward: Callable[[], Callable]
    metrics: Callable[[torch.Tensor, list[str], torch.Tensor], dict]
    label: Callable[[str], object]
    evaluation_metrics: dict[str, str]
    pipeline: Callable[[], tuple[Path, str]] | None = None


MNIST_SD3_TASKS = {
    "digit": MnistSD3Spec(grammar.digit_prompts, render.DIGIT_SIZE, digit_reward, digit_metrics, grammar.parse_digit,
                          {"accuracy": "classifier (reward model)", "judge_accuracy": "independent judge (MLP)"}),
    "ocr": MnistSD3Spec(grammar.number_prompts, render.NUMBER_SIZE, ocr_reward, ocr_metrics, grammar.parse_number,
                        {"accuracy": "OCR reads it (reward model)", "judge_accuracy": "independent judge (MLP)"}),
    "geneval": MnistSD3Spec(geneval_prompts, (64, 64), geneval_reward, geneval_metrics, geneval_category,
                            {"accuracy": "GenEval overall (reward detector)",
                             "judge_accuracy": "GenEval overall (judge detector)"}, pipeline=_geneval_pipeline),
}
MNIST_SD3_TASKS["geneval_ocr"] = dataclasses.replace(MNIST_SD3_TASKS["geneval"],  # the same task, two rewards
                                                     reward=geneval_ocr_reward)


def mnist_sd3_task(kind: str, *, path=None, prompts=None, eval_prompts=None, reward=None, image_size=None,
                   **settings):
    """The MNIST-SD3 task ``kind`` (``"digit"`` / ``"ocr"`` / ``"geneval"`` / ``"geneval_ocr"``) as a
    ``DiffusersTask`` through ``hub_task("mnist-sd3")`` on the task's shipped pipeline unless ``path`` names another; ``settings`` are the
    other ``hub_task`` arguments (the run config's ``model`` section)."""
    if kind not in MNIST_SD3_TASKS:
        raise UsageError(f"unknown MNIST-SD3 task {kind!r}; valid: {', '.join(MNIST_SD3_TASKS)}")
    spec = MNIST_SD3_TASKS[kind]
    if path is None and spec.pipeline is not None:
        folder, rebuild = spec.pipeline()
        if not (folder / "model_index.json").is_file():
            raise MissingWeightsError(f"Task 'mnist-sd3/{kind}' runs on the pipeline folder {folder}, which is not "
                                      f"built yet: run `{rebuild}` or set model.path=<pipeline directory>.")
        path = str(folder)
    return hub_task(
        "mnist-sd3",
        path=path,
        prompts=[p for p, _ in spec.prompts("train")] if prompts is None else prompts,
        eval_prompts=[p for p, _ in spec.prompts("eval")] if eval_prompts is None else eval_prompts,
        reward=spec.reward() if reward is None else reward,
        image_size=spec.image_size if image_size is None else image_size,
        metrics=spec.metrics,
        label=spec.label,
        evaluation_metrics=spec.evaluation_metrics,
        **settings,
    )
