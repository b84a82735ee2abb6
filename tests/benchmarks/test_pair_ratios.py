"""analysis.pair_ratios: any algorithm's median costs over another's from a finished comparison's summary."""

import json
from pathlib import Path

import pytest

from vgrpo_lib.algorithms.run_dir import read_stored_text
from vgrpo_lib.benchmarks.analysis.pair_ratios import main, pair_ratios
from vgrpo_lib.benchmarks.compare import ratio_cell
from vgrpo_lib.errors import UsageError

COMPARISON = Path(__file__).resolve().parents[2] / "results" / "compare-mnist-wan"


def test_over_the_first_variant_it_gives_the_comparisons_own_ratios(capsys):
    """Divided the way the comparison's summary divides (V-GRPO over each), every cell is the summary's own."""
    summary = json.loads(read_stored_text(COMPARISON / "summary.json"))
    table = pair_ratios(COMPARISON, "vgrpo", "diffusion_nft")
    for key, ratio in summary["ratios_vs_vgrpo"]["diffusion_nft"].items():
        reached = (summary["algorithms"]["vgrpo"][key + "_reached"], summary["algorithms"]["diffusion_nft"][key + "_reached"])
        assert f"| {key} | {reached[0]} | {reached[1]} | {ratio_cell(ratio)} |" in table
    assert main([str(COMPARISON), "vgrpo", "diffusion_nft"]) == 0 and capsys.readouterr().out == table
    # The other way round: the reciprocal ratio (a median of three seeds is one seed's value).
    flipped = pair_ratios(COMPARISON, "diffusion_nft", "vgrpo")
    assert "| heldout_time_to_target_s | 2/3 | 3/3 | 1.27" in flipped


def test_an_algorithm_the_comparison_did_not_report_is_named():
    with pytest.raises(UsageError, match=r"no reported runs of dgpo; it reported vgrpo, flow_grpo, diffusion_nft"):
        pair_ratios(COMPARISON, "dgpo", "diffusion_nft")
