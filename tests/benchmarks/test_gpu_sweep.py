"""benchmarks/gpu_sweep.sh and vgrpo_lib.benchmarks.gpu_sweep: the GPU throughput sweep (issue 32 item 3), run in its
CPU mode (the same cells at toy size, out of memory simulated), its time budget and its compile cells."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.benchmarks import gpu_sweep  # noqa: E402 (after the extras' checks)
from vgrpo_lib.benchmarks.gpu_sweep import ATTENTION_BACKENDS, Cell, Sweep, device_peak, make_parser  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_sweep.sh"
CELL_FIELDS = {"record", "phase", "micro_batch", "rows", "gradient_checkpointing", "attention", "compile", "status"}
TINY = ["--tiny", "--steps", "2", "--sde-steps", "2", "--repeats", "1", "--lora-rank", "4", "--max-micro-batch", "2",
        "--iteration-samples", "2", "--no-compile"]


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "sweep.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_cpu_mode_writes_a_record_per_cell_with_out_of_memory_and_skipped_cells(tmp_path):
    out = tmp_path / "sweep"
    subprocess.run(["bash", str(SCRIPT), "--cpu", str(out)], check=True, capture_output=True, text=True)
    lines = records(out)
    device, cells, summary = lines[0], [r for r in lines if r["record"] == "cell"], lines[-1]
    assert device["record"] == "device" and "CPU run" in device["peak_source"]
    assert device["flops_forward_per_sample"] > 0 and device["flops_forward_backward_per_sample"] > device["flops_forward_per_sample"]
    for cell in cells:
        assert CELL_FIELDS <= set(cell) and cell["status"] in {"ok", "oom", "error", "skipped"}, cell
        assert ("reason" in cell) == (cell["status"] != "ok"), cell
        if cell["status"] == "ok":
            assert cell["seconds_per_sample"] > 0 and cell["mfu"] > 0, cell

    def ladder(phase, checkpointing):
        return [(c["micro_batch"], c["status"]) for c in cells if c["phase"] == phase and c["compile"] == "none"
                and c["attention"] == "default" and c["gradient_checkpointing"] is checkpointing]

    # Every ladder fits 1 and 2 samples and runs out of memory at 4 (simulated above 2), recorded, then goes on.
    for phase, checkpointing in [("rollout", None), ("vgrpo_update", True), ("vgrpo_update", False),
                                 ("flow_grpo_update", True), ("flow_grpo_update", False)]:
        assert ladder(phase, checkpointing) == [(1, "ok"), (2, "ok"), (4, "oom")], (phase, checkpointing)
    assert ladder("vgrpo_prepare", None) == [(1, "ok"), (2, "ok")]  # at each size the update fitted
    assert all("simulated" in c["reason"] for c in cells if c["status"] == "oom")
    assert [c["rows"] for c in cells if c["phase"] == "vgrpo_update"][:2] == [4, 8]  # K = 4 pairs per sample
    backends = {(c["phase"], c["attention"]) for c in cells if c["attention"] != "default"}
    assert backends == {(phase, b) for phase in ("rollout", "vgrpo_update") for b in ATTENTION_BACKENDS}
    iteration = next(c for c in cells if c["phase"] == "iteration")
    assert iteration["status"] == "ok" and iteration["images_per_gpu_per_s"] > 0
    compiled = [c for c in cells if c["compile"] != "none"]
    assert [c["compile"] for c in compiled] == ["default", "default", "reduce-overhead"]
    assert all(c["status"] == "skipped" and c["reason"] == "--no-compile" for c in compiled)

    assert summary["record"] == "summary" and summary["after"] == "every cell"
    assert [r["after"] for r in lines if r["record"] == "summary"] == ["the eager cells", "every cell"]
    assert summary["images_per_gpu_per_s"] == iteration["images_per_gpu_per_s"]
    assert summary["images_per_gpu_per_s_estimate"]["vgrpo"] > 0 and summary["verl_omni_images_per_gpu_per_s"] == 0.51
    assert summary["best"]["vgrpo_update"]["micro_batch"] in (1, 2)
    assert summary["cells"]["oom"] == 5 and summary["cells"]["skipped"] == 3
    assert (out / "commands.txt").read_text().startswith("python -m vgrpo_lib.benchmarks.gpu_sweep --tiny")
    assert (out / "sweep.txt").stat().st_size > 0


class StepClock:
    """A clock that moves one second each time it is read (what the budget sees; no real time involved)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_time_budget_skips_the_remaining_cells_and_records_them(tmp_path):
    args = make_parser().parse_args([*TINY, "--out", str(tmp_path), "--budget-s", "12"])
    summary = Sweep(args, clock=StepClock()).run()
    cells = [r for r in records(tmp_path) if r["record"] == "cell"]
    statuses = [c["status"] for c in cells]
    first_skipped = statuses.index("skipped")
    assert first_skipped > 0 and statuses[0] == "ok"  # measured while the budget lasted
    assert set(statuses[first_skipped:]) == {"skipped"}  # then every remaining cell is written as skipped
    assert all(c["reason"].startswith("time budget:") for c in cells[first_skipped:] if c["compile"] == "none")
    assert summary["cells"]["skipped"] == len(cells) - first_skipped


def test_a_compile_cell_compiles_the_transformer_and_puts_it_back(tmp_path, monkeypatch):
    compiled = []

    def fake_compile(module, **options):  # torch.compile's interface, without the compilation (minutes on a CPU)
        compiled.append(options)
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    sweep = Sweep(make_parser().parse_args([*TINY, "--out", str(tmp_path)]))
    transformer = sweep.model.transformer
    record = sweep.run_cell(Cell("vgrpo_update", 1, gradient_checkpointing=True, compile="default"))
    assert record["status"] == "ok" and compiled == [{"mode": None, "dynamic": False}]
    assert sweep.model.transformer is transformer and not transformer.is_gradient_checkpointing
    record = sweep.run_cell(Cell("rollout", 1, compile="reduce-overhead"))
    assert record["status"] == "ok" and compiled[-1] == {"mode": "reduce-overhead", "dynamic": False}


@pytest.mark.parametrize("name, peak, which", [
    ("NVIDIA H100 80GB HBM3", 989e12, "H100 SXM"), ("NVIDIA H200", 989e12, "H200"),
    ("NVIDIA H100 PCIe", 756e12, "H100 PCIe"), ("Some Future GPU", 989e12, "unknown device 'Some Future GPU'"),
])
def test_the_peak_is_the_devices_by_name(name, peak, which, monkeypatch):
    monkeypatch.setattr(gpu_sweep.torch.cuda, "get_device_name", lambda device=None: name)
    assert device_peak(torch.device("cuda"), None)[0] == peak
    assert which in device_peak(torch.device("cuda"), None)[1]
    assert device_peak(torch.device("cuda"), 500.0) == (500e12, "500 TFLOP/s as given (--peak-tflops)")


def test_cuda_mode_says_when_no_gpu_is_visible(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode != 0 and "gpu_sweep needs a CUDA GPU" in result.stderr
