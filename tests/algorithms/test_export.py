"""``vgrpo export`` on the testbed: the exported safetensors rebuild the policy the run evaluates (its EMA when on),
with a model card; a run without checkpoint and a non-empty --out are one-line errors with exit code 3."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.algorithms.errors import EXIT_RUN_DIR
from vgrpo_lib.algorithms.export import export_run
from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained


def _trained(tiny_config, path, *overrides):
    trainer = Trainer(tiny_config("vgrpo", "iterations=1", *overrides), path, progress=False)
    trainer.train()
    return trainer


def test_export_round_trips_the_trained_testbed_policy_with_its_card(tiny_config, tmp_path):
    trainer = _trained(tiny_config, tmp_path / "run")
    assert cli_main(["export", "--run", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "digits8_policy.json",
                                                                     "digits8_policy.safetensors"]
    exported = load_pretrained("digits8_policy", directory=tmp_path / "out")
    trained = trainer.policy.state_dict()
    stored = load_file(tmp_path / "out" / "digits8_policy.safetensors")
    assert stored.keys() == trained.keys() and all(v.dtype == torch.float32 for v in stored.values())
    for key, value in exported.state_dict().items():
        torch.testing.assert_close(value, trained[key], rtol=0, atol=0)
    base = load_pretrained("digits8_policy")
    assert any(not torch.equal(value, base.state_dict()[key]) for key, value in trained.items())  # it did train

    card = (tmp_path / "out" / "README.md").read_text()
    last = RunDir(tmp_path / "run").read_jsonl("eval.jsonl")[-1]
    assert "| algorithm | vgrpo |" in card and "| iterations | 1 of 1" in card and "| weights | the trained weights |" in card
    assert "task | digits8:" in card and "## Evaluation (iteration 1;" in card
    assert "| accuracy | " in card and f"{last['accuracy']:.4g} |" in card
    assert f"load_pretrained('digits8_policy', directory={str(tmp_path / 'out')!r})" in card


def test_export_writes_the_ema_weights_when_the_run_keeps_an_ema(tiny_config, tmp_path):
    trainer = _trained(tiny_config, tmp_path / "run", "optim.ema_decay=0.5", "optim.epochs=3")
    export_run(tmp_path / "run", tmp_path / "out")
    exported = load_pretrained("digits8_policy", directory=tmp_path / "out")
    with trainer.ema.swapped_in():
        evaluated = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    differs = False
    for key, value in exported.state_dict().items():
        torch.testing.assert_close(value, evaluated[key], rtol=0, atol=0)
        differs |= not torch.equal(value, trainer.policy.state_dict()[key])
    assert differs  # the average is not the raw trained weights
    assert "| weights | EMA of the trained weights (optim.ema_decay=0.5" in (tmp_path / "out" / "README.md").read_text()


def test_export_errors_are_one_line_with_exit_code_3(tiny_config, tmp_path, capsys):
    stopped = tmp_path / "stopped"
    trainer = Trainer(tiny_config("vgrpo", "iterations=1"), stopped, progress=False)
    trainer.run.write_config(trainer.config.to_json(), trainer.run_id)  # a run stopped before its first checkpoint
    assert cli_main(["export", "--run", str(stopped), "--out", str(tmp_path / "out")]) == EXIT_RUN_DIR
    assert capsys.readouterr().err.strip() == f"vgrpo export: error: {stopped} has no checkpoint yet."
    assert not (tmp_path / "out").exists()

    run = tmp_path / "run"
    _trained(tiny_config, run)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert cli_main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == EXIT_RUN_DIR
    error = capsys.readouterr().err.strip()
    assert error == f"vgrpo export: error: {tmp_path / 'out'} already exists and is not an empty folder; choose a new --out."
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
    (tmp_path / "out" / "keep.txt").unlink()
    assert cli_main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 0  # an empty folder is fine


def test_exported_files_get_the_mode_of_a_plain_open_not_0600(tiny_config, tmp_path, monkeypatch):
    """diffusers' ``save_lora_weights`` writes through safetensors, which makes its files 0600: an export is for
    sharing, so every file gets ``0666 & ~umask`` (0644 under umask 022)."""
    import os
    import stat

    from safetensors.torch import save_file

    from vgrpo_lib.integrations.testbed import tasks as testbed_tasks

    def export_like_diffusers(self, policy, directory):
        save_file({k: v.contiguous() for k, v in policy.state_dict().items()}, f"{directory}/lora.safetensors")
        return {"base_model": "the testbed's", "usage": "..."}

    _trained(tiny_config, tmp_path / "run")
    monkeypatch.setattr(testbed_tasks.Task, "export_policy", export_like_diffusers)
    previous = os.umask(0o022)
    try:
        files = export_run(tmp_path / "run", tmp_path / "out")
    finally:
        os.umask(previous)
    assert [p.name for p in files] == ["README.md", "lora.safetensors"]
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {"README.md": 0o644, "lora.safetensors": 0o644}
