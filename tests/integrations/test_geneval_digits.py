"""GenEval on digits: the prompt grammar and its disjoint splits, the synthetic compositions, the detector."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from vgrpo_lib.integrations.rewards.geneval import GENEVAL_TAGS, Detection, GenEvalReward, load_geneval_metadata
from vgrpo_lib.integrations.testbed.checkpoints import DETECTOR_NAMES, read_card
from vgrpo_lib.integrations.testbed.geneval_digits.compositions import CELLS, compose, ink_boxes
from vgrpo_lib.integrations.testbed.geneval_digits.detector import DigitDetector, crop_colors, decode
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import COLORS, geneval_specs, write_geneval_files
from vgrpo_lib.integrations.testbed.geneval_digits.reward import geneval_digits_reward, geneval_digits_scorer, geneval_digits_table
from vgrpo_lib.integrations.testbed.geneval_digits.train_detector import coco_ap50, detection_targets

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


# ---- synthetic compositions, the colour rule and the detector's encoding ----

def _oracle(comp):
    """A perfect detector: the ground-truth objects of each composition at confidence 1."""
    def detector(images):
        return [[Detection(str(d), 1.0, tuple(b)) for d, b in zip(lab[p].tolist(), box[p].tolist())]
                for lab, box, p in zip(comp.labels, comp.boxes, comp.present)]
    return detector


def _some_specs_of_every_category(per_tag=20):
    return [s for tag in GENEVAL_TAGS for s in geneval_specs("eval", tags=(tag,))[:per_tag]]


@pytest.mark.parametrize("layout", ["free", "cells", "slots"])
def test_compositions_satisfy_their_specs_under_geneval_rules(layout):
    specs = _some_specs_of_every_category()
    comp = compose(specs, "eval", torch.Generator().manual_seed(3), layout=layout)
    assert comp.images.shape == (len(specs), 3, 64, 64) and 0 <= comp.images.min() and comp.images.max() <= 1
    results = GenEvalReward(_oracle(comp), color_classifier=crop_colors).evaluate(comp.images, specs)
    assert all(r.correct and r.strict_correct and r.score == 1.0 for r in results), [
        (s["prompt"], r.reasons) for s, r in zip(specs, results) if not r.correct]
    blurred = torch.lerp(comp.images, F.avg_pool2d(comp.images, 3, 1, 1, count_include_pad=False), 0.7)
    colours = [crop_colors(img, box[p]) for img, box, p in zip(blurred, comp.boxes, comp.present)]
    assert colours == [[COLORS[c] for c in col[p].tolist()] for col, p in zip(comp.colors, comp.present)]


@pytest.mark.parametrize("layout", ["free", "cells", "slots"])
def test_composition_boxes_are_the_tight_boxes_of_the_ink(layout):
    comp = compose(_some_specs_of_every_category(10), "train", torch.Generator().manual_seed(4), layout=layout)
    ys, xs = torch.meshgrid(torch.arange(64) + 0.5, torch.arange(64) + 0.5, indexing="ij")
    for image, boxes in zip(comp.images, comp.boxes):
        boxes = boxes[(boxes[:, 2] > boxes[:, 0])]
        inside = ((xs >= boxes[:, 0, None, None] - 1) & (xs <= boxes[:, 2, None, None] + 1)
                  & (ys >= boxes[:, 1, None, None] - 1) & (ys <= boxes[:, 3, None, None] + 1)).any(dim=0)
        assert not (image.amax(dim=0)[~inside] > 0.5).any(), "ink outside every box"
        for x0, y0, x1, y1 in boxes.tolist():  # each edge touches ink (within 1.5 px)
            strip = image.amax(dim=0)[int(y0):int(y1) + 1, int(x0):int(x1) + 1] > 0.1
            rows, cols = strip.any(dim=1).nonzero()[:, 0], strip.any(dim=0).nonzero()[:, 0]
            assert abs(int(y0) + rows[0] - y0) <= 1.5 and abs(int(y0) + rows[-1] + 1 - y1) <= 1.5
            assert abs(int(x0) + cols[0] - x0) <= 1.5 and abs(int(x0) + cols[-1] + 1 - x1) <= 1.5


def _cells_of(comp) -> torch.Tensor:
    """(N, K) the grid cell (reading order) of each object's ink centre; asserts the centre lies away from the
    cell's border by at least the jitter's margin (ink is centred in its frame up to a few pixels)."""
    side = 64 / CELLS
    centres = (comp.boxes[..., :2] + comp.boxes[..., 2:]) / 2
    cells = (centres // side).long()
    offsets = centres - (cells + 0.5) * side
    assert (offsets[comp.present].abs() <= side / 2 - 3).all()
    return cells[..., 1] * CELLS + cells[..., 0]


def test_the_cells_layout_puts_every_object_in_its_own_cell_of_the_grid():
    comp = compose(_some_specs_of_every_category(), "train", torch.Generator().manual_seed(6), layout="cells")
    index = _cells_of(comp)
    for row, present in zip(index, comp.present):
        assert len(set(row[present].tolist())) == int(present.sum())
    assert set(index[comp.present].tolist()) == set(range(CELLS * CELLS))  # every cell gets used
    for first in (0, 1):  # random cells: the first object mentioned is not always in the same one
        assert len(set(index[:, first][comp.present[:, first]].tolist())) > 1
    with pytest.raises(ValueError, match="unknown composition layout 'grid'"):
        compose(_some_specs_of_every_category(1), layout="grid")


def test_the_slots_layout_puts_the_kth_object_mentioned_in_cell_k_and_a_position_pair_where_its_relation_says():
    specs = _some_specs_of_every_category()
    comp = compose(specs, "train", torch.Generator().manual_seed(7), layout="slots")
    index = _cells_of(comp)
    # Written out per relation: "a <subject> REL a <target>" (target first in the spec), cells in reading order
    # 0 1 / 2 3 of the 2x2 grid.
    expected_pair = {"left of": [1, 0], "right of": [0, 1], "above": [2, 0], "below": [0, 2]}
    seen = set()
    for spec, row, present in zip(specs, index, comp.present):
        clauses = [c for c in spec["include"] if "position" in c]
        cells = row[present].tolist()
        if clauses:
            relation = clauses[0]["position"][0]
            seen.add(relation)
            assert cells == expected_pair[relation], spec["prompt"]
        else:
            assert cells == list(range(len(cells))), spec["prompt"]
    assert seen == set(expected_pair)
    outside_grammar = {"prompt": "a 1 and a 2 and a 3 left of the 1", "include": [
        {"class": 1, "count": 1}, {"class": 2, "count": 1}, {"class": 3, "count": 1, "position": ["left of", 0]}]}
    with pytest.raises(ValueError, match="second object relative to its first"):
        compose([outside_grammar], layout="slots")


def test_ink_boxes_and_bad_specs():
    digits = torch.zeros(2, 1, 28, 28)
    digits[0, 0, 5:9, 10:20] = 1.0
    assert ink_boxes(digits).tolist() == [[10.0, 5.0, 20.0, 9.0], [0.0, 0.0, 28.0, 28.0]]
    five = {"tag": "counting", "prompt": "five 3s", "include": [{"class": "3", "count": 5}]}
    with pytest.raises(ValueError, match="asks for 5 objects"):
        compose([five])


def test_detector_targets_decode_back_to_the_boxes():
    comp = compose(_some_specs_of_every_category(8), "train", torch.Generator().manual_seed(5))
    cls, reg, centre = detection_targets(comp, 16)
    assert int(centre.sum()) == int(comp.present.sum()) and (cls[~centre] <= 0).all()
    head = torch.zeros(len(cls), 15, 16, 16)
    head[:, 0] = 10.0
    head[:, :11] = torch.where(centre[:, None], F.one_hot(cls.clamp_min(0), 11).permute(0, 3, 1, 2) * 20.0,
                               head[:, :11])
    head[:, 11:13], head[:, 13:15] = torch.logit(reg[:, :2].clamp(1e-6, 1 - 1e-6)), reg[:, 2:]
    b, label, score, box = decode(head)
    assert (score > 0.99).all() and len(b) == int(comp.present.sum())
    for i in range(len(cls)):
        want = sorted(zip(comp.labels[i][comp.present[i]].tolist(), comp.boxes[i][comp.present[i]].tolist()))
        got = sorted(zip(label[b == i].tolist(), box[b == i].tolist()))
        assert [w[0] for w in want] == [g[0] for g in got]
        torch.testing.assert_close(torch.tensor([w[1] for w in want]), torch.tensor([g[1] for g in got]),
                                   atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="multiples of 4"):
        DigitDetector()(torch.zeros(1, 3, 30, 30))


def test_coco_ap50_scores_perfect_wrong_and_missing_detections():
    boxes = [torch.tensor([[0.0, 0.0, 10.0, 12.0], [30.0, 30.0, 44.0, 50.0]]), torch.tensor([[5.0, 40.0, 20.0, 60.0]])]
    labels = [torch.tensor([3, 7]), torch.tensor([3])]
    b, box = torch.tensor([0, 0, 1]), torch.cat(boxes)
    label, score = torch.cat(labels), torch.tensor([0.9, 0.8, 0.7])
    ap, recall = coco_ap50(boxes, labels, b, label, score, box)
    assert ap[3] == pytest.approx(1.0) and ap[7] == pytest.approx(1.0) and recall[3] == recall[7] == 1.0
    assert ap[0] == -1.0, "no 0 in the ground truth"
    ap, recall = coco_ap50(boxes, labels, b, torch.tensor([3, 1, 3]), score, box)
    assert ap[7] == 0.0 and recall[7] == 0.0 and ap[3] == pytest.approx(1.0)
    shifted = box + torch.tensor([[8.0, 0.0, 8.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # IoU 2/18
    assert coco_ap50(boxes, labels, b, label, score, shifted)[1][3] == 0.5
    assert coco_ap50(boxes, labels, b[:0], label[:0], score[:0], box[:0])[1][3] == 0.0


# ---- the shipped detector and judge ----

def test_shipped_detector_and_judge_are_independent_and_read_held_out_renderings():
    cards = {name: read_card(name) for name in DETECTOR_NAMES}
    assert "'train'" in cards["digit_detector"]["card"]["data"] and "'judge'" in cards["digit_detector_judge"]["card"]["data"]
    assert cards["digit_detector"]["config"] != cards["digit_detector_judge"]["config"]
    specs = _some_specs_of_every_category(12)
    comp = compose(specs, "eval", torch.Generator().manual_seed(11))
    scorers = {name: geneval_digits_scorer(name) for name in DETECTOR_NAMES}
    tables = geneval_digits_table(comp.images, specs, {"detector": scorers["digit_detector"],
                                                       "judge": scorers["digit_detector_judge"]})
    for name, table in zip(DETECTOR_NAMES, tables.values()):
        claimed = cards[name]["card"]["metrics"]["geneval_on_exact_renderings"]["overall"]
        assert table["overall"] >= claimed - 0.15, (name, table, claimed)  # 72 renderings vs the card's 2812
    blank = geneval_digits_reward()(torch.zeros(4, 3, 64, 64), [s["prompt"] for s in specs[::15][:4]])
    assert (blank <= 0).all(), "nothing drawn earns no credit"
    with pytest.raises(ValueError, match="unknown detector"):
        geneval_digits_scorer("classifier")
