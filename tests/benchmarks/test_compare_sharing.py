"""Several processes running the same comparison on the same folder share its runs: each trains the runs no other
process holds, waits for the others' and reads them back; no run is trained twice, and a run whose holder died is
continued by the next process that finds it free."""

import json
import os
import re
import subprocess
import sys

import pytest

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.compare import TUNING_SEED, VARIANTS, build, run_compare, run_name, runner, target_rule

TINY = ["prompts_per_iteration=2", "group_size=4", "rollout.num_steps=2", "eval.per_prompt=1", "eval.num_steps=2"]
ITERATIONS = 1
CONTROLS = list(VARIANTS["vgrpo"].step_controls)  # in the protocol's order
FIRST = ("vgrpo", CONTROLS[0], 1e-3, TUNING_SEED)  # the protocol's first run: variant, step control, lr, seed


def run_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "final reward" in line or " is held by " in line]


@pytest.mark.parametrize("holder_finishes", [True, False], ids=["holder finishes it", "holder dies"])
def test_a_run_another_process_holds_is_left_to_it_and_read_back_or_continued(tmp_path, monkeypatch, capsys,
                                                                             holder_finishes):
    """The first tuning run is held (its lock taken, as another process of the comparison would): this process
    trains the other two tuning runs first, then waits (once: it has nothing else to train) and, when the lock is
    free, reads the run back if its holder finished it, else trains it itself; the reported run follows."""
    variant, control, lr, seed = FIRST
    held = RunDir(tmp_path / "runs" / run_name(variant, control, lr, seed))
    held.root.mkdir(parents=True)
    held.lock()
    waits = []

    def other_process_lets_go(seconds):
        assert seconds == runner.POLL_SECONDS
        waits.append(seconds)
        held.unlock()
        if holder_finishes:
            config = build(variant, "digits8", seed, lr, control, [f"iterations={ITERATIONS}", "eval.every=10", *TINY])
            runner.train_to_end(config, held.root)

    monkeypatch.setattr(runner, "_wait", other_process_lets_go)
    summary = run_compare(tmp_path, task="digits8", seeds=1, quick=True, variants=("vgrpo",), learning_rates=(lr,),
                          overrides=TINY, iterations=ITERATIONS)
    lines = run_lines(capsys.readouterr().out)
    assert len(waits) == 1
    assert re.fullmatch(rf"{held.root.name} is held by pid {os.getpid()} host \S+: training the next free run, then "
                        rf"reading it back", lines[0])
    assert len(CONTROLS) == 3 and [line.split()[:3] for line in lines[1:]] == [
        ["[1/4]", "vgrpo", CONTROLS[1]], ["[2/4]", "vgrpo", CONTROLS[2]], ["[3/4]", "vgrpo", CONTROLS[0]],
        ["[4/4]", "vgrpo", summary["protocol"]["chosen"]["vgrpo"]["step_control"]]]
    assert lines[3].endswith("(read back)" if holder_finishes else " min)")
    assert all(line.endswith(" min)") for line in lines[1:3] + lines[4:])
    assert RunDir(held.root).lock_holder() is None and len(RunDir(held.root).read_rows("metrics.csv")) == ITERATIONS


@pytest.mark.slow
def test_two_processes_of_one_comparison_train_each_run_once_and_agree(tmp_path):
    """The same command started twice at once on one folder (as on two cores): both finish, every run is trained by
    exactly one of them (the other reads it back), both print the same target and the summary's target is the rule
    applied to the runs."""
    command = [sys.executable, "-m", "vgrpo_lib.benchmarks.cli", "compare", "--task", "digits8", "--quick",
               "--seeds", "2", "--iterations", "2", "--variants", "vgrpo", "diffusion_nft", "--learning-rates", "1e-3",
               "--out", str(tmp_path), *TINY]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for _ in range(2)]
    outputs = [process.communicate(timeout=900) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    runs = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert len(runs) == 2 * 3 + 2 * 2
    trained = [line.split() for out, _ in outputs for line in out.splitlines() if line.endswith(" min)")]
    names = sorted(run_name(words[1], words[2], float(words[4]), int(words[6].rstrip(":"))) for words in trained)
    assert names == runs  # each run trained once, by one of the two
    targets = [[line for line in out.splitlines() if line.startswith("target ")] for out, _ in outputs]
    assert targets[0] == targets[1] and len(targets[0]) == 1
    protocol = json.loads((tmp_path / "protocol.json").read_text())
    tuning = [RunDir(tmp_path / "runs" / name).read_rows("metrics.csv") for name in runs
              if name.endswith(f"seed{TUNING_SEED}")]
    assert protocol["target"] == pytest.approx(target_rule(tuning)["target"])
    assert json.loads((tmp_path / "summary.json").read_text())["protocol"] == protocol
