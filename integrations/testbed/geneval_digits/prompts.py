"""GenEval's six prompt categories with the ten digits as objects, as GenEval metadata, split train / eval.

Grammar (D, D1, D2 digits 0-9 with D1 != D2; C, C1, C2 in COLORS with C1 != C2; N in two, three, four;
the article "a" is "an" before 8, as GenEval writes "an apple"):

    single_object  "a D"                        include [{D, 1}]
    two_object     "a D1 and a D2"              include [{D1, 1}, {D2, 1}]
    counting       "N Ds"                       include [{D, N}], exclude [{D, N + 1}]
    colors         "a C D"                      include [{D, 1, C}]
    position       "a D1 REL a D2"              include [{D2, 1}, {D1, 1, position [R, 0]}]
    color_attr     "a C1 D1 and a C2 D2"        include [{D1, 1, C1}, {D2, 1, C2}]

where REL is "to the left of", "to the right of", "above" or "below" and R GenEval's relation name
("left of", "right of", "above", "below"). Each spec is a dict with GenEval's keys (`tag`,
`include` of `{class, count, color?, position?}`, `exclude` for counting, `prompt`), exactly the
structure of GenEval's `evaluation_metadata.jsonl` (its `prompts/create_prompts.py`), so the
scoring in `vgrpo_lib.integrations.rewards.geneval` reads them unchanged.

Train and eval prompts are disjoint, and so are their meanings: prompts that say the same thing
("a 3 and a 9" / "a 9 and a 3"; "a 2 to the left of a 6" / "a 6 to the right of a 2"; "a red 3 and
a blue 8" / "a blue 8 and a red 3") form one group, and whole groups go to one split. In every
category a fixed seeded permutation of the groups puts EVAL_FRACTION of them (at least 3) in eval.

    python -m vgrpo_lib.integrations.testbed.geneval_digits.prompts OUT_DIR   # writes GenEval's two files per split
"""

from __future__ import annotations

import argparse
import itertools
import json
from functools import lru_cache
from pathlib import Path

import numpy as np

from vgrpo_lib.integrations.rewards.geneval import GENEVAL_TAGS

__all__ = [
    "DIGITS", "COLORS", "COUNT_WORDS", "POSITION_PHRASES", "EVAL_FRACTION", "SPLITS", "geneval_specs",
    "write_geneval_files", "main",
]

DIGITS = tuple(str(d) for d in range(10))
COLORS = ("red", "green", "blue", "yellow", "white")
COUNT_WORDS = {2: "two", 3: "three", 4: "four"}
POSITION_PHRASES = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below"}
_MIRROR = {"right of": "left of", "below": "above"}
EVAL_FRACTION = 0.3
_SPLIT_SEED = 20261102
SPLITS = ("train", "eval", "all")


def _a(word: str) -> str:
    return f"an {word}" if word == "8" else f"a {word}"


def _all_specs() -> dict[str, list[tuple[object, dict]]]:
    """{tag: [(group key, spec)]} for every prompt of every category."""
    out: dict[str, list[tuple[object, dict]]] = {tag: [] for tag in GENEVAL_TAGS}
    for d in DIGITS:
        out["single_object"].append((d, {"tag": "single_object", "include": [{"class": d, "count": 1}],
                                         "prompt": _a(d)}))
        for n, word in COUNT_WORDS.items():
            out["counting"].append(((d, n), {"tag": "counting", "include": [{"class": d, "count": n}],
                                             "exclude": [{"class": d, "count": n + 1}], "prompt": f"{word} {d}s"}))
        for c in COLORS:
            out["colors"].append(((d, c), {"tag": "colors", "include": [{"class": d, "count": 1, "color": c}],
                                           "prompt": f"a {c} {d}"}))
    for a, b in itertools.permutations(DIGITS, 2):
        out["two_object"].append((frozenset((a, b)), {
            "tag": "two_object", "include": [{"class": a, "count": 1}, {"class": b, "count": 1}],
            "prompt": f"{_a(a)} and {_a(b)}"}))
        for relation, phrase in POSITION_PHRASES.items():
            key = (b, _MIRROR[relation], a) if relation in _MIRROR else (a, relation, b)
            out["position"].append((key, {
                "tag": "position", "include": [{"class": b, "count": 1},
                                               {"class": a, "count": 1, "position": [relation, 0]}],
                "prompt": f"{_a(a)} {phrase} {_a(b)}"}))
        for ca, cb in itertools.permutations(COLORS, 2):
            out["color_attr"].append((frozenset(((a, ca), (b, cb))), {
                "tag": "color_attr", "include": [{"class": a, "count": 1, "color": ca},
                                                 {"class": b, "count": 1, "color": cb}],
                "prompt": f"a {ca} {a} and a {cb} {b}"}))
    return out


@lru_cache(maxsize=1)
def _split_specs() -> dict[str, tuple[dict, ...]]:
    rng = np.random.default_rng(_SPLIT_SEED)
    parts: dict[str, list[dict]] = {"train": [], "eval": []}
    for tag, entries in _all_specs().items():
        groups = list(dict.fromkeys(key for key, _ in entries))
        order = rng.permutation(len(groups))
        n_eval = max(3, int(round(EVAL_FRACTION * len(groups))))
        held_out = {groups[i] for i in order[:n_eval]}
        for key, spec in entries:
            parts["eval" if key in held_out else "train"].append(spec)
    return {"train": tuple(parts["train"]), "eval": tuple(parts["eval"]),
            "all": tuple(parts["train"]) + tuple(parts["eval"])}


def geneval_specs(split: str = "all", tags: tuple[str, ...] = GENEVAL_TAGS) -> list[dict]:
    """GenEval metadata dicts of `split` ("train", "eval" or "all") in the categories `tags`.

    Fresh copies (callers may modify them); category order as in GENEVAL_TAGS, then a fixed order.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    unknown = set(tags) - set(GENEVAL_TAGS)
    if unknown:
        raise ValueError(f"unknown GenEval tags {sorted(unknown)}; expected some of {GENEVAL_TAGS}")
    return [json.loads(json.dumps(spec)) for spec in _split_specs()[split] if spec["tag"] in tags]


def write_geneval_files(out_dir: str | Path, split: str) -> Path:
    """Write GenEval's `evaluation_metadata.jsonl` and `generation_prompts.txt` for `split` into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = geneval_specs(split)
    (out / "evaluation_metadata.jsonl").write_text("".join(json.dumps(s) + "\n" for s in specs))
    (out / "generation_prompts.txt").write_text("".join(s["prompt"] + "\n" for s in specs))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write GenEval-on-digits metadata files per split.")
    parser.add_argument("out_dir")
    args = parser.parse_args(argv)
    for split in ("train", "eval"):
        path = write_geneval_files(Path(args.out_dir) / split, split)
        print(f"{split}: {len(geneval_specs(split))} prompts -> {path}")


if __name__ == "__main__":
    main()
