"""A missing extra is one line naming the extra (vgrpo_lib.extras), in the library and on the command line."""

import subprocess
import sys
import textwrap

import pytest

from vgrpo_lib.extras import EXTRAS, MissingExtraError, missing_extra_message, missing_packages, needs_extra, require_extra

PIPELINE_TASKS = ("digit", "ocr", "geneval", "geneval_ocr")


def test_the_message_names_the_feature_the_extra_and_the_command():
    line = missing_extra_message("Task 'mnist-sd3/digit'", "diffusers", "diffusers")
    assert line == ("Task 'mnist-sd3/digit' needs the 'diffusers' extra: pip install 'vgrpo-lib[diffusers]' "
                    "(diffusers is not installed).")
    error = MissingExtraError("The ocr reward", "rewards", "rapidocr_onnxruntime")
    assert isinstance(error, ModuleNotFoundError) and error.name == "rapidocr_onnxruntime" and error.extra == "rewards"
    assert "\n" not in str(error)


def test_needs_extra_turns_a_missing_package_of_the_extra_into_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"^A LoRA adapter needs the 'diffusers' extra: pip install "
                                                r"'vgrpo-lib\[diffusers\]' \(peft is not installed\)\.$"):
        with needs_extra("diffusers", "A LoRA adapter"):
            from peft import LoraConfig  # noqa: F401


def test_needs_extra_passes_other_errors_and_other_packages_unchanged(monkeypatch):
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)
    with pytest.raises(ModuleNotFoundError) as caught:  # not a package of the diffusers extra: a bug, kept as is
        with needs_extra("diffusers", "feature"):
            import rapidocr_onnxruntime  # noqa: F401
    assert type(caught.value) is ModuleNotFoundError
    with pytest.raises(KeyError):
        with needs_extra("diffusers", "feature"):
            raise KeyError("x")
    with needs_extra("diffusers", "feature"):
        import diffusers  # noqa: F401  (installed here: nothing raised)


def test_require_extra_checks_every_package_before_use(monkeypatch):
    assert missing_packages("diffusers") == []
    require_extra("diffusers", "feature")
    monkeypatch.setitem(sys.modules, "transformers", None)  # diffusers would import; its pipelines would not load
    assert missing_packages("diffusers") == ["transformers"] and "transformers" in missing_packages("rewards")
    with pytest.raises(MissingExtraError, match=r"^Task 'x' needs the 'diffusers' extra: .*\(transformers is not"):
        require_extra("diffusers", "Task 'x'")
    require_extra("diffusers", "feature", modules=("diffusers",))  # the part a feature needs


def test_unknown_extras_and_packages_are_refused():
    with pytest.raises(ValueError, match="Unknown extra 'difusers'; the extras are: diffusers, rewards"):
        require_extra("difusers", "feature")
    with pytest.raises(ValueError, match="'wandb' is not a package of the 'diffusers' extra"):
        require_extra("diffusers", "feature", modules=("wandb",))
    assert set(EXTRAS) >= {"diffusers", "rewards", "tensorboard", "wandb"}


def run_blocked(blocked: tuple[str, ...], commands: list[list[str]], cwd) -> subprocess.CompletedProcess:
    """Run the ``vgrpo`` commands in one fresh interpreter in which the ``blocked`` packages are not importable
    (``sys.modules[name] = None``: ``import`` raises ModuleNotFoundError and ``find_spec`` answers None, as for a
    package that is not installed); prints each command's exit status."""
    script = textwrap.dedent(f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None
        from vgrpo_lib.benchmarks.cli import main
        for argv in {commands!r}:
            print("exit", main(argv), flush=True)
            print("---", file=sys.stderr, flush=True)
    """)
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_command_line_says_which_extra_to_install_without_diffusers(tmp_path):
    """Without the diffusers package, `vgrpo sample --preset mnist-sd3` (every task) and `vgrpo train` on it
    print one line naming the extra and exit with the usage status; nothing is written."""
    sample = [["sample", "--preset", "mnist-sd3", "--task", task, "--per-prompt", "1", "--steps", "2", "--seed", "0",
               "--out", str(tmp_path / f"{task}.npz")] for task in PIPELINE_TASKS]
    train = [["train", "--preset", "mnist-sd3", "--task", "digit", "--out", str(tmp_path / "run")]]
    result = run_blocked(("diffusers",), sample + train, tmp_path)
    assert result.stdout.split("\n")[:-1] == ["exit 2"] * 5, result.stdout + result.stderr
    reports = result.stderr.split("---\n")[:-1]
    assert "Traceback" not in result.stderr and len(reports) == 5, result.stderr
    for command, task, report in zip(["sample"] * 4 + ["train"], [*PIPELINE_TASKS, "digit"], reports):
        assert report.strip() == (f"vgrpo {command}: error: Task 'mnist-sd3/{task}' needs the 'diffusers' extra: "
                                  f"pip install 'vgrpo-lib[diffusers]' (diffusers is not installed)."), report
    assert not list(tmp_path.glob("*.npz")) and not (tmp_path / "run" / "config.json").exists()


def test_a_missing_logger_package_on_the_command_line_is_one_line(tmp_path):
    result = run_blocked(("wandb",), [["train", "--out", str(tmp_path / "run"), "log.backend=wandb"]], tmp_path)
    assert result.stdout.split("\n")[:-1] == ["exit 2"], result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert ("vgrpo train: error: log.backend=wandb needs the 'wandb' extra: pip install 'vgrpo-lib[wandb]' "
            "(wandb is not installed).") in result.stderr.splitlines()
