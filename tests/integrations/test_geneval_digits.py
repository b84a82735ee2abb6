"""GenEval on digits: the prompt grammar and its disjoint splits."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from integrations.rewards.geneval import GENEVAL_TAGS, load_geneval_metadata
from integrations.testbed.geneval_digits.prompts import COLORS, geneval_specs, write_geneval_files

ARTICLE = r"an? (?:(?:red|green|blue|yellow|white) )?\d"
GRAMMAR = {
    "single_object": rf"^{ARTICLE}$",
    "two_object": rf"^{ARTICLE} and {ARTICLE}$",
    "counting": r"^(two|three|four) \ds$",
    "colors": rf"^{ARTICLE}$",
    "position": rf"^{ARTICLE} (to the left of|to the right of|above|below) {ARTICLE}$",
    "color_attr": rf"^{ARTICLE} and {ARTICLE}$",
}


def meaning(spec):
    """What a prompt asks for, independent of word order and of mirrored relations."""
    if spec["tag"] == "position":
        anchor, mover = spec["include"]
        relation = mover["position"][0]
        pairs = {"left of": (mover["class"], anchor["class"]), "right of": (anchor["class"], mover["class"]),
                 "above": (mover["class"], anchor["class"]), "below": (anchor["class"], mover["class"])}
        return "position", relation in ("left of", "right of"), pairs[relation]
    clauses = frozenset(json.dumps(req, sort_keys=True) for req in spec["include"])
    return spec["tag"], clauses


def test_every_category_follows_the_grammar_and_geneval_metadata():
    specs = geneval_specs("all")
    assert Counter(s["tag"] for s in specs) == {"single_object": 10, "two_object": 90, "counting": 30,
                                                "colors": 50, "position": 360, "color_attr": 1800}
    for spec in specs:
        assert re.match(GRAMMAR[spec["tag"]], spec["prompt"]), spec["prompt"]
        assert list(spec) == (["tag", "include", "exclude", "prompt"] if spec["tag"] == "counting"
                              else ["tag", "include", "prompt"])
        for req in spec["include"]:
            assert set(req) <= {"class", "count", "color", "position"} and req["class"] in "0123456789"
            assert req.get("color", "red") in COLORS
        words = spec["prompt"].split()
        digits = [w[0] for w in words if w[0].isdigit()]
        assert digits == [r["class"] for r in spec["include"]][:: -1 if spec["tag"] == "position" else 1]
    counting = next(s for s in specs if s["prompt"] == "three 4s")
    assert counting["include"] == [{"class": "4", "count": 3}] and counting["exclude"] == [{"class": "4", "count": 4}]
    right = next(s for s in specs if s["prompt"] == "a 2 to the right of an 8")
    assert right["include"] == [{"class": "8", "count": 1}, {"class": "2", "count": 1, "position": ["right of", 0]}]


def test_train_and_eval_are_disjoint_in_prompts_and_meanings_and_cover_every_category():
    train, held_out = geneval_specs("train"), geneval_specs("eval")
    assert not {s["prompt"] for s in train} & {s["prompt"] for s in held_out}
    assert not {meaning(s) for s in train} & {meaning(s) for s in held_out}
    assert len(train) + len(held_out) == len(geneval_specs("all"))
    for tag in GENEVAL_TAGS:
        n_train = sum(s["tag"] == tag for s in train)
        n_eval = sum(s["tag"] == tag for s in held_out)
        assert n_eval >= 3 and 0.2 < n_eval / (n_train + n_eval) < 0.4, tag
    assert geneval_specs("eval") == held_out, "deterministic"


def test_metadata_files_round_trip_through_geneval_reader(tmp_path):
    path = write_geneval_files(tmp_path, "eval")
    specs = load_geneval_metadata(str(path / "evaluation_metadata.jsonl"))
    assert list(specs.values()) == geneval_specs("eval")
    assert (path / "generation_prompts.txt").read_text().splitlines() == list(specs)
    with pytest.raises(ValueError, match="unknown split"):
        geneval_specs("test")
    with pytest.raises(ValueError, match="unknown GenEval tags"):
        geneval_specs("eval", tags=("photo",))
