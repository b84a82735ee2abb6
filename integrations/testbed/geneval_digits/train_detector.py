"""Train the shipped digit detector and its independent judge on synthetic compositions, and measure them.

    python -m vgrpo_lib.integrations.testbed.geneval_digits.train_detector {digit_detector,digit_detector_judge} ...

`digit_detector` (the reward's detector) sees compositions of MNIST-5k split "train" digits;
`digit_detector_judge` (evaluation only, never a reward) a narrower net with other dilations and
seed, on the DISJOINT split "judge". Each batch is fresh compositions of random GenEval specs of
every category (train and eval prompts alike: the detector learns digits and boxes, not prompts)
plus some blank canvases, with light pixel noise. Both are measured on compositions of the held-out
split "eval" (digits neither saw): mAP at IoU 0.5 and per-class recall at GenEval's two confidence
thresholds (torchmetrics' COCO evaluation), colour accuracy of `crop_colors` on their true boxes,
and GenEval's accuracy per category on exact renderings of the eval prompts (the ceiling a perfect
generator would reach under each). Writes `checkpoints/NAME.{safetensors,json}`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time

import numpy as np

import torch
import torch.nn.functional as F

from vgrpo_lib.integrations.rewards.geneval import GenEvalReward, geneval_table
from vgrpo_lib.integrations.testbed.checkpoints import save_checkpoint
from vgrpo_lib.integrations.testbed.geneval_digits.compositions import CANVAS, Compositions, compose
from vgrpo_lib.integrations.testbed.geneval_digits.detector import (
    NUM_CLASSES, STRIDE, DetectorPlugin, DigitDetector, crop_colors, decode,
)
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import COLORS, geneval_specs

__all__ = [
    "NUM_THREADS", "RECIPES", "TRAINING", "detection_targets", "detector_loss", "random_batch", "train_detector",
    "coco_ap50", "held_out_metrics", "build", "main",
]

NUM_THREADS = 1  # small convolutions: a second thread only adds contention on a shared 2-core machine
RECIPES = {
    "digit_detector": dict(split="train", channels=(40, 40), dilations=(1, 2, 4, 1), seed=0),
    "digit_detector_judge": dict(split="judge", channels=(32, 32), dilations=(1, 3, 1, 3), seed=1),
}
TRAINING = dict(steps=1400, batch_size=32, lr=3e-3, weight_decay=1e-4, blank_fraction=0.05, max_noise=0.06,
                max_blur=0.7)


def detection_targets(comp: Compositions, grid: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training targets on a grid x grid head.

    Returns cls (N, grid, grid) int64: 1 + digit at each object's centre cell, -100 (ignored) at its
    8 neighbours, 0 elsewhere; reg (N, 4, grid, grid): centre offset within the cell and log size in
    cells at the centre cells; centre (N, grid, grid) bool.
    """
    n = comp.labels.shape[0]
    box = comp.boxes / STRIDE
    centre_xy = (box[..., :2] + box[..., 2:]) / 2
    cell = centre_xy.floor().long().clamp(0, grid - 1)
    flat = cell[..., 1] * grid + cell[..., 0]
    present = comp.present
    cls = torch.zeros(n, grid * grid, dtype=torch.long)
    reg = torch.zeros(n, grid * grid, 4)
    rows = torch.arange(n)[:, None].expand_as(flat)
    cls[rows[present], flat[present]] = comp.labels[present] + 1
    values = torch.cat([centre_xy - cell, (box[..., 2:] - box[..., :2]).clamp_min(0.25).log()], dim=-1)
    reg[rows[present], flat[present]] = values[present]
    cls, reg = cls.view(n, grid, grid), reg.view(n, grid, grid, 4).permute(0, 3, 1, 2)
    centre = cls > 0
    near = F.max_pool2d(centre[:, None].float(), 3, 1, 1)[:, 0] > 0
    cls = torch.where(near & ~centre, torch.full_like(cls, -100), cls)
    return cls, reg, centre


def detector_loss(head: torch.Tensor, comp: Compositions) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, hit rate): the mean cross-entropy over centre cells plus that over background cells (so the
    few centres weigh as much as the many background cells; neighbours of centres are ignored), plus the
    L1 box regression at the centres; the hit rate is the fraction of centre cells whose digit gets
    probability > 0.5 (a training diagnostic)."""
    cls, reg, centre = detection_targets(comp, head.shape[-1])
    ce = F.cross_entropy(head[:, : 1 + NUM_CLASSES], cls.clamp_min(0), reduction="none")
    background = cls == 0
    loss = ce[centre].mean() + ce[background].mean()
    pred = torch.cat([head[:, 11:13].sigmoid(), head[:, 13:15]], dim=1)
    hits = (-ce[centre]).exp() > 0.5
    return loss + (pred - reg).abs().sum(dim=1)[centre].mean(), hits.float().mean()


def random_batch(specs: list[dict], split: str, batch_size: int, generator: torch.Generator,
                 blank_fraction: float, max_noise: float, max_blur: float) -> Compositions:
    """Compositions of random specs, a fraction of them blanked (no object), blurred (a random mix of up to
    `max_blur` of a 3x3 box blur) and with uniform pixel noise (up to `max_noise`)."""
    idx = torch.randint(len(specs), (batch_size,), generator=generator)
    comp = compose([specs[i] for i in idx], split, generator)
    blank = torch.rand(batch_size, generator=generator) < blank_fraction
    noise = torch.rand(batch_size, 1, 1, 1, generator=generator) * max_noise
    images = comp.images * ~blank[:, None, None, None]
    mix = torch.rand(batch_size, 1, 1, 1, generator=generator) * max_blur
    images = torch.lerp(images, F.avg_pool2d(images, 3, 1, 1, count_include_pad=False), mix)
    images = (images + noise * torch.rand(images.shape, generator=generator)).clamp(0, 1)
    labels = torch.where(blank[:, None], -1, comp.labels)
    return Compositions(images, comp.boxes, labels, torch.where(blank[:, None], -1, comp.colors))


def train_detector(model: DigitDetector, split: str, seed: int, steps: int, batch_size: int, lr: float,
                   weight_decay: float, blank_fraction: float, max_noise: float, max_blur: float,
                   log_every: int = 100) -> list[float]:
    """AdamW with a cosine schedule on fresh random batches; returns the loss every `log_every` steps."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    specs = geneval_specs("all")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    model.train()
    losses = []
    for step in range(steps):
        batch = random_batch(specs, split, batch_size, generator, blank_fraction, max_noise, max_blur)
        loss, hits = detector_loss(model(batch.images), batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            losses.append(round(loss.item(), 4))
            print(f"step {step}: loss {loss.item():.4f}, centre hits {hits.item():.3f}", flush=True)
    model.eval()
    return losses


def coco_ap50(images_boxes: list[torch.Tensor], images_labels: list[torch.Tensor], b: torch.Tensor,
              label: torch.Tensor, score: torch.Tensor, box: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-class AP and recall (at most 100 detections per image) at IoU 0.5 by the COCO evaluator (pycocotools).

    Ground truth: boxes (K_i, 4) and labels (K_i,) per image; detections as `decode` returns them.
    Returns two lists over digits 0..9 (AP is -1 for a class without ground truth).
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    def xywh(bx):
        return [bx[0], bx[1], bx[2] - bx[0], bx[3] - bx[1]]

    annotations = []
    for i, (boxes, labels) in enumerate(zip(images_boxes, images_labels)):
        for c, bx in zip(labels.tolist(), boxes.tolist()):
            annotations.append(dict(id=len(annotations) + 1, image_id=i, category_id=c + 1, bbox=xywh(bx),
                                    area=(bx[2] - bx[0]) * (bx[3] - bx[1]), iscrowd=0))
    gt = COCO()
    gt.dataset = dict(images=[dict(id=i) for i in range(len(images_boxes))], annotations=annotations,
                      categories=[dict(id=d + 1) for d in range(NUM_CLASSES)])
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
        results = [dict(image_id=i, category_id=c + 1, bbox=xywh(bx), score=s)
                   for i, c, s, bx in zip(b.tolist(), label.tolist(), score.tolist(), box.tolist())]
        evaluator = COCOeval(gt, gt.loadRes(results) if results else COCO(), "bbox")
        evaluator.params.iouThrs = np.array([0.5])
        evaluator.evaluate()
        evaluator.accumulate()
    precision = evaluator.eval["precision"][0, :, :, 0, -1]  # (recall points, classes), -1 = undefined
    ap = [float(p[p > -1].mean()) if (p > -1).any() else -1.0 for p in precision.T]
    recall = [float(r) for r in evaluator.eval["recall"][0, :, 0, -1]]
    return ap, recall


@torch.no_grad()
def held_out_metrics(model: DigitDetector, n: int = 1500, seed: int = 7, renderings_per_prompt: int = 4) -> dict:
    """mAP@0.5 and per-class recall at scores > 0.3 / > 0.9 on `n` compositions of split "eval"; colour
    accuracy on the true boxes; GenEval's table on `renderings_per_prompt` exact renderings of each eval prompt."""
    generator = torch.Generator().manual_seed(seed)
    specs = geneval_specs("all")
    comp = compose([specs[i] for i in torch.randint(len(specs), (n,), generator=generator)], "eval", generator)
    b, label, score, box = decode(model(comp.images))
    gt_boxes = [bx[p] for bx, p in zip(comp.boxes, comp.present)]
    gt_labels = [lab[p] for lab, p in zip(comp.labels, comp.present)]
    metrics: dict = {"compositions": n, "objects": int(comp.present.sum())}
    ap, _ = coco_ap50(gt_boxes, gt_labels, b, label, score, box)
    metrics["map_50"] = round(sum(ap) / len(ap), 4)
    metrics["ap_50_per_class"] = [round(v, 4) for v in ap]
    for cutoff in (0.3, 0.9):
        keep = score > cutoff
        _, recall = coco_ap50(gt_boxes, gt_labels, b[keep], label[keep], score[keep], box[keep])
        metrics[f"recall_at_{cutoff}"] = round(sum(recall) / len(recall), 4)
        metrics[f"recall_at_{cutoff}_per_class"] = [round(v, 4) for v in recall]
    hits = [crop_colors(img, bx[p]) == [COLORS[c] for c in col[p].tolist()]
            for img, bx, col, p in zip(comp.images, comp.boxes, comp.colors, comp.present)]
    metrics["colour_accuracy_images"] = round(sum(hits) / n, 4)
    eval_specs = geneval_specs("eval") * renderings_per_prompt
    rendered = compose(eval_specs, "eval", generator)
    reward = GenEvalReward(DetectorPlugin(model), color_classifier=crop_colors)
    results = reward.evaluate(rendered.images, eval_specs)
    metrics["renderings_per_eval_prompt"] = renderings_per_prompt
    metrics["geneval_on_exact_renderings"] = {
        k: round(v, 4) for k, v in geneval_table([r.tag for r in results], [r.correct for r in results]).items()}
    return metrics


def build(name: str) -> dict:
    recipe = RECIPES[name]
    torch.manual_seed(recipe["seed"])
    model = DigitDetector(recipe["channels"], recipe["dilations"])
    start = time.perf_counter()
    losses = train_detector(model, recipe["split"], recipe["seed"], **TRAINING)
    wall = time.perf_counter() - start
    save_checkpoint(name, model, {"metrics": None})  # keep the weights even if the measurement fails
    metrics = held_out_metrics(model)
    card = {
        "data": f"compositions of MNIST-5k split {recipe['split']!r} digits on {CANVAS}x{CANVAS} canvases "
                "(vgrpo_lib.integrations.testbed.geneval_digits.compositions), random GenEval-digit specs, fresh every step",
        "role": "reward detector" if name == "digit_detector" else "independent judge: never a reward",
        "seed": recipe["seed"], **TRAINING, "losses_every_100_steps": losses, "wall_time_s": round(wall, 1),
        "torch_threads": torch.get_num_threads(), "parameters": sum(p.numel() for p in model.parameters()),
        "metrics": {"data": "compositions of MNIST-5k split 'eval' digits (seen by neither detector)",
                     "classes": "ap/recall lists are for digits 0..9", **metrics},
    }
    save_checkpoint(name, model, card)
    return card


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", choices=list(RECIPES))
    args = parser.parse_args(argv)
    torch.set_num_threads(NUM_THREADS)
    for name in args.names:
        card = build(name)
        print(f"{name}: {json.dumps(card['metrics'])} in {card['wall_time_s']} s", flush=True)


if __name__ == "__main__":
    main()
