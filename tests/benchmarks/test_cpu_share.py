"""The CPU share of a comparison's runs (vgrpo_lib.benchmarks.analysis.cpu_share): what tells a run whose wall-clock
was inflated (paused, or sharing its core) from one that had its core."""

import pytest

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.analysis.cpu_share import cpu_share, main


def _run(folder, name, iterations):
    """A run whose metrics.csv holds ``iterations`` as (wall seconds, CPU seconds) per iteration."""
    rows, wall, cpu = [], 0.0, 0.0
    for number, (iteration_wall, iteration_cpu) in enumerate(iterations):
        wall, cpu = wall + iteration_wall, cpu + iteration_cpu
        rows.append({"iteration": number, "iteration_s": iteration_wall, "train_seconds": wall, "train_cpu_s": cpu})
    (folder / "runs" / name).mkdir(parents=True)
    RunDir(folder / "runs" / name).write_rows("metrics.csv", rows)


def test_a_paused_and_a_shared_run_are_marked_and_a_run_alone_on_its_core_is_not(tmp_path, capsys):
    _run(tmp_path, "alone", [(5.0, 4.9), (5.0, 4.9), (5.0, 4.8)])
    _run(tmp_path, "paused", [(5.0, 4.9), (605.0, 5.0), (5.0, 4.9)])  # kill -STOP during iteration 1
    _run(tmp_path, "shared", [(10.0, 5.0), (10.0, 5.0), (12.0, 5.0)])  # another process on the core throughout
    (tmp_path / "runs" / "not_started").mkdir()  # a run cut before its first iteration: no line
    assert cpu_share(tmp_path) == (
        "alone: CPU share 0.97 (15 of 15 s; iteration 2: 5.0 s wall, 4.8 s CPU)\n"
        "paused: CPU share 0.02 (15 of 615 s; iteration 1: 605.0 s wall, 5.0 s CPU)  CONTENDED\n"
        "shared: CPU share 0.47 (15 of 32 s; iteration 2: 12.0 s wall, 5.0 s CPU)  CONTENDED\n"
        "2 of 3 runs below a CPU share of 0.9\n")
    assert cpu_share(tmp_path, below=0.4).endswith("1 of 3 runs below a CPU share of 0.4\n")
    assert main([str(tmp_path)]) == 0 and capsys.readouterr().out == cpu_share(tmp_path)
    with pytest.raises(SystemExit):
        main([str(tmp_path / "runs" / "alone")])
    assert "has no runs/ folder" in capsys.readouterr().err
