import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib.benchmarks.compare import time_to_target


def test_time_to_target_uses_the_smoothed_reward():
    rows = [
        {"reward_mean": r, "train_seconds": 10.0 * (i + 1), "train_cpu_s": 20.0 * (i + 1), "nfe_cumulative": 14 * (i + 1),
         "grad_steps": i + 1}
        for i, r in enumerate([0.1, 0.9, 0.2, 0.8, 0.9, 0.95])
    ]
    # Moving averages over 3: 0.1, 0.5, 0.4, 0.633, 0.633, 0.883 -> first >= 0.8 at index 5.
    assert time_to_target(rows, 0.8) == {
        "time_to_target_s": 60.0, "cpu_time_to_target_s": 120.0, "nfe_to_target": 84, "steps_to_target": 6
    }
    assert time_to_target(rows, 0.99)["time_to_target_s"] is None
    # A row without its costs is an error, not a target never reached; only CPU time may be missing (older runs).
    with pytest.raises(KeyError, match="nfe_cumulative"):
        time_to_target([{k: v for k, v in row.items() if k != "nfe_cumulative"} for row in rows], 0.8)
    assert time_to_target([{k: v for k, v in row.items() if k != "train_cpu_s"} for row in rows], 0.8)["nfe_to_target"] == 84


def test_the_heldout_target_is_the_same_rule_on_the_evaluations_and_its_clock_starts_after_the_base():
    """One sampler scores every algorithm's evaluations, so the held-out rule reads them the way the training rule
    reads training rewards: base the iteration-0 evaluation (the base policy), ceiling the best evaluation (no
    smoothing: each is a fixed held-out set). The first evaluation reaching the target gives the costs; the base
    evaluation never counts, even when the target is at the base."""
    from vgrpo_lib.benchmarks.compare import heldout_target_rule, heldout_time_to_target

    def evaluations(*rewards):
        return [{"iteration": 10 * i, "reward_mean": r, "train_seconds": 5.0 * i, "train_cpu_s": 9.0 * i,
                 "nfe_cumulative": 14 * 10 * i, "grad_steps": 2 * i} for i, r in enumerate(rewards)]

    runs = [evaluations(0.5, 0.55, 0.7, 0.65), evaluations(0.5, 0.6, 0.6, 0.9)]
    rule = heldout_target_rule(runs)
    assert (rule["base"], rule["ceiling"]) == (0.5, 0.9) and rule["target"] == pytest.approx(0.5 + 0.8 * 0.4)
    assert heldout_target_rule(runs[::-1]) == rule
    assert heldout_time_to_target(runs[1], rule["target"]) == {
        "heldout_time_to_target_s": 15.0, "heldout_cpu_time_to_target_s": 27.0, "heldout_nfe_to_target": 420,
        "heldout_steps_to_target": 6}
    assert heldout_time_to_target(runs[0], rule["target"])["heldout_time_to_target_s"] is None
    assert heldout_time_to_target(runs[0], 0.5)["heldout_time_to_target_s"] == 5.0  # not 0: the base does not count


def test_regime_verdicts():
    from vgrpo_lib.benchmarks.ablations import verdict

    def cell(final, base=0.5):
        return {"final_reward": {"mean": final, "std": 0.0}, "base_reward": base}

    # V-GRPO gains 0.4 over the base; the margin is 20% of that gain (0.08).
    assert verdict(cell(0.85), cell(0.9)) == "keeps up"
    assert verdict(cell(0.7), cell(0.9)) == "lags"
    assert verdict(cell(0.4), cell(0.9)) == "diverges"
    assert verdict(cell(1.0), cell(0.9)) == "naive better"  # 0.1 above V-GRPO, beyond the 0.08 margin
    # V-GRPO itself ends below its base (the "4 steps per rollout" cell at lr 3e-4): no verdict on the naive one.
    assert verdict(cell(0.9), cell(0.4)) == "collapses" and verdict(cell(0.3), cell(0.45)) == "collapses"


def test_target_rule_depends_on_every_algorithm_alike():
    from vgrpo_lib.benchmarks.compare import target_rule

    def curve(*rewards):
        return [{"reward_mean": r} for r in rewards]

    # base: mean first-iteration reward 0.4; ceiling: best 3-iteration average (0.6, 0.9, 0.9 -> 0.8).
    rule = target_rule([curve(0.3, 0.5, 0.6), curve(0.5, 0.6, 0.9, 0.9)])
    assert rule["base"] == pytest.approx(0.4) and rule["ceiling"] == pytest.approx(0.8)
    assert rule["target"] == pytest.approx(0.4 + 0.8 * 0.4)
    # Swapping which algorithm produced which curve changes nothing.
    assert target_rule([curve(0.5, 0.6, 0.9, 0.9), curve(0.3, 0.5, 0.6)]) == rule


def test_median_ratio_interval():
    from vgrpo_lib.benchmarks.compare import median_ratio_interval

    same = median_ratio_interval([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0])
    assert same["ratio"] == 1.0 and same["interval"][0] <= 1.0 <= same["interval"][1]
    half = median_ratio_interval([1.0, 1.1, 0.9, 1.05, 0.95], [2.0, 2.2, 1.8, 2.1, 1.9])
    assert half["ratio"] == pytest.approx(0.5) and 0.4 < half["interval"][0] <= 0.5 <= half["interval"][1] < 0.62
    assert median_ratio_interval([1.0] * 5, [2.0] * 5) == median_ratio_interval([1.0] * 5, [2.0] * 5)  # fixed RNG
    # A seed that never reached the target counts as infinite: a minority leaves the median finite ...
    some = median_ratio_interval([1.0, 1.0, 1.0, 1.0, None], [2.0] * 5)
    assert some["ratio"] == 0.5
    # ... a majority makes it infinite, and the ratio is not estimable.
    most = median_ratio_interval([None, None, None, 1.0, 1.0], [2.0] * 5)
    assert most["ratio"] is None and most["interval"] is None
    # Finite medians but too many resamples with an infinite one: the ratio stands, the interval does not, and the
    # summary's cell says why instead of showing a bare number.
    from vgrpo_lib.benchmarks.compare import ratio_cell

    thin = median_ratio_interval([1.0, 1.0, 1.0, None, None], [2.0, 2.0, 2.0, None, None])
    assert thin["ratio"] == 0.5 and thin["interval"] is None and 0.0 < thin["estimable_share"] < 0.9
    assert ratio_cell(thin) == f"0.50 (no interval: {thin['estimable_share']:.0%} of resamples estimable)"
    assert ratio_cell(half) == f"0.50 [{half['interval'][0]:.2f}, {half['interval'][1]:.2f}]"
    assert ratio_cell(most) == "—"


def test_selection_key_orders_tuning_runs_by_the_named_target():
    """Reached first, then sooner, then the higher final reward; the held-out key reads the held-out columns only."""
    from vgrpo_lib.benchmarks.compare import selection_key

    def run(time, reward, heldout_time, eval_reward):
        return {"time_to_target_s": time, "final_reward": reward, "heldout_time_to_target_s": heldout_time,
                "final_eval_reward": eval_reward}

    fast_on_training = run(10.0, 0.9, None, 0.50)   # first to the training target, never to the held-out one
    fast_held_out = run(30.0, 0.8, 40.0, 0.70)
    never = run(None, 0.95, None, 0.60)
    runs = {"a": fast_on_training, "b": fast_held_out, "c": never}
    assert min(runs, key=lambda k: selection_key(runs[k])) == "a"
    assert min(runs, key=lambda k: selection_key(runs[k], by="heldout")) == "b"
    # Neither reaches the held-out target: the higher final evaluation reward wins, not the training reward.
    del runs["b"]
    assert min(runs, key=lambda k: selection_key(runs[k], by="heldout")) == "c"
    with pytest.raises(ValueError, match="by='eval'.*the target that selects"):
        selection_key(never, by="eval")


def test_the_kept_selection_counts_a_run_that_falls_back_below_the_held_out_target_as_a_miss():
    """``heldout-kept``: the held-out time of a run whose final evaluation ends below the target counts as a miss,
    so a setting that crosses the target first and falls back loses to a slower one that stays above it (the
    digit comparison at equal compute chose such a rate by ``heldout``: results/compare-mnist-sd3-digit-nfe/)."""
    from vgrpo_lib.benchmarks.compare import selection_key

    def runs(*pairs):  # (held-out time to target, final held-out reward) per tuning seed; the target is 0.886
        return [{"heldout_time_to_target_s": t, "final_eval_reward": r, "heldout_target_kept": r >= 0.886}
                for t, r in pairs]

    settings_ = {"crosses_then_falls": runs((112.0, 0.788), (73.0, 0.343), (114.0, 0.776)),
                 "stays": runs((151.0, 0.930), (152.0, 0.911), (179.0, 0.928)),
                 "one_fall": runs((136.0, 0.863), (92.0, 0.966), (157.0, 0.956))}
    assert min(settings_, key=lambda k: selection_key(settings_[k], by="heldout")) == "crosses_then_falls"
    assert min(settings_, key=lambda k: selection_key(settings_[k], by="heldout-kept")) == "stays"
    assert selection_key(settings_["one_fall"], by="heldout-kept") == (1, 157.0, -(0.863 + 0.966 + 0.956) / 3)
    # Where every run keeps the target the two held-out selections agree.
    kept = {name: rows for name, rows in settings_.items() if all(row["heldout_target_kept"] for row in rows)}
    assert all(selection_key(rows, by="heldout") == selection_key(rows, by="heldout-kept") for rows in kept.values())



def _one_seed_key(result: dict, by: str) -> tuple:
    """The one-tuning-seed key as the protocol first defined it (benchmarks/compare/stats.py at 2502cb9)."""
    time = result["time_to_target_s" if by == "training" else "heldout_time_to_target_s"]
    reward = result["final_reward" if by == "training" else "final_eval_reward"]
    return (time is None, 0.0 if time is None else time, -reward)


_TIMES = st.one_of(st.none(), st.floats(0.0, 100.0))


@settings(max_examples=200, deadline=None)
@given(runs=st.lists(st.tuples(_TIMES, st.floats(0.0, 1.0), _TIMES, st.floats(0.0, 1.0)), min_size=2, max_size=6),
       by=st.sampled_from(["training", "heldout"]))
def test_one_tuning_seed_selects_as_the_protocol_always_has(runs, by):
    """With one run per setting the key orders settings as the one-seed key did, so every kept comparison selects
    the same (ties aside: both keys tie on the same pairs)."""
    from vgrpo_lib.benchmarks.compare import selection_key

    rows = [{"time_to_target_s": a, "final_reward": b, "heldout_time_to_target_s": c, "final_eval_reward": d}
            for a, b, c, d in runs]
    for x in rows:
        for y in rows:
            assert (selection_key(x, by) < selection_key(y, by)) == (_one_seed_key(x, by) < _one_seed_key(y, by))


def test_several_tuning_seeds_select_by_misses_then_median_time_then_mean_reward():
    from vgrpo_lib.benchmarks.compare import selection_key

    def runs(*times, reward=0.5):
        return [{"time_to_target_s": t, "final_reward": reward} for t in times]

    settings_ = {"lucky": runs(5.0, 6.0, None), "steady": runs(9.0, 9.0, 9.0), "fast": runs(5.0, 7.0, 8.0)}
    assert min(settings_, key=lambda k: selection_key(settings_[k])) == "fast"
    del settings_["fast"]
    assert min(settings_, key=lambda k: selection_key(settings_[k])) == "steady"  # one miss loses to none
    assert selection_key(runs(None, None, reward=0.9)) < selection_key(runs(None, None, reward=0.2))
    assert selection_key(runs(4.0, None, 6.0)) == (1, 6.0, -0.5)  # a miss counts as infinite in the median


def test_every_variant_builds_every_step_control_with_an_equal_budget():
    """Each algorithm of the comparison (baselines and peers) is tuned over as many settings as every other, and
    each of them is a valid configuration with one gradient step per rollout and two epochs among them."""
    from vgrpo_lib.benchmarks.compare import VARIANTS, build

    sizes = {name: len(variant.step_controls) for name, variant in VARIANTS.items()}
    assert len(set(sizes.values())) == 1, sizes
    for name, variant in VARIANTS.items():
        assert {"one_step", "two_epochs"} <= set(variant.step_controls), name
        one = build(name, "digit", 0, 1e-4, "one_step", [])
        two = build(name, "digit", 0, 1e-4, "two_epochs", [])
        assert (one.optim.epochs, one.optim.minibatches, two.optim.epochs) == (1, 1, 2)
        assert one.algo == variant.algo


def test_summary_shows_where_the_time_goes_and_each_part_of_the_evaluation():
    from vgrpo_lib.benchmarks.compare import aggregate_seeds, markdown_table, summarise_run

    phases = {"rollout_s": 2.0, "reward_s": 0.5, "prepare_s": 0.5, "update_s": 1.0, "iteration_s": 4.0}
    metrics = [{"reward_mean": 0.1 * i, "train_seconds": 4.0 * (i + 1), "train_cpu_s": 8.0 * (i + 1),
                "nfe_cumulative": 10 * (i + 1), "grad_steps": i + 1, "nfe_per_sample": 10,
                **{phase: (i + 1) * seconds for phase, seconds in phases.items()}} for i in range(3)]

    def evaluation(iteration, counting, judged):
        return {"iteration": iteration, "reward_mean": 0.3, "accuracy": 0.2, "geneval/counting": counting,
                "judge_geneval/counting": judged, "train_seconds": 4.0 * iteration, "train_cpu_s": 8.0 * iteration,
                "nfe_cumulative": 10 * iteration, "grad_steps": iteration}

    runs = [summarise_run(metrics, [evaluation(0, 0.1, 0.2), evaluation(3, final, 0.4)], 0.15, 0.3) for final in (0.5, 0.7)]
    assert runs[0]["mean_rollout_s"] == 4.0 and runs[0]["mean_iteration_s"] == 8.0  # (2 + 4 + 6) / 3, (4 + 8 + 12) / 3
    assert (runs[0]["base_geneval/counting"], runs[0]["final_geneval/counting"]) == (0.1, 0.5)
    row = aggregate_seeds(runs) | {"step_control": "one_step", "lr": 1e-3}
    assert row["final_geneval/counting"] == pytest.approx(0.6)
    protocol = {"tuning_seed": 100, "target": 0.15, "rule": "a rule", "base": 0.0, "ceiling": 0.2,
                "heldout": {"target": 0.3, "rule": "the held-out rule", "base": 0.3, "ceiling": 0.3}}
    text = markdown_table({"protocol": protocol, "task": "geneval", "seeds": 2, "algorithms": {"vgrpo": row},
                           "ratios_vs_vgrpo": {}}).splitlines()
    assert "| vgrpo | 4.00 (50%) | 1.00 (12%) | 1.00 (12%) | 2.00 (25%) | 8.00 (100%) |" in text
    assert "| geneval/counting | 0.1 -> 0.6 |" in text and "| judge_geneval/counting | 0.2 -> 0.4 |" in text
    # The held-out target (0.3) is reached at the second evaluation (iteration 3: 12 s, 30 NFE) by both seeds.
    assert "| vgrpo | 2/2 | 12 | 30 | — | — |" in text and any("the held-out rule" in line for line in text)


def test_an_undefined_diversity_is_missing_in_the_summary_not_a_nan():
    """One sample per prompt (eval.per_prompt=1, as the MNIST-Wan comparison evaluates) leaves the diversity
    undefined (NaN): the run's row holds None, the algorithm's row leaves it out, and the summary is written."""
    import json
    import math

    from vgrpo_lib.benchmarks.compare import aggregate_seeds, summarise_run

    metrics = [{"reward_mean": 0.5, "train_seconds": 1.0, "train_cpu_s": 1.0, "nfe_cumulative": 10, "grad_steps": 1,
                "nfe_per_sample": 10, "iteration_s": 1.0, "rollout_s": 0.5, "reward_s": 0.1, "prepare_s": 0.1,
                "update_s": 0.3}]
    costs = {"train_seconds": 1.0, "train_cpu_s": 1.0, "nfe_cumulative": 10, "grad_steps": 1}
    evaluations = [{"iteration": 0, "reward_mean": 0.3, "diversity": math.nan},
                   {"iteration": 1, "reward_mean": 0.6, "diversity": math.nan, **costs}]
    runs = [summarise_run(metrics, evaluations, 0.4, 0.5) for _ in range(2)]
    assert runs[0]["diversity"] is None and runs[0]["final_eval_reward"] == 0.6
    row = aggregate_seeds(runs)
    assert "diversity" not in row and row["final_eval_reward"] == 0.6
    json.loads(json.dumps(row, allow_nan=False))
    # A defined diversity is kept as it was.
    evaluations[-1]["diversity"] = 0.25
    assert summarise_run(metrics, evaluations, 0.4, 0.5)["diversity"] == 0.25
