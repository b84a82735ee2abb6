"""The config reference (``vgrpo config``, docs/reference/config.md) is generated from the code and complete."""

import json
from pathlib import Path

import pytest

from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.algorithms.config import ALGORITHMS, TrainConfig, _walk, apply_overrides, key_users, valid_keys
from vgrpo_lib.algorithms.config_reference import config_reference, config_reference_markdown, describe_config

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "config.md"


def test_every_key_has_help_text():
    """A key added without help= fails here (its # comment is not enough: no command can print it)."""
    missing = [key for key, _, f in _walk(TrainConfig()) if not f.metadata.get("help", "").strip()]
    assert not missing, f"config keys without help= in their setting(...): {missing}"
    assert [info.key for info in config_reference()] == valid_keys()


def test_the_docs_config_reference_is_the_generated_one():
    assert REFERENCE.read_text() == config_reference_markdown(), (
        "docs/reference/config.md is out of date; regenerate it with "
        "`vgrpo config --format markdown > docs/reference/config.md`"
    )


def test_the_json_format_round_trips_every_key_with_its_value_type_and_help(capsys):
    assert cli_main(["config", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["key"] for row in rows] == valid_keys()
    by_key = {row["key"]: row for row in rows}
    assert by_key["vgrpo.clip_range"] == {
        "key": "vgrpo.clip_range", "value": 0.01, "default": 0.01, "type": "float or a (low, high) pair such as 0.01,0.02",
        "allowed": "eps or a (low, high) pair with 0 <= low < 1 and high >= 0, finite",
        "help": by_key["vgrpo.clip_range"]["help"], "algorithms": ["vgrpo"],
    }
    assert by_key["rollout.solver"]["algorithms"] == ["vgrpo", "diffusion_nft", "fpo", "awm", "dgpo"]
    assert by_key["advantage.clip"]["algorithms"] == [a for a in ALGORITHMS if a != "diffusion_nft"]
    assert by_key["schedule.clip_range"]["algorithms"] == ["vgrpo", "flow_grpo", "grpo_guard", "flow_grpo_fast", "fpo", "dgpo"]
    assert by_key["optim.lr"]["algorithms"] == list(ALGORITHMS)
    # Every value, set back as an override, gives the default config again.
    overrides = [f"{row['key']}={_text(row['value'])}" for row in rows if row["key"] != "algo" and
                 row["algorithms"] and "vgrpo" in row["algorithms"]]
    assert apply_overrides(TrainConfig(), overrides) == TrainConfig()


def _text(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_one_run_lists_the_keys_it_uses_with_its_values(algo, capsys):
    config = TrainConfig.for_algo(algo, preset="official")
    assert cli_main(["config", "--algo", algo, "--preset", "official", "--format", "json"]) == 0
    rows = {row["key"]: row for row in json.loads(capsys.readouterr().out)}
    stored = json.loads(config.to_json())
    assert set(rows) == {key for key, _, _ in _walk(config)
                         if _lookup(stored, key) is not _MISSING and algo in key_users(key)}
    assert "optim.lr" in rows and ("schedule.clip_range" in rows) == (algo not in ("diffusion_nft", "awm"))
    assert rows["iterations"]["value"] == config.iterations
    if algo == "diffusion_nft":
        assert "advantage.clip" not in rows and rows["diffusion_nft.advantage_max"]["value"] == 5.0
    text = describe_config(config)
    assert text.startswith(f"Config of a {algo} run on digit") and f"algo = {algo}" in text


_MISSING = object()


def _lookup(data: dict, key: str):
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def test_an_unknown_key_points_to_vgrpo_config():
    with pytest.raises(ValueError, match="Unknown config key 'zzz_qqq'; `vgrpo config` lists the valid keys"):
        apply_overrides(TrainConfig(), ["zzz_qqq=1"])
    with pytest.raises(ValueError, match="Unknown config section 'zzz'; `vgrpo config` lists the valid sections"):
        apply_overrides(TrainConfig(), ["zzz.qqq=1"])


def test_key_users_follow_the_sections_and_what_each_algorithm_ignores():
    assert key_users("flow_grpo.window_size") == ("flow_grpo", "grpo_guard")
    assert key_users("schedule.behaviour_kl_coef") == ("vgrpo", "awm")
    assert key_users("seed") == ALGORITHMS
