"""The natural-language prompt grammar of MNIST-SD3.

Two tasks, each with a ``"train"`` and an ``"eval"`` prompt set:

* digit task: one handwritten digit, e.g. ``"a handwritten seven"``, ``"the digit 7"``. Four templates,
  each with the digit as a word ("seven") or a numeral ("7"), give eight phrasings per digit. The eval
  set is the three phrasings held out of training (``EVAL_PHRASINGS``); every template and both forms
  still occur in training, so eval prompts are new *combinations* of known words. The digits
  themselves cannot be held out (there are only ten), so the split is over phrasings.
* number task (OCR): ``"the number 42"``, ``"the number 407"``: every two- and three-digit number
  (10..999). The eval numbers (a seeded 20% of the two-digit and 10% of the three-digit numbers) never
  occur in training, so the eval set measures whether the model composes digits it was not shown
  together.

``parse_digit`` / ``parse_number`` invert the grammar and raise ``ValueError`` naming the prompt for
anything outside it. ``VOCABULARY`` lists the whole words the tokenizers keep as single tokens
(numerals are tokenized one digit at a time by the CLIP pre-tokenizer, so they need no entries).
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

__all__ = [
    "SPLITS", "DIGIT_WORDS", "DIGIT_TEMPLATES", "FORMS", "EVAL_PHRASINGS", "NUMBER_TEMPLATE", "NUMBER_RANGE",
    "VOCABULARY", "digit_phrasings", "digit_prompts", "number_prompts", "parse_digit", "parse_number",
]

SPLITS = ("train", "eval")

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGIT_TEMPLATES = ("a handwritten {}", "the digit {}", "a picture of the digit {}", "an image of a handwritten {}")
FORMS = ("word", "numeral")
# (template index, form) pairs held out of training; each template and each form also occurs in training.
EVAL_PHRASINGS = ((1, "word"), (2, "numeral"), (3, "word"))

NUMBER_TEMPLATE = "the number {}"
NUMBER_RANGE = (10, 999)  # inclusive: every two- and three-digit number
_EVAL_FRACTIONS = {2: 0.2, 3: 0.1}  # share of the n-digit numbers held out for evaluation
_NUMBER_SPLIT_SEED = 20261202

VOCABULARY = tuple(sorted({word for template in (*DIGIT_TEMPLATES, NUMBER_TEMPLATE)
                           for word in template.replace("{}", "").split()} | set(DIGIT_WORDS)))


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


def _phrase(template: int, form: str, digit: int) -> str:
    return DIGIT_TEMPLATES[template].format(DIGIT_WORDS[digit] if form == "word" else str(digit))


def digit_phrasings(split: str) -> list[tuple[int, str]]:
    """The ``(template index, form)`` pairs of a split: 5 for ``"train"``, 3 for ``"eval"``."""
    _check_split(split)
    every = [(t, f) for t in range(len(DIGIT_TEMPLATES)) for f in FORMS]
    return [p for p in every if (p in EVAL_PHRASINGS) == (split == "eval")]


def digit_prompts(split: str) -> list[tuple[str, int]]:
    """``(prompt, digit)`` for every phrasing of the split and every digit 0..9 (50 train, 30 eval)."""
    return [(_phrase(t, f, d), d) for t, f in digit_phrasings(split) for d in range(10)]


@lru_cache(maxsize=1)
def _eval_numbers() -> frozenset[int]:
    rng = np.random.default_rng(_NUMBER_SPLIT_SEED)
    held_out = []
    for length, fraction in _EVAL_FRACTIONS.items():
        numbers = np.arange(10 ** (length - 1), 10**length)
        held_out += rng.choice(numbers, size=int(round(fraction * len(numbers))), replace=False).tolist()
    return frozenset(held_out)


def number_prompts(split: str) -> list[tuple[str, str]]:
    """``(prompt, number as a string)`` for the split's numbers in increasing order (882 train, 108 eval)."""
    _check_split(split)
    held_out = _eval_numbers()
    numbers = [n for n in range(NUMBER_RANGE[0], NUMBER_RANGE[1] + 1) if (n in held_out) == (split == "eval")]
    return [(NUMBER_TEMPLATE.format(n), str(n)) for n in numbers]


def _digit_patterns() -> list[tuple[re.Pattern, str]]:
    value = "(" + "|".join(DIGIT_WORDS) + r"|\d)"
    return [(re.compile("^" + re.escape(t).replace(r"\{\}", value) + "$"), t) for t in DIGIT_TEMPLATES]


_DIGIT_PATTERNS = _digit_patterns()
_NUMBER_PATTERN = re.compile("^" + re.escape(NUMBER_TEMPLATE).replace(r"\{\}", r"([1-9]\d{1,2})") + "$")


def parse_digit(prompt: str) -> int:
    """The digit a digit-task prompt asks for: ``"a handwritten seven"`` -> 7, ``"the digit 7"`` -> 7.

    Raises ``ValueError`` (naming the prompt and the templates) for a prompt outside the grammar.
    """
    text = " ".join(str(prompt).lower().split())
    for pattern, _ in _DIGIT_PATTERNS:
        match = pattern.match(text)
        if match:
            value = match.group(1)
            return int(value) if value.isdigit() else DIGIT_WORDS.index(value)
    raise ValueError(f"prompt {prompt!r} is not a digit prompt; expected one of the templates "
                     f"{', '.join(repr(t) for t in DIGIT_TEMPLATES)} with a digit 0-9 or its name")


def parse_number(prompt: str) -> str:
    """The number a number-task prompt asks for, as a string: ``"the number 407"`` -> ``"407"``.

    Raises ``ValueError`` for a prompt outside ``"the number N"`` with N in 10..999 (no leading zeros).
    """
    match = _NUMBER_PATTERN.match(" ".join(str(prompt).lower().split()))
    if match is None:
        raise ValueError(f"prompt {prompt!r} is not a number prompt; expected {NUMBER_TEMPLATE!r} with a two- or "
                         f"three-digit number {NUMBER_RANGE[0]}..{NUMBER_RANGE[1]}")
    return match.group(1)
