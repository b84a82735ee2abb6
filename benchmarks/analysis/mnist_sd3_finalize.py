"""Measure (and optionally ship) a flow snapshot of a headroom pilot (``headroom_pilot.py ... SNAPSHOT_DIR``).
Usage: python -m vgrpo_lib.benchmarks.analysis.mnist_sd3_finalize SNAPSHOT_DIR STEP PILOT_LOG [save]
PILOT_LOG is the pilot's printed log: its "latents" line gives the VAE's latent statistics, its "recipe" line the
flow recipe, its lines the wall times. Prints the card's metrics (``train.measure``) and writes them to
SNAPSHOT_DIR/measure_STEP.json; with ``save``, also writes the folder with ``train.save_pipeline`` and a card
whose recipe is the pilot's with ``steps=STEP``.
(Its first version, in the history at 4476f6b, read the snapshots of ``pilot.py`` from /tmp/s.)
"""

from __future__ import annotations

import sys, json, time, torch
from vgrpo_lib.integrations.rewards.simple import ocr_engine
from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained
from vgrpo_lib.integrations.testbed.mnist_sd3.build import build_pipeline
from vgrpo_lib.integrations.testbed.mnist_sd3.card import describe
from vgrpo_lib.integrations.testbed.mnist_sd3.train import VAE_RECIPE, measure, save_pipeline

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(2)
    folder, step = argv[1], int(argv[2])
    pipe = build_pipeline(seed=0)
    state = torch.load(f"{folder}/flow_{step}.pt")
    for k, v in state.items(): getattr(pipe, k).load_state_dict(v)
    lines = [json.loads(line) for line in open(argv[3]) if line.startswith("{")]
    recipe = {k: v for k, v in next(r for r in lines if r["stage"] == "recipe").items() if k not in ("stage", "time")}
    latents = next(r for r in lines if r["stage"] == "latents")
    pipe.vae.register_to_config(shift_factor=latents["shift_factor"], scaling_factor=latents["scaling_factor"])
    for m in (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2): m.eval()
    t = time.perf_counter()
    metrics = measure(pipe, load_pretrained("classifier"), ocr_engine())
    print(json.dumps({k: v for k, v in metrics.items() if k != "vae_round_trip"}), round(time.perf_counter() - t), flush=True)
    json.dump(metrics, open(f"{folder}/measure_{step}.json", "w"), indent=1)
    if argv[4:] == ["save"]:
        vae_s = next(r for r in lines if r["stage"] == "vae")["time"]
        step_s = next(r for r in lines if r.get("step") == step)["time"]
        note = ("Wall times of the headroom pilot that produced these weights (`results/mnist-sd3-pipeline/headroom_pilot.py`: the "
                "rebuild's computation, the same seeds and code, at 2 torch threads, nothing else running), INCLUDING its "
                "periodic evaluations of the flow (about 40 s each); the flow weights are its "
                f"step-{step} snapshot. Measuring the card's numbers took {(time.perf_counter() - t) / 60:.1f} min.")
        card = describe(pipe, metrics, VAE_RECIPE, {**recipe, "steps": step},
                        {"vae_s": vae_s, "train_s": step_s, "total_s": step_s, "note": note})
        save_pipeline(pipe, card)
    return 0


if __name__ == "__main__":
    sys.exit(main())
