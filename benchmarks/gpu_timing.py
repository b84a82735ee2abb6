"""Seconds per iteration and model FLOP utilisation of V-GRPO and Flow-GRPO at SD3.5-Medium scale on one GPU.

    python -m vgrpo_lib.benchmarks.gpu_timing                      # one H200: SD3.5-M-size transformer, bf16, 1024 px
    python -m vgrpo_lib.benchmarks.gpu_timing --tiny               # the same code path on the CPU with a tiny config (a test)
    python -m vgrpo_lib.benchmarks.gpu_timing --resolution 512 --micro-batch 4 --out timing.json

No weights are needed: the transformer is randomly initialised with the published SD3.5-Medium config
(``SD35_MEDIUM_TRANSFORMER``), in bf16 with a trainable fp32 LoRA adapter (r=32, alpha=64, the paper's) under
bf16 autocast, exactly as :mod:`vgrpo_lib.integrations.diffusers_adapters` trains it; the prompt embeddings are random
tensors of the real shapes (77 CLIP + 256 T5 tokens x 4096, pooled 2048). What is timed, per sample:

- rollout: ``--steps`` ODE steps without grad (paper: 40 for SD3.5-M), from a few timed steps;
- V-GRPO update: the K (``--pairs``, paper 4) timestep-noise pairs of ``ELBOSurrogate`` (stratified, group-
  shared, adaptive x-weighting) in one batched forward, ``VGRPOLoss`` (one step per rollout, the paper's
  SD3.5-M preference setting), backward and an AdamW step;
- Flow-GRPO update: ``--sde-steps`` recorded SDE transitions (Flow-GRPO trains on 10), each one forward +
  backward through ``FlowGRPOLoss``, and an AdamW step.

Seconds per iteration are extrapolated to the paper's global batch (48 prompts x 24 images = 1152 samples)
divided over ``--gpus`` GPUs: rollout + update (V-GRPO also prepares nothing extra with one step per rollout).
Model FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` on one forward + backward of one
sample (one pair), without activation recomputation, so MFU = counted FLOPs / time / peak (H200 bf16 dense:
989 TFLOP/s). With ``--gradient-checkpointing`` (default on, needed at 1024 px) the GPU also recomputes each
forward in backward, about a third more work than the counted model FLOPs.

One configuration; :mod:`vgrpo_lib.benchmarks.gpu_sweep` sweeps micro-batch sizes, checkpointing, SDPA backends and
compilation on the same model.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from vgrpo_lib.extras import require_extra

__all__ = [
    "SD35_MEDIUM_TRANSFORMER", "SD35_TEXT_TOKENS", "TINY_TRANSFORMER", "TINY_TEXT_TOKENS", "H200_BF16_PEAK",
    "PAPER_SAMPLES_PER_ITERATION", "build_model", "random_cond", "timed", "timed_with_warmup", "count_flops", "vgrpo_update",
    "flow_grpo_update", "run", "print_report", "make_parser", "main",
]

# stabilityai/stable-diffusion-3.5-medium, transformer/config.json (MMDiT-X: 24 blocks of width 24 x 64 = 1536,
# the first 13 with a second, image-only attention; RMS QK-norm; ~2.5B parameters).
SD35_MEDIUM_TRANSFORMER = dict(
    sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24, attention_head_dim=64,
    num_attention_heads=24, joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048,
    pos_embed_max_size=384, dual_attention_layers=tuple(range(13)), qk_norm="rms_norm",
)
SD35_TEXT_TOKENS = 77 + 256  # CLIP-L/G tokens + T5 tokens (the pipeline's max_sequence_length)

# A tiny config with the same structure (dual attention, QK-norm) for the CPU smoke test.
TINY_TRANSFORMER = dict(
    sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=2, attention_head_dim=8,
    num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=16,
    pos_embed_max_size=16, dual_attention_layers=(0,), qk_norm="rms_norm",
)
TINY_TEXT_TOKENS = 6

H200_BF16_PEAK = 989e12  # FLOP/s, dense
PAPER_SAMPLES_PER_ITERATION = 48 * 24


def build_model(tiny: bool, device: torch.device, lora_rank: int, gradient_checkpointing: bool):
    """A randomly initialised SD3.5-M-size (or tiny) transformer as a LoRA-trained protocol model."""
    require_extra("diffusers", "The SD3.5-M-size timing")
    from diffusers import SD3Transformer2DModel

    from vgrpo_lib.integrations.diffusers_adapters import SD3Velocity, add_lora, upcast_trainable_parameters

    torch.manual_seed(0)
    config = TINY_TRANSFORMER if tiny else SD35_MEDIUM_TRANSFORMER
    with torch.device(device):  # initialise on the GPU directly (a 2.5B-parameter CPU init takes minutes)
        transformer = SD3Transformer2DModel(**config).to(dtype=torch.bfloat16)
    transformer.requires_grad_(False)
    add_lora(transformer, r=lora_rank, alpha=2 * lora_rank)
    upcast_trainable_parameters(transformer)
    if gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    return SD3Velocity(transformer, autocast_dtype=torch.bfloat16)


def random_cond(batch: int, tiny: bool, device: torch.device) -> TensorDict:
    config = TINY_TRANSFORMER if tiny else SD35_MEDIUM_TRANSFORMER
    tokens = TINY_TEXT_TOKENS if tiny else SD35_TEXT_TOKENS
    return TensorDict({
        "prompt_embeds": torch.randn(batch, tokens, config["joint_attention_dim"], device=device, dtype=torch.bfloat16),
        "pooled_prompt_embeds": torch.randn(batch, config["pooled_projection_dim"], device=device, dtype=torch.bfloat16),
    }, batch_size=[batch], device=device)


def timed(fn, device: torch.device, repeats: int) -> float:
    """Mean seconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    return timed_with_warmup(fn, device, repeats)[1]


def timed_with_warmup(fn, device: torch.device, repeats: int, warmups: int = 1) -> tuple[float, float]:
    """Seconds of ``warmups`` warm-up calls of ``fn()`` (with ``torch.compile``: the compilation), and the mean
    seconds of ``repeats`` calls after them; the device is synchronised before each clock reading."""
    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    start = time.perf_counter()
    for _ in range(warmups):
        fn()
    synchronize()
    middle = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize()
    return middle - start, (time.perf_counter() - middle) / repeats


def count_flops(model, x, t, cond) -> tuple[int, int]:
    """Model FLOPs of one forward, and of one forward + backward, of the batch (no recomputation counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    transformer = model.transformer
    checkpointing = transformer.is_gradient_checkpointing
    if checkpointing:
        transformer.disable_gradient_checkpointing()
    try:
        with FlopCounterMode(display=False) as forward:
            with torch.no_grad():
                model(x, t, cond)
        with FlopCounterMode(display=False) as both:
            model(x, t, cond).float().square().mean().backward()
    finally:
        if checkpointing:
            transformer.enable_gradient_checkpointing()
        transformer.zero_grad(set_to_none=True)
    return forward.get_total_flops(), both.get_total_flops()


def vgrpo_update(model, optimizer, sample, cond, group, num_pairs: int, generator):
    """One V-GRPO gradient step on ``sample``: K pairs per sample in one batched forward, then backward."""
    from vgrpo_lib import ELBOSurrogate, VGRPOLoss, total_loss

    estimator = ELBOSurrogate(num_pairs, "stratified", "group", "adaptive_x")
    loss_module = VGRPOLoss(model, estimator, clip_range=0.01, on_policy=True)
    pairs = estimator.sample_pairs(sample, group, generator=generator)
    advantage = torch.randn(sample.shape[0], device=sample.device, generator=generator)
    batch = TensorDict({"sample": sample, "cond": cond, "group": group, "advantage": advantage, "pairs": pairs},
                       batch_size=[sample.shape[0]])

    def step():
        optimizer.zero_grad(set_to_none=True)
        total_loss(loss_module(batch)).backward()
        optimizer.step()

    return step


def flow_grpo_update(model, optimizer, transitions: TensorDict):
    """One Flow-GRPO gradient step on a minibatch of recorded SDE transitions (one forward + backward each)."""
    from vgrpo_lib import FlowGRPOLoss, total_loss

    loss_module = FlowGRPOLoss(model, clip_range=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        total_loss(loss_module(transitions)).backward()
        optimizer.step()

    return step


def run(args) -> dict:
    from vgrpo_lib.samplers import sample_sde, sample_ode, time_grid

    device = torch.device("cpu" if args.tiny else "cuda")
    shape = (16, 8, 8) if args.tiny else (16, args.resolution // 8, args.resolution // 8)
    b = args.micro_batch
    model = build_model(args.tiny, device, args.lora_rank, args.gradient_checkpointing)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-4)
    generator = torch.Generator(device=device).manual_seed(0)
    cond = random_cond(b, args.tiny, device)
    noise = torch.randn((b, *shape), device=device, generator=generator)

    one = slice(0, 1)
    forward_flops, train_flops = count_flops(model, noise[one], torch.full((1,), 0.5, device=device), cond[one])

    # Rollout: a few timed ODE steps, extrapolated to --steps.
    grid = time_grid(args.steps, shift=3.0)
    timed_steps = min(args.steps, 3)
    with torch.no_grad():
        rollout_step = timed(lambda: sample_ode(model, noise, grid[: timed_steps + 1], cond), device, 1) / timed_steps
        sample = sample_ode(model, noise, grid, cond)  # the clean samples the updates train on
    rollout_per_sample = rollout_step * args.steps / b

    group = torch.arange(b, device=device) // max(1, b // 2)  # two groups when b >= 2
    vgrpo = timed(vgrpo_update(model, optimizer, sample, cond, group, args.pairs, generator), device, args.repeats)
    vgrpo_per_sample = vgrpo / b

    sde_grid = time_grid(args.sde_steps, shift=3.0)
    with torch.no_grad():
        _, trajectory = sample_sde(model, noise, sde_grid, cond, generator=generator)
    rows = trajectory.exclude("log_prob")
    rows["old_log_prob"] = trajectory["log_prob"]
    rows["advantage"] = torch.randn(b, device=device, generator=generator)[:, None].expand(b, args.sde_steps)
    rows["cond"] = cond.unsqueeze(1).expand(b, args.sde_steps)
    transitions = rows.reshape(-1)[:b].clone()  # one minibatch of b transitions
    flow = timed(flow_grpo_update(model, optimizer, transitions), device, args.repeats)
    flow_per_sample = flow / b * args.sde_steps

    peak = args.peak_tflops * 1e12
    samples_per_gpu = PAPER_SAMPLES_PER_ITERATION / args.gpus
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (tiny config)",
        "tiny": args.tiny, "latent_shape": list(shape), "micro_batch": b, "num_pairs": args.pairs,
        "rollout_steps": args.steps, "sde_steps": args.sde_steps, "gradient_checkpointing": args.gradient_checkpointing,
        "transformer_parameters": sum(p.numel() for p in model.parameters()),
        "lora_parameters": sum(p.numel() for p in params),
        "flops_forward_per_sample": forward_flops, "flops_forward_backward_per_sample": train_flops,
        "rollout_s_per_sample": rollout_per_sample,
        "vgrpo_update_s_per_sample": vgrpo_per_sample,
        "flow_grpo_update_s_per_sample": flow_per_sample,
        "rollout_mfu": forward_flops / (rollout_step / b) / peak,
        "vgrpo_update_mfu": args.pairs * train_flops / vgrpo_per_sample / peak,
        "flow_grpo_update_mfu": args.sde_steps * train_flops / flow_per_sample / peak,
        "peak_tflops": args.peak_tflops, "gpus": args.gpus, "samples_per_iteration_per_gpu": samples_per_gpu,
        "vgrpo_s_per_iteration": samples_per_gpu * (rollout_per_sample + vgrpo_per_sample),
        "flow_grpo_s_per_iteration": samples_per_gpu * (rollout_per_sample * args.sde_steps / args.steps + flow_per_sample),
    }
    if device.type == "cuda":
        result["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def print_report(result: dict) -> None:
    print(f"{result['device']}: latents {tuple(result['latent_shape'])}, micro-batch {result['micro_batch']}, "
          f"K={result['num_pairs']}, {result['transformer_parameters'] / 1e9:.2f}B parameters "
          f"({result['lora_parameters'] / 1e6:.1f}M LoRA)")
    print(f"model FLOPs per sample: forward {result['flops_forward_per_sample'] / 1e12:.2f} T, "
          f"forward+backward {result['flops_forward_backward_per_sample'] / 1e12:.2f} T")
    for name in ("rollout", "vgrpo_update", "flow_grpo_update"):
        print(f"{name:<18}{result[f'{name}_s_per_sample']:>10.3f} s/sample   MFU {100 * result[f'{name}_mfu']:5.1f} %")
    print(f"seconds per iteration ({result['samples_per_iteration_per_gpu']:.0f} samples per GPU, paper batch on "
          f"{result['gpus']} GPU(s)): V-GRPO {result['vgrpo_s_per_iteration']:.1f}, "
          f"Flow-GRPO {result['flow_grpo_s_per_iteration']:.1f}")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny config on the CPU (tests the code path)")
    parser.add_argument("--resolution", type=int, default=1024, help="image size in pixels (latents are /8)")
    parser.add_argument("--micro-batch", type=int, default=2, help="samples per timed forward/backward")
    parser.add_argument("--pairs", type=int, default=4, help="V-GRPO timestep-noise pairs K (paper: 4)")
    parser.add_argument("--steps", type=int, default=40, help="ODE rollout steps (paper SD3.5-M: 40)")
    parser.add_argument("--sde-steps", type=int, default=10, help="Flow-GRPO SDE training steps (10)")
    parser.add_argument("--repeats", type=int, default=3, help="timed updates after one warm-up")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs the paper's 1152-sample batch is split over")
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_PEAK / 1e12, help="bf16 dense peak per GPU")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    return parser


def main(argv: list[str] | None = None) -> dict:
    args = make_parser().parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("gpu_timing needs a CUDA GPU; use --tiny to run the same code path on the CPU.")
    result = run(args)
    print_report(result)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
