"""Training and measuring the MNIST-Wan pipeline, resumable from its own checkpoints.

    python -m vgrpo_lib.integrations.testbed.mnist_wan.train --work DIR     # or: ... pretrain mnist_wan

Two stages, seeded and bitwise deterministic on one machine at ``NUM_THREADS`` torch thread; both use a
constant learning rate after warmup, so the first k steps of a longer run ARE the run of k steps:

1. VAE (``vae_loss``): ``AutoencoderKLWan`` on fresh clips every step (a random MNIST-5k ``"train"`` digit
   moving in a random direction, ``render.render_clips``). Loss: MNIST-SD3's L1 + MSE on pixels plus a tiny
   KL (``VAE_RECIPE["kl"]``); AdamW.
2. Flow (``flow_loss``): every ``"train"`` digit in every direction is encoded once (``latent_pool``);
   ``set_latent_statistics`` sets the VAE's per-channel ``latents_mean`` / ``latents_std`` from the posterior
   samples, which the pipeline un-normalises with, so the transformer sees latents of unit scale:
   ``z = (mean + std * eps - latents_mean) / latents_std``. The transformer and the UMT5 encoder then train
   jointly by rectified flow in the pipeline's conventions: ``x_t = (1 - t) z + t eps``, velocity target
   ``eps - z`` (what ``UniPCMultistepScheduler``'s ``flow_prediction`` converts with ``x0 = x_t - t v``),
   ``timestep = 1000 t``, ``t`` logit-normal; prompts of the ``"train"`` phrasings, replaced by ``""`` with
   probability ``p_uncond`` (caption dropout: the pipeline's negative prompt is ``""``, so CFG works).

Resuming: the whole state (weights, optimiser, schedule, the stage's generator, step) is written atomically to
``WORK/state.pt`` every ``PROGRESS[...]["checkpoint"]`` steps, and a run started on the same ``--work`` continues
from it, bitwise as if never stopped. Every ``PROGRESS["flow"]["probe"]`` flow steps the transformer and text
encoder are also kept (``WORK/snapshots/flow_STEP.pt``) with their sample measurements in ``WORK/probes.jsonl``,
so the step to ship can be chosen for headroom afterwards (``finish --step``). ``finish`` measures the chosen
weights and writes the pipeline folder (``WORK/pipeline``) with its model card.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from vgrpo_lib.errors import UsageError
from vgrpo_lib.integrations.atomic import atomic_write
from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained
from vgrpo_lib.integrations.testbed.data import load_mnist
from vgrpo_lib.integrations.testbed.mnist_sd3.train import (encode_moments, optimizer_step, reconstruction_loss,
                                                           write_pipeline)

from .build import FLOW_SHIFT, TEXT_LENGTH, build_pipeline, build_scheduler
from .card import describe, model_card
from .prompts import motion_prompts
from .render import DIRECTIONS, classifier_view, measured_direction, render_clips
from .rewards import MotionJudge, MotionReward, read_clips

__all__ = [
    "NUM_THREADS", "VAE_RECIPE", "FLOW_RECIPE", "PROGRESS", "EVAL", "vae_batch", "decode_unclamped", "vae_loss",
    "set_latent_statistics", "latent_pool", "flow_batch", "encode_text", "flow_loss",
    "generate", "sample_metrics", "vae_round_trip", "train", "measure", "finish", "pretrain_mnist_wan",
    "main",
]

NUM_THREADS = 1  # the thread count the shipped weights are reproducible at (float sums change order with it)
VAE_RECIPE = dict(steps=2000, batch_size=16, lr=2e-3, warmup=50, kl=1e-6, seed=100)
FLOW_RECIPE = dict(steps=14000, batch_size=32, lr=1e-3, warmup=100, p_uncond=0.1, seed=200, pool_seed=201)
PROGRESS = {"vae": dict(checkpoint=50, probe=500, log=25), "flow": dict(checkpoint=250, probe=2000, log=100)}
EVAL = dict(seed=1234, num_steps=20, guidance_scales=(1.0, 4.0), per_prompt=2, probe_per_prompt=1,
            probe_settings=((FLOW_SHIFT, 1.0), (1.0, 1.0), (FLOW_SHIFT, 4.0)))
"""Sampling for the card (``guidance_scales``, ``per_prompt`` clips per ``"eval"`` prompt) and for the probes during
training (``probe_settings``: (flow_shift, guidance scale) pairs, ``probe_per_prompt`` clips per prompt)."""


def vae_batch(digits: torch.Tensor, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    """``batch_size`` fresh clips ``(B, 3, F, 32, 32)`` in model space [-1, 1]: random digits of ``digits``
    ``(N, 1, 28, 28)``, random directions and start offsets, all from ``generator``."""
    idx = torch.randint(0, len(digits), (batch_size,), generator=generator)
    directions = torch.randint(0, len(DIRECTIONS), (batch_size,), generator=generator)
    return render_clips(digits[idx], directions, generator) * 2 - 1


def decode_unclamped(vae, z: torch.Tensor) -> torch.Tensor:
    """``vae.decode(z)`` before its final clamp to [-1, 1]: ``(B, 3, F, H, W)``.

    ``AutoencoderKLWan`` decodes latent frame by latent frame and clamps the result; a clamped pixel passes no
    gradient, so a decoder whose output fell below -1 on the mostly black canvas could never bring the strokes
    back (a first run stalled at an all-black reconstruction). The decoder's per-frame outputs are read by a hook
    instead."""
    chunks = []
    handle = vae.decoder.register_forward_hook(lambda module, args, output: chunks.append(output))
    try:
        vae.decode(z)
    finally:
        handle.remove()
    return torch.cat(chunks, dim=2)


def vae_loss(vae, x: torch.Tensor, kl: float, generator: torch.Generator) -> torch.Tensor:
    """Reconstruction (L1 + MSE, before the decoder's clamp: ``decode_unclamped``) of clips ``x``
    ``(B, 3, F, H, W)`` through a posterior sample, plus ``kl`` x KL."""
    posterior = vae.encode(x).latent_dist
    z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=generator)
    return reconstruction_loss(decode_unclamped(vae, z), x) + kl * posterior.kl().mean()



def set_latent_statistics(vae, means: torch.Tensor, stds: torch.Tensor) -> None:
    """Wan's latent normalisation, per channel, of the posterior samples the flow trains on (posterior ``means``
    and ``stds``, ``(N, C, ...)``): ``latents_mean`` the mean of the means, ``latents_std`` the square root of the
    variance of the means plus the mean posterior variance. A channel the decoder leaves unused keeps the prior's
    unit noise and means near 0; the spread of the means alone would blow that noise up (a pilot's flow loss
    started at 31 instead of about 2)."""
    per_channel_means, per_channel_stds = means.transpose(0, 1).flatten(1), stds.transpose(0, 1).flatten(1)
    variance = per_channel_means.var(1) + per_channel_stds.pow(2).mean(1)
    vae.register_to_config(latents_mean=[round(v, 4) for v in per_channel_means.mean(1).tolist()],
                           latents_std=[round(v, 4) for v in variance.sqrt().tolist()])


def _statistics(vae, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (1, -1) + (1,) * (like.ndim - 2)
    mean = torch.tensor(vae.config.latents_mean, dtype=like.dtype).view(shape)
    return mean, torch.tensor(vae.config.latents_std, dtype=like.dtype).view(shape)


@torch.no_grad()
def latent_pool(vae, seed: int, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalised posterior moments of every ``"train"`` digit moving in every direction (12,000 clips, start
    offsets from ``seed``): ``(means, stds, digits, directions)``, the first two ``(N, 16, 3, 8, 8)``."""
    digits, labels = load_mnist("train")
    gen = torch.Generator().manual_seed(seed)
    index = torch.arange(len(labels)).repeat_interleave(len(DIRECTIONS))
    directions = torch.arange(len(DIRECTIONS)).repeat(len(labels))
    means, stds = [], []
    for idx, dirs in zip(index.split(chunk), directions.split(chunk)):
        mean, std = encode_moments(vae, render_clips(digits[idx], dirs, gen), batch=64)
        means.append(mean)
        stds.append(std)
    return torch.cat(means), torch.cat(stds), labels[index], directions


def flow_batch(vae, pool: tuple, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, list[str]]:
    """One rectified-flow batch: normalised latents ``z`` ``(B, 16, 3, 8, 8)`` drawn from ``pool`` and, for each,
    a random ``"train"`` phrasing of its digit and direction."""
    means, stds, digits, directions = pool
    idx = torch.randint(0, len(digits), (batch_size,), generator=generator)
    raw = means[idx] + stds[idx] * torch.randn(means[idx].shape, generator=generator)
    mean, std = _statistics(vae, raw)
    by_pair = {}
    for prompt, digit, direction in motion_prompts("train"):
        by_pair.setdefault((digit, direction), []).append(prompt)
    pick = torch.randint(0, len(by_pair[(0, 0)]), (batch_size,), generator=generator).tolist()
    prompts = [by_pair[(int(digits[i]), int(directions[i]))][j] for i, j in zip(idx.tolist(), pick)]
    return (raw - mean) / std, prompts


def encode_text(pipe, prompts: list[str]) -> torch.Tensor:
    """``pipe.encode_prompt`` WITH gradients (the UMT5 encoder trains jointly): ``(B, TEXT_LENGTH, 64)``."""
    embeds, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False, max_sequence_length=TEXT_LENGTH)
    return embeds


def flow_loss(pipe, z: torch.Tensor, prompts: list[str], p_uncond: float, generator: torch.Generator) -> torch.Tensor:
    """Rectified flow on normalised latents ``z`` ``(B, C, f, h, w)``: caption dropout, logit-normal ``t``,
    ``x_t = (1 - t) z + t eps``, ``mse(v, eps - z)`` with ``v = transformer(x_t, 1000 t, text)``."""
    drop = (torch.rand(len(prompts), generator=generator) < p_uncond).tolist()
    prompts = ["" if d else p for p, d in zip(prompts, drop)]
    t = torch.sigmoid(torch.randn(len(prompts), generator=generator))
    eps = torch.randn(z.shape, generator=generator)
    tb = t.view(-1, *[1] * (z.ndim - 1))
    v = pipe.transformer(hidden_states=(1 - tb) * z + tb * eps, timestep=1000 * t,
                         encoder_hidden_states=encode_text(pipe, prompts), return_dict=False)[0]
    return torch.nn.functional.mse_loss(v, eps - z)


@torch.no_grad()
def generate(pipe, prompts: list[str], guidance_scale: float, seed: int, num_steps: int, batch: int = 120):
    """The pipeline's own clips for ``prompts``: ``(B, 3, F, 32, 32)`` in [0, 1] (noise from ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    pipe.set_progress_bar_config(disable=True)
    clips = []
    for lo in range(0, len(prompts), batch):
        frames = pipe(prompts[lo:lo + batch], height=32, width=32, num_frames=9, num_inference_steps=num_steps,
                      guidance_scale=guidance_scale, generator=gen, max_sequence_length=TEXT_LENGTH,
                      output_type="pt").frames  # (B, F, C, H, W)
        clips.append(frames.permute(0, 2, 1, 3, 4))
    return torch.cat(clips)


def sample_metrics(pipe, classifier, per_prompt: int, guidance_scale: float, seed: int, num_steps: int,
                   judge=None) -> dict:
    """On the ``"eval"`` prompts (``per_prompt`` clips each): the ``MotionReward`` mean, the reward classifier's
    clip-level digit accuracy (``read_clips``), the centre-of-mass direction accuracy and both at once; with a
    ``judge`` also ``MotionJudge``'s digit, block-matching direction and both accuracies (``judge_*``)."""
    triples = motion_prompts("eval")
    prompts = [p for p, _, _ in triples for _ in range(per_prompt)]
    digits = torch.tensor([d for _, d, _ in triples for _ in range(per_prompt)])
    directions = torch.tensor([k for _, _, k in triples for _ in range(per_prompt)])
    clips = generate(pipe, prompts, guidance_scale, seed, num_steps)
    right = read_clips(classifier, clips) == digits
    moved = measured_direction(clips) == directions
    out = {"reward_mean": MotionReward(classifier)(clips, prompts).mean().item(),
           "digit_accuracy": right.float().mean().item(), "direction_accuracy": moved.float().mean().item(),
           "both_accuracy": (right & moved).float().mean().item()}
    if judge is not None:
        judged = MotionJudge(judge)(clips, prompts)
        out.update({f"judge_{k}_accuracy": v.float().mean().item() for k, v in judged.items()})
    return {k: round(v, 4) for k, v in out.items()}


@torch.no_grad()
def vae_round_trip(vae, classifier, n: int = 200, seed: int = 7) -> dict:
    """Clips of ``n`` ``"eval"`` digits (cycling directions) and their reconstructions (posterior means): digit
    accuracy of each by ``classifier``, direction accuracy by centre of mass, pixel MAE."""
    digits, labels = load_mnist("eval")
    directions = torch.arange(n) % len(DIRECTIONS)
    clips = render_clips(digits[:n], directions, torch.Generator().manual_seed(seed))
    recon = ((vae.decode(vae.encode(clips * 2 - 1).latent_dist.mean).sample + 1) / 2).clamp(0, 1)
    out = {}
    for name, c in (("original", clips), ("reconstruction", recon)):
        out[f"{name}_digit_accuracy"] = (read_clips(classifier, c) == labels[:n]).float().mean().item()
        out[f"{name}_direction_accuracy"] = (measured_direction(c) == directions).float().mean().item()
    out["pixel_mae"] = (recon - clips).abs().mean().item()
    return {k: round(v, 4) for k, v in out.items()}


def _save(path: Path, payload: dict) -> None:
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


def _log_progress(log, stage: str, step: int, steps: int, loss: float, started: float, first_step: int) -> None:
    elapsed = time.perf_counter() - started
    rate = (step - first_step) / max(elapsed, 1e-9)
    eta = (steps - step) / rate if rate > 0 else float("nan")
    log(f"{stage} step {step}/{steps} loss {loss:.4f} | {rate:.2f} steps/s, stage ETA {eta / 60:.0f} min "
        f"({time.strftime('%H:%M:%S')})")


def _stage_loop(stage: str, steps: int, start_step: int, step_fn, checkpoint_fn, probe_fn, log) -> None:
    every = PROGRESS[stage]
    started = time.perf_counter()
    for step in range(start_step, steps):
        loss = step_fn()
        done = step + 1
        if done % every["log"] == 0 or done == start_step + 1:
            _log_progress(log, stage, done, steps, loss, started, start_step)
        if done % every["probe"] == 0 or done == steps:
            probe_fn(done)
        if done % every["checkpoint"] == 0 or done == steps:
            checkpoint_fn(done)


def train(work: Path, log=print, vae_recipe: dict = VAE_RECIPE, flow_recipe: dict = FLOW_RECIPE):
    """Run (or resume, from ``work/state.pt``) both stages; returns the trained pipeline (see the module doc)."""
    work = Path(work)
    (work / "snapshots").mkdir(parents=True, exist_ok=True)
    state_path = work / "state.pt"
    pipe = build_pipeline(seed=0)
    classifier = load_pretrained("classifier")
    state = torch.load(state_path, weights_only=False) if state_path.exists() else {"stage": "vae", "step": 0}
    log(f"state: stage {state['stage']} step {state['step']} (torch threads {torch.get_num_threads()})")
    if state["stage"] in ("flow", "done") and state["step"] > flow_recipe["steps"]:
        raise UsageError(f"{state_path} holds flow step {state['step']}, past the {flow_recipe['steps']} flow steps asked "
                         f"for: pass --flow-steps {state['step']} or more to continue it, or ship an earlier snapshot "
                         f"with --finish-step (snapshots/flow_STEP.pt).")
    flow_modules = {"transformer": pipe.transformer, "text_encoder": pipe.text_encoder}

    def probe_log(record: dict) -> None:
        with open(work / "probes.jsonl", "a") as fh:
            fh.write(json.dumps(record) + "\n")
        log(f"probe {record}")

    if state["stage"] == "vae":
        r = vae_recipe
        digits, _ = load_mnist("train")
        gen = torch.Generator().manual_seed(r["seed"])
        opt = torch.optim.AdamW(pipe.vae.parameters(), lr=r["lr"], weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / r["warmup"]))
        if state["step"]:
            pipe.vae.load_state_dict(state["vae"])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            gen.set_state(state["generator"])
        pipe.vae.train()

        def vae_step() -> float:
            loss = vae_loss(pipe.vae, vae_batch(digits, r["batch_size"], gen), r["kl"], gen)
            optimizer_step(opt, sched, loss)
            return loss.item()

        def vae_checkpoint(step: int) -> None:
            finished = step >= r["steps"]
            _save(state_path, {"stage": "flow" if finished else "vae", "step": 0 if finished else step,
                               "vae": pipe.vae.state_dict(), "optimizer": opt.state_dict(),
                               "scheduler": sched.state_dict(), "generator": gen.get_state()})

        def vae_probe(step: int) -> None:
            pipe.vae.eval()
            probe_log({"stage": "vae", "step": step, **vae_round_trip(pipe.vae, classifier)})
            pipe.vae.train()

        _stage_loop("vae", r["steps"], state["step"], vae_step, vae_checkpoint, vae_probe, log)
        state = torch.load(state_path, weights_only=False)
    pipe.vae.load_state_dict(state["vae"])
    pipe.vae.eval().requires_grad_(False)

    r = flow_recipe
    started = time.perf_counter()
    pool = latent_pool(pipe.vae, r["pool_seed"])
    set_latent_statistics(pipe.vae, pool[0], pool[1])
    log(f"latent pool: {len(pool[2])} clips encoded in {time.perf_counter() - started:.0f} s; latents_mean "
        f"{pipe.vae.config.latents_mean}, latents_std {pipe.vae.config.latents_std}")
    if state["stage"] == "flow":
        gen = torch.Generator().manual_seed(r["seed"])
        params = [p for m in flow_modules.values() for p in m.parameters()]
        opt = torch.optim.AdamW(params, lr=r["lr"], weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / r["warmup"]))
        if state["step"]:
            for name, module in flow_modules.items():
                module.load_state_dict(state[name])
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            gen.set_state(state["generator"])
        for module in flow_modules.values():
            module.train()

        def flow_step() -> float:
            z, prompts = flow_batch(pipe.vae, pool, r["batch_size"], gen)
            loss = flow_loss(pipe, z, prompts, r["p_uncond"], gen)
            optimizer_step(opt, sched, loss, clip_params=params)
            return loss.item()

        def flow_weights() -> dict:
            return {name: {k: v.clone() for k, v in m.state_dict().items()} for name, m in flow_modules.items()}

        def flow_checkpoint(step: int) -> None:
            finished = step >= r["steps"]
            _save(state_path, {"stage": "done" if finished else "flow", "step": step, "vae": state["vae"],
                               **flow_weights(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                               "generator": gen.get_state()})

        def flow_probe(step: int) -> None:
            _save(work / "snapshots" / f"flow_{step}.pt", flow_weights())
            for module in flow_modules.values():
                module.eval()
            for shift, scale in EVAL["probe_settings"]:
                pipe.scheduler = build_scheduler(shift)
                metrics = sample_metrics(pipe, classifier, EVAL["probe_per_prompt"], scale,
                                         EVAL["seed"], EVAL["num_steps"])
                probe_log({"stage": "flow", "step": step, "flow_shift": shift, "guidance_scale": scale, **metrics})
            pipe.scheduler = build_scheduler()
            for module in flow_modules.values():
                module.train()

        _stage_loop("flow", r["steps"], state["step"], flow_step, flow_checkpoint, flow_probe, log)
        state = torch.load(state_path, weights_only=False)
    for name, module in flow_modules.items():
        module.load_state_dict(state[name])
        module.eval()
    return pipe


def measure(pipe) -> dict:
    """The model card's numbers: the VAE round trip and, per guidance scale, ``sample_metrics`` with the testbed
    classifier (the reward's CNN) and the judge (an MLP trained on a disjoint split)."""
    classifier, judge = load_pretrained("classifier"), load_pretrained("judge")
    out = {"vae_round_trip": vae_round_trip(pipe.vae, classifier)}
    for scale in EVAL["guidance_scales"]:
        out[f"cfg{scale:g}"] = sample_metrics(pipe, classifier, EVAL["per_prompt"], scale, EVAL["seed"],
                                              EVAL["num_steps"], judge)
    return out


def finish(pipe, work: Path, log=print, step: int | None = None, seconds: dict | None = None,
           flow_recipe: dict = FLOW_RECIPE) -> dict:
    """Measure ``pipe`` (with the flow weights of snapshot ``step`` if given) and write ``work/pipeline``;
    ``seconds["total_s"]`` is this process's training time (a resumed run counts only its own)."""
    if step is not None:
        snapshot = torch.load(Path(work) / "snapshots" / f"flow_{step}.pt", weights_only=False)
        pipe.transformer.load_state_dict(snapshot["transformer"])
        pipe.text_encoder.load_state_dict(snapshot["text_encoder"])
    log("measuring the samples ...")
    started = time.perf_counter()
    metrics = measure(pipe)
    flow_recipe = {**flow_recipe, "steps": step or flow_recipe["steps"]}
    card = describe(pipe, metrics, VAE_RECIPE, flow_recipe, EVAL,
                    {**(seconds or {}), "measure_s": round(time.perf_counter() - started)})
    write_pipeline(pipe, card, Path(work) / "pipeline", model_card)
    log(f"wrote {Path(work) / 'pipeline'}: {metrics}")
    return card


def pretrain_mnist_wan(log=print, work: Path = Path("runs/mnist_wan")) -> dict:
    """The whole rebuild at ``NUM_THREADS`` thread: train (resuming from ``work``), measure, write ``work/pipeline``."""
    torch.set_num_threads(NUM_THREADS)
    start = time.perf_counter()
    pipe = train(Path(work), log)
    return finish(pipe, Path(work), log, seconds={"total_s": round(time.perf_counter() - start)})


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Pretrain (or resume) MNIST-Wan; write WORK/pipeline.")
    parser.add_argument("--work", type=Path, default=Path("runs/mnist_wan"),
                        help="folder of the resumable state, snapshots, probes and the final pipeline")
    parser.add_argument("--flow-steps", type=int, default=FLOW_RECIPE["steps"],
                        help="flow steps to train (default: the shipped pipeline's); the learning rate is constant after "
                             "warmup, so K steps equal the first K of a longer run")
    parser.add_argument("--finish-step", type=int, default=None,
                        help="after training, ship the flow snapshot of this step instead of the last one")
    args = parser.parse_args(argv)
    if args.flow_steps < 1:
        raise SystemExit(f"--flow-steps must be at least 1, got {args.flow_steps}")
    torch.set_num_threads(NUM_THREADS)

    def log(line: str) -> None:
        print(line, flush=True)

    log(f"MNIST-Wan pretraining, code at commit {_commit()}, pid {os.getpid()}, work {args.work}")
    start = time.perf_counter()
    flow_recipe = {**FLOW_RECIPE, "steps": args.flow_steps}
    try:
        pipe = train(args.work, log, flow_recipe=flow_recipe)
    except UsageError as error:
        raise SystemExit(f"error: {error}") from None
    finish(pipe, args.work, log, args.finish_step, {"total_s": round(time.perf_counter() - start)}, flow_recipe)


if __name__ == "__main__":
    main()
