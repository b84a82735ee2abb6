"""The GPU throughput sweep (issue 32 item 3): MFU and peak memory of each phase over micro-batch sizes, gradient
checkpointing, SDPA backends, ``torch.compile`` and CUDA graphs, and images per GPU per second for a full
iteration, at SD3.5-Medium size (:mod:`vgrpo_lib.benchmarks.gpu_timing`'s model: random weights, bf16, LoRA r=32).

The one command a GPU session runs (one H100 or H200, one device call of at most ~9 minutes; the device image lacks
diffusers, tensordict, torchrl and peft, which travel as wheels: results/gpu-run/README.md, "Next GPU session
(issue 32 item 3)", has the device command verbatim):

    timeout 530 bash benchmarks/gpu_sweep.sh $OUT/gpu_sweep

which runs ``python -m vgrpo_lib.benchmarks.gpu_sweep --out $OUT/gpu_sweep --budget-s 420`` (``--tiny`` and
``bash benchmarks/gpu_sweep.sh --cpu DIR``: the same code at toy size on the CPU, what the test runs).

The cells, in this order (the time budget cuts the end, never the middle of a cell):

1. ``rollout``: one ODE step (one forward without gradient) of ``micro_batch`` samples, at 1, 2, 4, ... samples up
   to ``--max-micro-batch`` or the first that runs out of memory (gradient checkpointing is inert without backward);
2. ``vgrpo_update``: one V-GRPO gradient step (K pairs per sample in one batched forward, backward, AdamW), with
   gradient checkpointing, at 1, 2, 4, ... samples; then ``vgrpo_prepare`` (the behaviour surrogates on the same K
   pairs without gradient, what ``optim.micro_batch_size`` also sizes) at each size the update fitted, the evidence
   for :mod:`vgrpo_lib.algorithms.autotune`'s claim that the prepare fits the update's size; then the update
   without checkpointing;
3. ``flow_grpo_update``: one Flow-GRPO gradient step on ``micro_batch`` recorded SDE transitions, with and without
   checkpointing;
4. each SDPA backend (``flash``, ``efficient``, ``cudnn``, ``math``, through ``torch.nn.attention.sdpa_kernel``;
   ``default`` elsewhere) for the rollout and the V-GRPO update at their best sizes;
5. ``iteration``: a full V-GRPO iteration of ``--iteration-samples`` samples (the ``--steps``-step rollout in
   micro-batches, one gradient step over them by accumulation) at the best eager settings: images per GPU per
   second (the reward is not part of it: no reward model is loaded);
6. ``torch.compile`` of the transformer (``compile="default"``) for the rollout and the V-GRPO update, and CUDA
   graphs for the fixed-shape rollout (``compile="reduce-overhead"``), each at the best size, each only while
   ``--compile-reserve-s`` are left.

Every cell is one line of ``OUT/sweep.jsonl``, written and flushed when it ends (a call cut short keeps every
finished cell); the first line is ``"record": "device"`` (the device, the peak FLOP/s used and which, the model's
FLOPs per sample) and ``"record": "summary"`` lines follow the eager cells and end the file (the best cell per
phase, images per GPU per second measured and estimated from the best cells, VeRL-Omni's figure beside them; the
last one counts). A cell's fields:

    phase                   rollout | vgrpo_prepare | vgrpo_update | flow_grpo_update | iteration
    micro_batch, rows       samples (Flow-GRPO: transitions) per call, and model rows per forward (V-GRPO: x K)
    gradient_checkpointing  true / false, or null without backward
    attention, compile      default | flash | efficient | cudnn | math;  none | default | reduce-overhead
    status                  ok | oom | error | skipped ("reason" says why unless ok)
    seconds                 seconds per timed call (mean of --repeats after warm-up); first_call_s: the warm-up
                            (with compile: the compilation)
    seconds_per_sample, mfu model FLOPs (counted once per forward and backward, recomputation not counted) per
                            second over the device's bf16 dense peak
    peak_memory_gib         the most memory allocated during the cell (CUDA only)

MFU uses the bf16 dense peak of the device found by name (H100 SXM and H200: 989 TFLOP/s; H100 PCIe 756, H100 NVL
835, A100 312), or ``--peak-tflops``; the device record says which.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tensordict import TensorDict

from vgrpo_lib.benchmarks.gpu_timing import (
    H200_BF16_PEAK, build_model, count_flops, flow_grpo_update, random_cond, timed_with_warmup, vgrpo_update,
)

__all__ = [
    "ATTENTION_BACKENDS", "BF16_DENSE_PEAKS", "Cell", "Sweep", "VERL_OMNI_IMAGES_PER_GPU_S", "attention_backend",
    "device_peak", "make_parser", "main",
]

# (substring of torch.cuda.get_device_name, bf16 dense FLOP/s, what it is); the first match wins.
BF16_DENSE_PEAKS = (
    ("H200", 989e12, "H200 bf16 dense"),
    ("H100 PCIe", 756e12, "H100 PCIe bf16 dense"),
    ("H100 NVL", 835e12, "H100 NVL bf16 dense"),
    ("H100", 989e12, "H100 SXM bf16 dense"),
    ("A100", 312e12, "A100 bf16 dense"),
)
ATTENTION_BACKENDS = ("flash", "efficient", "cudnn", "math")
# VeRL-Omni's reported throughput: Qwen-Image OCR training on 4x H200 (issue 32).
VERL_OMNI_IMAGES_PER_GPU_S = 0.51


def device_peak(device: torch.device, peak_tflops: float | None) -> tuple[float, str]:
    """The bf16 dense peak FLOP/s of ``device`` and which figure it is: ``--peak-tflops`` when given, else by the
    CUDA device's name (:data:`BF16_DENSE_PEAKS`); a CPU or an unknown GPU gets the H200's, said so."""
    if peak_tflops is not None:
        return peak_tflops * 1e12, f"{peak_tflops:g} TFLOP/s as given (--peak-tflops)"
    if device.type != "cuda":
        return H200_BF16_PEAK, "nominal H200 bf16 dense peak (a CPU run: its MFU means nothing)"
    name = torch.cuda.get_device_name(device)
    for part, peak, what in BF16_DENSE_PEAKS:
        if part in name:
            return peak, f"{what}: {peak / 1e12:g} TFLOP/s"
    return H200_BF16_PEAK, f"unknown device {name!r}: the H200's 989 TFLOP/s assumed"


@dataclass(frozen=True)
class Cell:
    """One measurement's settings."""

    phase: str
    micro_batch: int
    gradient_checkpointing: bool | None = None  # None: no backward (checkpointing is inert)
    attention: str = "default"
    compile: str = "none"


@contextlib.contextmanager
def attention_backend(name: str) -> Iterator[None]:
    """SDPA restricted to one backend (``"default"``: PyTorch's own choice)."""
    if name == "default":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]
    with sdpa_kernel(backend):
        yield


class Sweep:
    """The cells of the module docstring on one model, each written to ``out`` as it ends. ``clock``: seconds (the
    time budget's; a test passes its own)."""

    def __init__(self, args: argparse.Namespace, clock: Callable[[], float] = time.perf_counter):
        self.args, self.clock, self.start = args, clock, clock()
        self.device = torch.device("cpu" if args.tiny else "cuda")
        self.shape = (16, 8, 8) if args.tiny else (16, args.resolution // 8, args.resolution // 8)
        self.model = build_model(args.tiny, self.device, args.lora_rank, gradient_checkpointing=False)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=3e-4)
        x = torch.randn(1, *self.shape, device=self.device)
        t = torch.full((1,), 0.5, device=self.device)
        self.forward_flops, self.train_flops = count_flops(self.model, x, t, random_cond(1, args.tiny, self.device))
        self.peak, self.peak_source = device_peak(self.device, args.peak_tflops)
        self.transitions = self._transition_pool()
        args.out.mkdir(parents=True, exist_ok=True)
        self.path = args.out / "sweep.jsonl"
        self.path.write_text("")
        self.results: list[dict] = []
        self.write({"record": "device", "device": self._device_name(), "peak_flops": self.peak,
                    "peak_source": self.peak_source, "torch": torch.__version__, "cuda": torch.version.cuda,
                    "latent_shape": list(self.shape), "num_pairs": args.pairs, "rollout_steps": args.steps,
                    "sde_steps": args.sde_steps, "lora_rank": args.lora_rank,
                    "transformer_parameters": sum(p.numel() for p in self.model.parameters()),
                    "flops_forward_per_sample": self.forward_flops, "flops_forward_backward_per_sample": self.train_flops,
                    "budget_s": args.budget_s, "repeats": args.repeats})

    def _device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu (tiny config)"

    def _transition_pool(self) -> TensorDict:
        """Flow-GRPO's training rows: the ``--sde-steps`` transitions of one SDE rollout, repeated to any size."""
        from vgrpo_lib.samplers import sample_sde, time_grid

        generator = torch.Generator(device=self.device).manual_seed(0)
        noise = torch.randn((1, *self.shape), device=self.device, generator=generator)
        cond = random_cond(1, self.args.tiny, self.device)
        with torch.no_grad():
            _, trajectory = sample_sde(self.model, noise, time_grid(self.args.sde_steps, shift=3.0), cond,
                                       generator=generator)
        rows = trajectory.exclude("log_prob")
        rows["old_log_prob"] = trajectory["log_prob"]
        rows["advantage"] = torch.randn(1, device=self.device, generator=generator)[:, None].expand(1, self.args.sde_steps)
        rows["cond"] = cond.unsqueeze(1).expand(1, self.args.sde_steps)
        return rows.reshape(-1).clone()

    # -- records and the budget --------------------------------------------------------------------------

    def write(self, record: dict) -> dict:
        """Append ``record`` to sweep.jsonl (flushed at once) and print its line."""
        with self.path.open("a") as file:
            file.write(json.dumps(record) + "\n")
        if record.get("record") == "cell":
            self.results.append(record)
            shown = {key: record.get(key) for key in ("phase", "micro_batch", "gradient_checkpointing", "attention",
                                                      "compile", "status", "mfu", "peak_memory_gib", "reason")}
            print(json.dumps({k: v for k, v in shown.items() if v is not None}), flush=True)
        return record

    def left(self) -> float:
        """Seconds left of ``--budget-s``."""
        return self.args.budget_s - (self.clock() - self.start)

    # -- cells -------------------------------------------------------------------------------------------

    def run_cell(self, cell: Cell, expected_s: float = 0.0, skip: str | None = None,
                 measure: Callable[[Cell], dict] | None = None) -> dict:
        """Measure ``cell`` (``measure(cell)``, by default :meth:`_measure`) and write its record: ``skipped``
        (``skip``, or fewer than ``expected_s`` seconds left of the budget), ``oom`` (torch.OutOfMemoryError: the
        memory is released and the sweep goes on), ``error`` (any other failure, e.g. an SDPA backend without a
        kernel for these inputs) or ``ok``."""
        record = {"record": "cell", **asdict(cell), "rows": cell.micro_batch * self._rows_per_sample(cell.phase)}
        left = self.left()
        if skip is None and (left <= 0 or expected_s > left):
            skip = f"time budget: {max(left, 0):.0f} s left of {self.args.budget_s:g} s, about {expected_s:.0f} s needed"
        if skip is not None:
            return self.write({**record, "status": "skipped", "reason": skip})
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        started, failure = self.clock(), None
        try:
            limit = self.args.simulate_oom_above
            if limit is not None and cell.micro_batch > limit:
                raise torch.OutOfMemoryError(f"simulated (--simulate-oom-above {limit})")
            record.update((measure or self._measure)(cell))
            record["status"] = "ok"
        except torch.OutOfMemoryError as error:
            failure = ("oom", str(error).splitlines()[0][:300])
        except Exception as error:  # one cell's failure is a record; the sweep goes on
            failure = ("error", f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}")
        if failure is not None:  # released outside the handler: the failed call's frames hold its tensors
            record.update(status=failure[0], reason=failure[1])
            self.release()
        record["wall_s"] = self.clock() - started
        if self.device.type == "cuda":
            record["peak_memory_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        return self.write(record)

    def release(self) -> None:
        """Drop gradients and cached blocks after a failed cell."""
        self.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _rows_per_sample(self, phase: str) -> int:
        return self.args.pairs if phase in ("vgrpo_update", "vgrpo_prepare") else 1

    @contextlib.contextmanager
    def _settings(self, cell: Cell) -> Iterator[None]:
        """The cell's checkpointing, SDPA backend and compilation around its calls, all undone after."""
        transformer = self.model.transformer
        if cell.gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        if cell.compile != "none":
            mode = None if cell.compile == "default" else cell.compile
            self.model.transformer = torch.compile(transformer, mode=mode, dynamic=False)
        try:
            with attention_backend(cell.attention):
                yield
        finally:
            self.model.transformer = transformer
            if cell.gradient_checkpointing:
                transformer.disable_gradient_checkpointing()
            if cell.compile != "none":
                torch._dynamo.reset()

    def _inputs(self, b: int) -> tuple[torch.Tensor, TensorDict, torch.Tensor, torch.Generator]:
        """Latents ``(b, *D)`` (random: the cost does not depend on their values), conditions and two groups."""
        generator = torch.Generator(device=self.device).manual_seed(b)
        latents = torch.randn((b, *self.shape), device=self.device, generator=generator)
        group = torch.arange(b, device=self.device) // max(1, b // 2)
        return latents, random_cond(b, self.args.tiny, self.device), group, generator

    def _measure(self, cell: Cell) -> dict:
        b, k = cell.micro_batch, self.args.pairs
        latents, cond, group, generator = self._inputs(b)
        if cell.phase == "rollout":
            t = torch.full((b,), 0.5, device=self.device)
            call, flops = torch.no_grad()(lambda: self.model(latents, t, cond)), self.forward_flops * b
        elif cell.phase == "vgrpo_prepare":
            from vgrpo_lib import ELBOSurrogate
            from vgrpo_lib.batches import old_surrogate  # what the trainer's prepare runs (VGRPO.prepare_forward)

            estimator = ELBOSurrogate(k, "stratified", "group", "adaptive_x")
            pairs = estimator.sample_pairs(latents, group, generator=generator)
            call = torch.no_grad()(lambda: old_surrogate(estimator, self.model, latents, cond, pairs))
            flops = self.forward_flops * b * k
        elif cell.phase == "vgrpo_update":
            call = vgrpo_update(self.model, self.optimizer, latents, cond, group, k, generator)
            flops = self.train_flops * b * k
        elif cell.phase == "flow_grpo_update":
            rows = self.transitions[torch.arange(b, device=self.device) % self.transitions.shape[0]]
            call, flops = flow_grpo_update(self.model, self.optimizer, rows), self.train_flops * b
        else:
            raise ValueError(f"Unknown phase {cell.phase!r}.")
        with self._settings(cell):
            first, seconds = timed_with_warmup(call, self.device, self.args.repeats,
                                              warmups=2 if cell.compile == "reduce-overhead" else 1)
        self.optimizer.zero_grad(set_to_none=True)
        return {"first_call_s": first, "seconds": seconds, "seconds_per_sample": seconds / b,
                "mfu": flops / seconds / self.peak}

    # -- the plan ----------------------------------------------------------------------------------------

    def ladder(self, phase: str, checkpointing: bool | None) -> list[dict]:
        """``phase`` at 1, 2, 4, ... up to ``--max-micro-batch``, until a cell is not ok; each cell is expected
        to take twice the previous one."""
        records, expected, b = [], 0.0, 1
        while b <= self.args.max_micro_batch:
            records.append(self.run_cell(Cell(phase, b, checkpointing), expected_s=expected))
            if records[-1]["status"] != "ok":
                break
            expected, b = 2 * records[-1]["wall_s"], 2 * b
        return records

    def best(self, phase: str, **settings) -> dict | None:
        """The ok cell of ``phase`` (with these settings) of the highest MFU; the larger size on a tie."""
        cells = [r for r in self.results if r["phase"] == phase and r["status"] == "ok"
                 and all(r[key] == value for key, value in settings.items())]
        return max(cells, key=lambda r: (r["mfu"], r["micro_batch"]), default=None)

    def _cell_of(self, record: dict, **changes) -> Cell:
        return replace(Cell(record["phase"], record["micro_batch"], record["gradient_checkpointing"],
                            record["attention"], record["compile"]), **changes)

    def run(self) -> dict:
        """Every cell in the module docstring's order, then the summary record."""
        self.ladder("rollout", None)  # gradient checkpointing is inert without backward
        fitted = [r["micro_batch"] for r in self.ladder("vgrpo_update", True) if r["status"] == "ok"]
        for b in fitted:
            self.run_cell(Cell("vgrpo_prepare", b))
        self.ladder("vgrpo_update", False)
        self.ladder("flow_grpo_update", True)
        self.ladder("flow_grpo_update", False)
        rollout, update = self.best("rollout"), self.best("vgrpo_update")
        for backend in ATTENTION_BACKENDS:
            for base in (rollout, update):
                if base is not None:
                    self.run_cell(self._cell_of(base, attention=backend), expected_s=base["wall_s"])
        self.iteration()
        self.summary("the eager cells")  # kept should a compilation outlast the device call
        reserve, no_compile = self.args.compile_reserve_s, "--no-compile" if self.args.no_compile else None
        rollout, update = self.best("rollout", compile="none"), self.best("vgrpo_update", compile="none")
        for base, mode in ((rollout, "default"), (update, "default"), (rollout, "reduce-overhead")):
            if base is None:
                continue
            skip = no_compile or ("CUDA graphs need a CUDA device" if mode == "reduce-overhead"
                                  and self.device.type != "cuda" else None)
            self.run_cell(self._cell_of(base, compile=mode), expected_s=reserve, skip=skip)
        return self.summary("every cell")

    def iteration(self) -> dict:
        """A full V-GRPO iteration at the best eager settings, timed once (its shapes ran in earlier cells): the
        rollout of ``--iteration-samples`` samples in micro-batches, then one gradient step over them by
        accumulation; images per GPU per second."""
        from vgrpo_lib import ELBOSurrogate, VGRPOLoss
        from vgrpo_lib.algorithms.micro_batches import accumulate_gradients
        from vgrpo_lib.samplers import sample_ode, time_grid

        rollout, update = self.best("rollout", compile="none"), self.best("vgrpo_update", compile="none")
        n = self.args.iteration_samples
        cell = Cell("iteration", n, None if update is None else update["gradient_checkpointing"])
        if rollout is None or update is None:
            return self.run_cell(cell, skip="no rollout or V-GRPO update cell fitted")
        rollout_size, update_size = min(rollout["micro_batch"], n), min(update["micro_batch"], n)
        estimator = ELBOSurrogate(self.args.pairs, "stratified", "group", "adaptive_x")
        loss_module = VGRPOLoss(self.model, estimator, clip_range=0.01, on_policy=True)
        grid = time_grid(self.args.steps, shift=3.0)

        def measure(cell: Cell) -> dict:
            latents, cond, group, generator = self._inputs(n)
            start = time.perf_counter()
            with torch.no_grad(), attention_backend(rollout["attention"]):
                sample = torch.cat([sample_ode(self.model, latents[i:i + rollout_size], grid, cond[i:i + rollout_size])
                                    for i in range(0, n, rollout_size)])
            batch = TensorDict({"sample": sample, "cond": cond, "group": group,
                                "advantage": torch.randn(n, device=self.device, generator=generator),
                                "pairs": estimator.sample_pairs(sample, group, generator=generator)}, batch_size=[n])
            self.optimizer.zero_grad(set_to_none=True)
            with self._settings(Cell("vgrpo_update", update_size, update["gradient_checkpointing"], update["attention"])):
                accumulate_gradients(lambda micro, _: loss_module(micro), self.model, batch, update_size, generator,
                                     contextlib.nullcontext)
            self.optimizer.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            seconds = time.perf_counter() - start
            flops = n * (self.args.steps * self.forward_flops + self.args.pairs * self.train_flops)
            return {"seconds": seconds, "seconds_per_sample": seconds / n, "mfu": flops / seconds / self.peak,
                    "images_per_gpu_per_s": n / seconds, "rollout_micro_batch": rollout_size,
                    "rollout_attention": rollout["attention"], "update_micro_batch": update_size,
                    "update_attention": update["attention"]}

        expected = n * (rollout["seconds_per_sample"] * self.args.steps + update["seconds_per_sample"])
        return self.run_cell(cell, expected_s=expected, measure=measure)

    def summary(self, after: str) -> dict:
        """A summary record of the cells so far (``after``: which): the best cell per phase, and images per GPU per
        second, measured and estimated from the best cells; the last one written is the sweep's."""
        best = {phase: self.best(phase) for phase in ("rollout", "vgrpo_prepare", "vgrpo_update", "flow_grpo_update")}
        estimate = {}
        rollout, vgrpo, flow = best["rollout"], best["vgrpo_update"], best["flow_grpo_update"]
        if rollout is not None and vgrpo is not None:
            estimate["vgrpo"] = 1 / (rollout["seconds_per_sample"] * self.args.steps + vgrpo["seconds_per_sample"])
        if rollout is not None and flow is not None:  # Flow-GRPO's SDE steps cost an ODE step each
            per_sample = self.args.sde_steps * (rollout["seconds_per_sample"] + flow["seconds_per_sample"])
            estimate["flow_grpo"] = 1 / per_sample
        measured = [r for r in self.results if r["phase"] == "iteration" and r["status"] == "ok"]
        statuses = [r["status"] for r in self.results]
        return self.write({
            "record": "summary", "after": after, "device": self._device_name(), "peak_source": self.peak_source,
            "best": {phase: None if r is None else {k: r[k] for k in ("micro_batch", "gradient_checkpointing",
                                                                      "attention", "compile", "mfu", "seconds_per_sample",
                                                                      "peak_memory_gib") if k in r}
                     for phase, r in best.items()},
            "images_per_gpu_per_s": measured[-1]["images_per_gpu_per_s"] if measured else None,
            "images_per_gpu_per_s_estimate": estimate,
            "verl_omni_images_per_gpu_per_s": VERL_OMNI_IMAGES_PER_GPU_S,
            "cells": {status: statuses.count(status) for status in sorted(set(statuses))},
            "elapsed_s": self.clock() - self.start,
        })


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder of sweep.jsonl")
    parser.add_argument("--tiny", action="store_true", help="tiny config on the CPU (tests the code path)")
    parser.add_argument("--resolution", type=int, default=1024, help="image size in pixels (latents are /8)")
    parser.add_argument("--pairs", type=int, default=4, help="V-GRPO timestep-noise pairs K (paper: 4)")
    parser.add_argument("--steps", type=int, default=40, help="ODE rollout steps of the iteration (paper SD3.5-M: 40)")
    parser.add_argument("--sde-steps", type=int, default=10, help="Flow-GRPO SDE steps per sample (10)")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per cell after one warm-up")
    parser.add_argument("--max-micro-batch", type=int, default=64, help="the ladders' largest micro-batch")
    parser.add_argument("--iteration-samples", type=int, default=16, help="samples of the measured full iteration")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="seconds for the whole sweep, from the start: cells that would not fit are skipped")
    parser.add_argument("--compile-reserve-s", type=float, default=150.0,
                        help="seconds a compile cell needs left of the budget (compilation included)")
    parser.add_argument("--no-compile", action="store_true", help="record the compile cells as skipped")
    parser.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak (default: by device name)")
    parser.add_argument("--simulate-oom-above", type=int, default=None, metavar="N",
                        help="raise torch.OutOfMemoryError in cells above N samples (the CPU mode's full device)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = make_parser().parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("gpu_sweep needs a CUDA GPU; use --tiny to run the same code path on the CPU.")
    for name in ("repeats", "max_micro_batch", "iteration_samples", "pairs", "steps", "sde_steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"gpu_sweep: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    summary = Sweep(args).run()
    print(json.dumps(summary, indent=2), file=sys.stdout)
    return summary


if __name__ == "__main__":
    main()
