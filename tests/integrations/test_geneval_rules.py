"""GenEval's scoring rules, pinned by hand-built box sets and checked against transcriptions of the public code.

Transcribed references (logic restated, not copied):
- djghosh13/geneval, evaluation/evaluate_images.py: `relative_position`, `compute_iou`, `evaluate`.
- yifan123/reward-server, reward_server/gen_eval.py: `evaluate_reward` (Flow-GRPO's GenEval training score).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib.integrations.rewards.geneval import (
    RELATIONS, Detection, GenEvalReward, GenEvalRules, box_iou, flow_grpo_score, geneval_correct, geneval_table,
    relative_position, select_objects,
)

RULES = GenEvalRules()


def reference_relative_position(box_a, box_b, c=0.1):
    """djghosh13/geneval evaluation/evaluate_images.py `relative_position`, restated with numpy."""
    boxes = np.array([box_a, box_b], dtype=np.float64).reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=-2)
    dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - c * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    return {name for name, holds in zip(RELATIONS, [dx < -0.5, dx > 0.5, dy < -0.5, dy > 0.5]) if holds}


def reference_iou(a, b):
    """djghosh13/geneval evaluation/evaluate_images.py `compute_iou` (inclusive pixel widths)."""
    def area(box):
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)
    inter = area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])
    union = area(a) + area(b) - inter
    return inter / union if union else 0


def reference_flow_grpo_score(objects, spec, colors_of):
    """yifan123/reward-server reward_server/gen_eval.py `evaluate_reward`: the per-clause terms and their mean."""
    rewards, groups, correct = [], [], True
    for req in spec.get("include", []):
        found = objects.get(req["class"], [])
        rewards.append(1 - abs(req["count"] - len(found)) / req["count"])
        matched = True
        if len(found) != req["count"]:
            correct = matched = False
            if "color" in req or "position" in req:
                rewards.append(0.0)
        else:
            if "color" in req:
                colors = colors_of(found)
                rewards.append(1 - abs(req["count"] - colors.count(req["color"])) / req["count"])
                if colors.count(req["color"]) != req["count"]:
                    correct = matched = False
            if "position" in req and matched:
                rel, target = req["position"]
                if groups[target] is None:
                    correct = matched = False
                    rewards.append(0.0)
                else:
                    for obj in found:
                        for tgt in groups[target]:
                            if rel not in reference_relative_position(obj.box, tgt.box):
                                correct = matched = False
                                rewards.append(0.0)
                                break
                        if not matched:
                            break
                    rewards.append(1.0)
        groups.append(found if matched else None)
    return (sum(rewards) / len(rewards) if rewards else 0), correct


def reference_evaluate(objects, spec, colors_of):
    """djghosh13/geneval evaluation/evaluate_images.py `evaluate`: is the image correct."""
    correct, groups = True, []
    for req in spec.get("include", []):
        matched = True
        found = objects.get(req["class"], [])[: req["count"]]
        if len(found) < req["count"]:
            correct = matched = False
        else:
            if "color" in req and colors_of(found).count(req["color"]) < req["count"]:
                correct = matched = False
            if "position" in req and matched:
                rel, target = req["position"]
                if groups[target] is None:
                    correct = matched = False
                elif any(rel not in reference_relative_position(o.box, t.box) for o in found for t in groups[target]):
                    correct = matched = False
        groups.append(found if matched else None)
    for req in spec.get("exclude", []):
        if len(objects.get(req["class"], [])) >= req["count"]:
            correct = False
    return correct


def own_colors(objects):
    return [d.color for d in objects]


def det(label, box, score=0.95, color="white"):
    return Detection(label, score, tuple(float(v) for v in box), color)


def position_spec(a, relation, b, count_a=1):
    return {"tag": "position", "prompt": f"{a} {relation} {b}",
            "include": [{"class": b, "count": 1}, {"class": a, "count": count_a, "position": [relation, 0]}]}


def correct(detections, spec, rules=RULES):
    return geneval_correct(select_objects(detections, spec["tag"], rules), spec, own_colors, rules)[0]


# ---- the three failures of the old rules named by issue 11 ----

def test_right_of_rejects_a_box_that_is_mostly_below():
    three = det("3", (0, 0, 10, 10))
    seven_below = det("7", (6, 30, 16, 40))  # 6 px to the right, 30 px down
    assert relative_position(torch.tensor(seven_below.box), torch.tensor(three.box)).tolist() == [False, False, False, True]
    assert not correct([three, seven_below], position_spec("7", "right of", "3"))
    assert correct([three, seven_below], position_spec("7", "below", "3"))
    assert correct([three, det("7", (30, 4, 40, 14))], position_spec("7", "right of", "3"))


def test_two_sevens_right_of_a_three_need_both_on_the_right():
    three = det("3", (27, 27, 37, 37))
    left, right, far_right = det("7", (0, 27, 10, 37)), det("7", (50, 27, 60, 37)), det("7", (50, 5, 60, 15), 0.9)
    spec = position_spec("7", "right of", "3", count_a=2)
    assert not correct([three, left, right], spec), "one 7 on each side must fail"
    assert correct([three, right, far_right], spec)
    assert flow_grpo_score(select_objects([three, left, right], "position"), spec, own_colors)[0] == pytest.approx(
        (1 + 1 + 0 + 1) / 4)


def test_a_half_confident_detection_does_not_count_for_counting():
    sure, unsure = det("4", (0, 0, 10, 10), 0.95), det("4", (30, 30, 40, 40), 0.5)
    two_fours = {"tag": "counting", "prompt": "two 4s", "include": [{"class": "4", "count": 2}],
                 "exclude": [{"class": "4", "count": 3}]}
    assert not correct([sure, unsure], two_fours)
    assert correct([sure, det("4", (30, 30, 40, 40), 0.91)], two_fours)
    assert [len(v) for v in select_objects([sure, unsure], "two_object").values()] == [2], "0.3 elsewhere"
    assert list(select_objects([det("4", (0, 0, 9, 9), 0.9)], "counting")) == [], "the threshold is exclusive"


# ---- the remaining rules ----

def test_counting_exclude_clause_rejects_too_many():
    fours = [det("4", (20 * i, 0, 20 * i + 10, 10)) for i in range(3)]
    spec = {"tag": "counting", "prompt": "two 4s", "include": [{"class": "4", "count": 2}],
            "exclude": [{"class": "4", "count": 3}]}
    ok, reasons = geneval_correct(select_objects(fours, "counting"), spec, own_colors)
    assert not ok and reasons == ["expected 4<3, found 3"]
    assert correct(fours[:2], spec)


def test_colour_is_judged_on_the_most_confident_objects_only():
    spec = {"tag": "colors", "prompt": "a red 5", "include": [{"class": "5", "count": 1, "color": "red"}]}
    assert not correct([det("5", (0, 0, 9, 9), 0.9, "blue"), det("5", (30, 0, 39, 9), 0.8, "red")], spec)
    assert correct([det("5", (0, 0, 9, 9), 0.8, "blue"), det("5", (30, 0, 39, 9), 0.9, "red")], spec)


def test_colour_attribution_binds_each_colour_to_its_digit():
    spec = {"tag": "color_attr", "prompt": "a red 3 and a blue 8",
            "include": [{"class": "3", "count": 1, "color": "red"}, {"class": "8", "count": 1, "color": "blue"}]}
    assert correct([det("3", (0, 0, 9, 9), color="red"), det("8", (30, 0, 39, 9), color="blue")], spec)
    assert not correct([det("3", (0, 0, 9, 9), color="blue"), det("8", (30, 0, 39, 9), color="red")], spec)


def test_position_without_its_target_fails_and_max_objects_caps_each_class():
    spec = position_spec("2", "left of", "6")
    ok, reasons = geneval_correct(select_objects([det("2", (0, 0, 9, 9))], "position"), spec, own_colors)
    assert not ok and reasons == ["expected 6>=1, found 0", "no target for 2 to be left of"]
    many = [det("1", (3 * i, 0, 3 * i + 2, 2), 0.5 + i / 100) for i in range(20)]
    kept = select_objects(many, "single_object")["1"]
    assert len(kept) == 16 and kept[0].score == pytest.approx(0.69) and kept[-1].score == pytest.approx(0.54)


def test_overlap_suppression_is_greedy_per_class_and_off_by_default():
    boxes = [det("9", (0, 0, 19, 19), 0.9), det("9", (2, 0, 21, 19), 0.8), det("9", (40, 0, 59, 19), 0.7),
             det("6", (2, 0, 21, 19), 0.6)]
    assert [len(v) for v in select_objects(boxes, "single_object").values()] == [3, 1]
    suppressed = select_objects(boxes, "single_object", GenEvalRules(nms_threshold=0.5))
    assert [d.score for d in suppressed["9"]] == [0.9, 0.7] and len(suppressed["6"]) == 1


def test_flow_grpo_partial_credit_values():
    spec = {"tag": "counting", "prompt": "two 7s", "include": [{"class": "7", "count": 2}],
            "exclude": [{"class": "7", "count": 3}]}
    sevens = [det("7", (15 * i, 0, 15 * i + 9, 9)) for i in range(5)]
    for n, expected in [(0, 0.0), (1, 0.5), (2, 1.0), (3, 0.5), (5, -0.5)]:
        score, strict = flow_grpo_score(select_objects(sevens[:n], "counting"), spec, own_colors)
        assert score == pytest.approx(expected) and strict == (n == 2)
    colour = {"tag": "colors", "prompt": "a red 5", "include": [{"class": "5", "count": 1, "color": "red"}]}
    assert flow_grpo_score({}, colour, own_colors) == (0.0, False)
    assert flow_grpo_score({"5": [det("5", (0, 0, 9, 9), color="blue")]}, colour, own_colors) == (0.5, False)


def test_summary_overall_is_the_mean_of_the_category_accuracies():
    table = geneval_table(["counting", "single_object", "single_object", "single_object", "single_object"],
                          [False, True, True, True, False])
    assert table == {"single_object": 0.75, "counting": 0.0, "overall": 0.375}
    with pytest.raises(ValueError, match="unknown GenEval tags"):
        geneval_table(["photo"], [True])


def test_reward_end_to_end_with_a_crop_colour_classifier():
    calls = []

    def detector(images):
        return [[det("3", (0, 0, 9, 9)), det("8", (40, 0, 49, 9))]] * images.shape[0]

    def color_classifier(image, boxes):
        calls.append(boxes.tolist())
        return ["red" if box[0] < 20 else "blue" for box in boxes.tolist()]

    spec = {"tag": "color_attr", "prompt": "a red 3 and a blue 8",
            "include": [{"class": "3", "count": 1, "color": "red"}, {"class": "8", "count": 1, "color": "blue"}]}
    swapped = {**spec, "prompt": "a blue 3 and a red 8",
               "include": [{"class": "3", "count": 1, "color": "blue"}, {"class": "8", "count": 1, "color": "red"}]}
    reward = GenEvalReward(detector, {s["prompt"]: s for s in (spec, swapped)}, color_classifier=color_classifier)
    images = torch.zeros(2, 3, 64, 64)
    assert reward(images, ["a red 3 and a blue 8", "a blue 3 and a red 8"]).tolist() == [1.0, 0.0]
    assert [0.0, 0.0, 9.0, 9.0] in calls[0]
    partial = GenEvalReward(detector, {s["prompt"]: s for s in (spec, swapped)}, partial=True,
                            color_classifier=color_classifier)
    assert partial(images, ["a blue 3 and a red 8"] * 2).tolist() == [0.5, 0.5]
    with pytest.raises(ValueError, match="needs a 'tag'"):
        GenEvalReward(detector, {"x": {"prompt": "x", "include": []}})(images[:1], ["x"])
    with pytest.raises(ValueError, match="unknown position relation"):
        correct([det("3", (0, 0, 9, 9)), det("8", (40, 0, 49, 9))], position_spec("8", "beside", "3"))


# ---- agreement with the transcribed public code ----

coord = st.integers(0, 63)


@st.composite
def boxes(draw):
    x0, y0 = draw(coord), draw(coord)
    return (x0, y0, x0 + draw(st.integers(0, 30)), y0 + draw(st.integers(0, 30)))


@settings(max_examples=300, deadline=None)
@given(boxes(), boxes())
def test_relative_position_matches_geneval(a, b):
    ours = relative_position(torch.tensor(a), torch.tensor(b))
    assert {name for name, holds in zip(RELATIONS, ours.tolist()) if holds} == reference_relative_position(a, b)
    swapped = relative_position(torch.tensor(b), torch.tensor(a)).tolist()
    assert ours.tolist() == [swapped[1], swapped[0], swapped[3], swapped[2]], "left/right and above/below mirror"
    assert box_iou(torch.tensor([a], dtype=torch.float64), torch.tensor([b], dtype=torch.float64)).item() == \
        pytest.approx(reference_iou(a, b))


@st.composite
def scenes(draw):
    classes = ["1", "2", "3"]
    dets = [Detection(draw(st.sampled_from(classes)), draw(st.floats(0.0, 1.0)), draw(boxes()),
                      draw(st.sampled_from(["red", "blue"]))) for _ in range(draw(st.integers(0, 7)))]
    include = []
    for i in range(draw(st.integers(1, 3))):
        req = {"class": draw(st.sampled_from(classes)), "count": draw(st.integers(1, 3))}
        if draw(st.booleans()):
            req["color"] = draw(st.sampled_from(["red", "blue"]))
        if i and draw(st.booleans()):
            req["position"] = [draw(st.sampled_from(RELATIONS)), draw(st.integers(0, i - 1))]
        include.append(req)
    tag = draw(st.sampled_from(["counting", "position", "color_attr"]))
    exclude = [{"class": draw(st.sampled_from(classes)), "count": draw(st.integers(1, 4))}] if draw(st.booleans()) else []
    return dets, {"tag": tag, "prompt": "p", "include": include, "exclude": exclude}


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_partial_credit_equals_flow_grpo_evaluate_reward(scene):
    dets, spec = scene
    objects = select_objects(dets, spec["tag"])
    score, strict = flow_grpo_score(objects, spec, own_colors)
    ref_score, ref_strict = reference_flow_grpo_score(objects, spec, own_colors)
    assert score == pytest.approx(ref_score) and strict == ref_strict
    assert geneval_correct(objects, spec, own_colors)[0] == reference_evaluate(objects, spec, own_colors)
