"""The prompt grammar of MNIST-Wan's ``motion`` task: a digit and the direction it moves.

``"a 3 moving left"``, ``"the digit three moving up"``: four templates, each with the digit as a word
("three") or a numeral ("3"), give eight phrasings per (digit, direction). The ``"eval"`` set is the three
phrasings held out of training (``EVAL_PHRASINGS``); every template and both forms still occur in training,
so eval prompts are new *combinations* of known words (the 40 digit-direction pairs are too few to hold
any out), as MNIST-SD3's digit prompts split.

``parse_motion`` inverts the grammar and raises ``ValueError`` naming the prompt for anything outside it.
``VOCABULARY`` lists the whole words (and numerals) the tokenizer keeps as single tokens.
"""

from __future__ import annotations

import re

from .render import DIRECTIONS

__all__ = [
    "SPLITS", "DIGIT_WORDS", "TEMPLATES", "FORMS", "EVAL_PHRASINGS", "VOCABULARY", "phrasings", "motion_prompts",
    "parse_motion",
]

SPLITS = ("train", "eval")
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TEMPLATES = ("a {} moving {}", "the digit {} moving {}", "a handwritten {} moving {}", "a {} that moves {}")
FORMS = ("word", "numeral")
# (template index, form) pairs held out of training; each template and each form also occurs in training.
EVAL_PHRASINGS = ((1, "word"), (2, "numeral"), (3, "word"))

VOCABULARY = tuple(sorted({word for template in TEMPLATES for word in template.replace("{}", "").split()}
                          | set(DIGIT_WORDS) | set(DIRECTIONS) | {str(d) for d in range(10)}))


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


def phrasings(split: str) -> list[tuple[int, str]]:
    """The ``(template index, form)`` pairs of a split: 5 for ``"train"``, 3 for ``"eval"``."""
    _check_split(split)
    every = [(t, f) for t in range(len(TEMPLATES)) for f in FORMS]
    return [p for p in every if (p in EVAL_PHRASINGS) == (split == "eval")]


def motion_prompts(split: str) -> list[tuple[str, int, int]]:
    """``(prompt, digit, direction index)`` for every phrasing of the split, digit 0..9 and direction
    (200 train, 120 eval), phrasing-major, then digit, then direction."""
    out = []
    for template, form in phrasings(split):
        for digit in range(10):
            name = DIGIT_WORDS[digit] if form == "word" else str(digit)
            out += [(TEMPLATES[template].format(name, direction), digit, k) for k, direction in enumerate(DIRECTIONS)]
    return out


def _patterns() -> list[re.Pattern]:
    digit = "(" + "|".join(DIGIT_WORDS) + r"|\d)"
    direction = "(" + "|".join(DIRECTIONS) + ")"
    patterns = []
    for template in TEMPLATES:
        body = re.escape(template).replace(r"\{\}", digit, 1).replace(r"\{\}", direction, 1)
        patterns.append(re.compile("^" + body + "$"))
    return patterns


_PATTERNS = _patterns()


def parse_motion(prompt: str) -> tuple[int, int]:
    """``(digit, direction index)`` a motion prompt asks for: ``"a three moving up"`` -> ``(3, 2)``.

    Raises ``ValueError`` (naming the prompt and the templates) for a prompt outside the grammar."""
    text = " ".join(str(prompt).lower().split())
    for pattern in _PATTERNS:
        match = pattern.match(text)
        if match:
            value, direction = match.groups()
            return (int(value) if value.isdigit() else DIGIT_WORDS.index(value)), DIRECTIONS.index(direction)
    raise ValueError(f"prompt {prompt!r} is not a motion prompt; expected one of the templates "
                     f"{', '.join(repr(t) for t in TEMPLATES)} with a digit 0-9 (or its name) and a direction in "
                     f"{DIRECTIONS}")
