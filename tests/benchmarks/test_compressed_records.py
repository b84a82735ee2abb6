"""A comparison's records kept compressed (``vgrpo compress FILE``, as results/ keeps its summaries, protocols and
longer logs; ``vgrpo compress RUN``, its runs' configs and tables): read back exactly by every reader, a run's own
files refused alone."""

import gzip
import json
import os
from pathlib import Path

import pytest

from vgrpo_lib.algorithms.cli import main as cli_main, run_folders
from vgrpo_lib.algorithms.errors import DamagedFileError
from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.run_dir import RunDir, compress_file, read_stored_text, stored_path, write_uncompressed_text
from vgrpo_lib.benchmarks.analysis.heldout_selection import heldout_selection
from vgrpo_lib.benchmarks.analysis.protocol_wall_times import protocol_wall_times
from vgrpo_lib.benchmarks.compare import FinishedRun, check_comparison_folder, start_or_resume
from tests.algorithms.conftest import TINY

RESULTS = Path(__file__).resolve().parents[2] / "results"
WRITTEN_NS = 1_800_000_000 * 10**9  # 2027-01-15 08:00:00 UTC


def test_a_compressed_summary_reads_back_equal_to_the_json_it_replaced(tmp_path, capsys):
    summary = {"protocol": {"task": "digit", "target": 0.6125}, "per_seed": {"vgrpo": [{"final_reward": 0.7071}]}}
    path, packed = tmp_path / "summary.json", tmp_path / "summary.json.gz"
    text = json.dumps(summary, indent=2) + "\n"
    path.write_text(text)
    os.utime(path, ns=(WRITTEN_NS, WRITTEN_NS))
    assert cli_main(["compress", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: compressed to summary.json.gz, ")
    assert not path.exists() and gzip.decompress(packed.read_bytes()).decode() == text
    assert read_stored_text(path) == text and json.loads(read_stored_text(path)) == summary
    assert stored_path(path) == packed and packed.stat().st_mtime_ns == WRITTEN_NS  # when it was written
    write_uncompressed_text(path, "{}\n")  # written afresh: the copy is out of date and removed
    assert read_stored_text(path) == "{}\n" and not packed.exists()


def test_a_missing_or_damaged_stored_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"summary\.json nor its compressed copy summary\.json\.gz"):
        read_stored_text(tmp_path / "summary.json")
    (tmp_path / "summary.json.gz").write_bytes(b"not gzip")
    with pytest.raises(DamagedFileError, match=r"summary\.json\.gz is not a readable text file"):
        read_stored_text(tmp_path / "summary.json")


def test_compress_refuses_a_compressed_file_and_what_a_run_reads_as_it_is(tmp_path, capsys):
    (tmp_path / "compare.log.gz").write_bytes(gzip.compress(b"[1/1] ...\n"))
    assert cli_main(["compress", str(tmp_path / "compare.log.gz")]) == 2
    assert "compare.log.gz is already compressed" in capsys.readouterr().err
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    files = {"config.json": "{}\n", ".lock": "", "checkpoints/iter_000001.json": "{}\n", "metrics.csv": "iteration\n0\n",
             "train.log": "iteration 0\n"}
    for name, text in files.items():
        (run / name).write_text(text)
    for own in ("config.json", ".lock", "checkpoints/iter_000001.json"):
        assert cli_main(["compress", str(run / own)]) == 2
        err = capsys.readouterr().err
        assert f"is one of the run {run}'s own files (its config, lock or checkpoints), not compressed alone" in err
        assert f"`vgrpo compress {run}` compresses its config and tables" in err
        assert (run / own).exists() and not (run / f"{own}.gz").exists()
    for name in ("metrics.csv", "train.log"):  # a table, and the run's printed output kept beside it (as results/ does)
        assert cli_main(["compress", str(run / name)]) == 0
        assert read_stored_text(run / name) == files[name] and not (run / name).exists()
    assert cli_main(["compress", str(run)]) == 0  # the whole run: its config as well, its lock and checkpoints never
    assert read_stored_text(run / "config.json") == files["config.json"] and not (run / "config.json").exists()
    assert (run / ".lock").exists() and sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001.json"]
    assert cli_main(["compress", str(run / "config.json.gz")]) == 2
    assert "config.json.gz is already compressed" in capsys.readouterr().err


def test_a_run_compressed_whole_is_still_a_run_and_a_comparison_reads_it_back(tmp_path, capsys):
    """``vgrpo compress RUN`` compresses the config too: the run is still listed, its config and id read back, and a
    comparison given the same setting takes it as finished (nothing retrained); another setting is refused."""
    config = build_config("vgrpo", None, "testbed", TINY)  # 2 iterations, no evaluation between
    finished, started = RunDir(tmp_path / "finished"), RunDir(tmp_path / "started")
    for run, iterations in ((finished, 2), (started, 1)):
        run.write_config(config.to_json(), run.root.name)
        run.write_rows("metrics.csv", [{"iteration": i, "reward_mean": 0.5 + i / 10} for i in range(iterations)])
    finished.write_jsonl("eval.jsonl", [{"iteration": i, "reward_mean": 0.4 + i / 10} for i in (0, 2)])
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "config.json.gz").write_bytes(gzip.compress(b"{}"))  # no table: not a run
    assert cli_main(["compress", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path}: 5 files (configs and tables) of 2 runs compressed, ")
    assert sorted(p.name for p in finished.root.iterdir()) == ["config.json.gz", "eval.jsonl.gz", "metrics.csv.gz"]
    assert run_folders(tmp_path) == [finished.root, started.root]
    assert finished.exists() and finished.train_config().to_json() == config.to_json()
    assert finished.run_id() == "finished" and finished.read_config() == json.loads(config.to_json())
    back = start_or_resume(config, finished.root)
    assert isinstance(back, FinishedRun) and back.metrics == finished.read_rows("metrics.csv")
    assert back.evaluations == finished.read_jsonl("eval.jsonl")
    other = build_config("vgrpo", None, "testbed", [*TINY, "group_size=2"])
    with pytest.raises(ValueError, match="holds a run of another setting"):
        start_or_resume(other, finished.root)
    with pytest.raises(ValueError, match="holds a run of another setting"):
        start_or_resume(other, started.root)


def test_a_comparison_folder_with_compressed_records_may_be_continued(tmp_path):
    for name in ("summary.json.gz", "protocol.json.gz", "summary.md"):
        (tmp_path / name).write_text("")
    check_comparison_folder(tmp_path)
    (tmp_path / "notes.json.gz").write_text("")
    with pytest.raises(ValueError, match=r"holds notes\.json\.gz, which a comparison does not write"):
        check_comparison_folder(tmp_path)


def test_the_analyses_read_a_compressed_summary_as_the_plain_one(tmp_path):
    committed = read_stored_text(RESULTS / "compare-mnist-sd3-ocr" / "summary.json")
    for name in ("plain", "packed"):  # the packed comparison's run keeps its config compressed as well
        (tmp_path / name / "runs" / "vgrpo_one_step_lr0.001_seed0").mkdir(parents=True)
        (tmp_path / name / "runs" / "vgrpo_one_step_lr0.001_seed0" / "config.json").write_text("{}")
        (tmp_path / name / "summary.json").write_text(committed)
        for path in (tmp_path / name / "runs" / "vgrpo_one_step_lr0.001_seed0" / "config.json", tmp_path / name / "summary.json"):
            os.utime(path, ns=(WRITTEN_NS, WRITTEN_NS + 600 * 10**9 * (path.name == "summary.json")))
    compress_file(tmp_path / "packed" / "summary.json")
    compress_file(tmp_path / "packed" / "runs" / "vgrpo_one_step_lr0.001_seed0" / "config.json")
    report = heldout_selection(tmp_path).splitlines()
    assert report[0].startswith("packed (held-out target ") and len(report) % 2 == 1
    half = (len(report) - 1) // 2
    assert report[1:half] == report[half + 1:-1] and report[half].startswith("plain (held-out target ")
    wall = (tmp_path / "protocol-packed", tmp_path / "protocol-plain")
    for name, folder in zip(("packed", "plain"), wall):
        (tmp_path / name).rename(folder)
    assert protocol_wall_times(tmp_path) == ("protocol-packed: 10 min (08:00:00 to 08:10:00 UTC)\n"
                                             "protocol-plain: 10 min (08:00:00 to 08:10:00 UTC)\n")


def test_no_committed_file_is_kept_both_plain_and_compressed():
    """A stale copy beside its file would be ignored by every reader (the plain file wins)."""
    assert [str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*.gz") if p.with_suffix("").exists()] == []


def test_each_committed_comparison_s_summary_states_its_protocol():
    """Both read back (compressed or not) and agree: the summary records the protocol fixed before the reported runs."""
    folders = sorted({path.parent for path in RESULTS.glob("*/protocol.json*")})
    assert len(folders) >= 13
    for folder in folders:
        protocol = json.loads(read_stored_text(folder / "protocol.json"))
        assert json.loads(read_stored_text(folder / "summary.json"))["protocol"] == protocol, folder.name
