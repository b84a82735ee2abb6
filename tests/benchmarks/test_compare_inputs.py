"""``vgrpo compare`` checks its inputs before any run starts (issue 29.11), and ``--per-prompt 0`` is one line."""

from __future__ import annotations

import pytest

from vgrpo_lib.benchmarks.cli import main
from vgrpo_lib.benchmarks.compare import run_compare


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"seeds": 0, "quick": True}, "--seeds must be at least 1, got 0"),
    ({"seeds": 1, "quick": True, "iterations": 0}, "--iterations must be at least 1, got 0"),
])
def test_zero_seeds_or_iterations_are_refused_before_anything_is_written(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_compare(tmp_path / "cmp", **kwargs)
    assert not (tmp_path / "cmp").exists()


def test_an_out_that_is_a_file_or_a_foreign_folder_is_refused_and_left_alone(tmp_path):
    user_file = tmp_path / "notes.txt"
    user_file.write_text("mine")
    with pytest.raises(ValueError, match="is a file"):
        run_compare(user_file, seeds=1, quick=True)
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "draft.md").write_text("mine")
    with pytest.raises(ValueError, match=r"holds draft\.md, which a comparison does not write"):
        run_compare(folder, seeds=1, quick=True)
    assert sorted(p.name for p in folder.iterdir()) == ["draft.md"] and user_file.read_text() == "mine"


def test_the_command_reports_each_as_one_line(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert main(["compare", "--quick", "--seeds", "1", "--out", str(tmp_path / "f")]) == 2
    assert main(["sample", "--per-prompt", "0", "--seed", "0", "--out", str(tmp_path / "s.npz")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"vgrpo compare: error: --out {tmp_path / 'f'} is a file; a comparison writes a folder.",
                     "vgrpo sample: error: --per-prompt must be >= 1."]


def test_a_folder_shared_with_another_comparison_process_may_hold_its_temporary_files(tmp_path):
    """Another process of the same comparison writing protocol.json atomically leaves a temporary name in the folder
    for a moment: that is the comparison's own, not foreign; a user's ``.draft.tmp`` still is."""
    from vgrpo_lib.benchmarks.compare import check_comparison_folder
    from vgrpo_lib.integrations.atomic import is_temp_name

    (tmp_path / "runs").mkdir()
    writing = ".protocol.json.a1b2c3d4.vgrpo.tmp"
    assert is_temp_name(writing)
    (tmp_path / writing).write_text("{")
    check_comparison_folder(tmp_path)
    (tmp_path / ".draft.tmp").write_text("mine")
    with pytest.raises(ValueError, match=r"holds \.draft\.tmp, which a comparison does not write"):
        check_comparison_folder(tmp_path)
