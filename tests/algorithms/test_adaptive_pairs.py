"""vgrpo.adaptive_pairs in the trainer: K follows the noise measured on measured iterations, the NFE counts what ran,
a resumed run continues with the same K, and bad settings are refused before anything is written."""

import pytest

from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.control import PairCountController
from vgrpo_lib.errors import UsageError

ADAPTIVE = "vgrpo.adaptive_pairs=share=0.3,max=12,every=2"


def test_k_follows_the_measured_noise_and_the_nfe_counts_the_measurement(tiny_config, tmp_path):
    """One step per rollout (no prepare pass): a measured iteration (0, 2, 4) costs K forwards without grad, the
    others none; each iteration's K is what the controller chose from the last measurement."""
    trainer = Trainer(tiny_config("vgrpo", ADAPTIVE, "iterations=5", "vgrpo.ref_kl_coef=none"), tmp_path / "run",
                      progress=False)
    replay = PairCountController(start=4, share=0.3, max_pairs=12, every=2)
    shares = []
    for _ in range(5):
        row = trainer.step()
        measured = replay.due()
        assert row["num_pairs"] == replay.num_pairs
        assert (row["nfe_prepare"], row["nfe_update"]) == (row["num_pairs"] if measured else 0, row["num_pairs"])
        if measured:  # K depends on the measurement only through noise / signal = share / (1 - share)
            shares.append(row["pair_noise_share"])
            replay.observe(shares[-1], 1 - shares[-1])
        else:
            assert row["pair_noise_share"] == shares[-1]  # the last measurement's, carried
    assert all(0 <= share <= 1 for share in shares)
    assert {row["num_pairs"] for row in trainer.metrics} != {4}  # the measurement moved K on this batch


def test_with_several_steps_the_measurement_is_free_and_k_reaches_the_loss(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("vgrpo", ADAPTIVE, "iterations=3", "optim.epochs=2", "vgrpo.ref_kl_coef=none"),
                      tmp_path / "run", progress=False)
    trainer.train()
    for row in trainer.metrics:
        assert (row["nfe_prepare"], row["nfe_update"]) == (row["num_pairs"], 2 * row["num_pairs"])
    assert trainer.algorithm.loss_module.estimator is trainer.algorithm.estimator


def test_a_run_without_it_keeps_its_metrics_and_k(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("vgrpo", "vgrpo.num_pairs=3"), tmp_path / "run", progress=False)
    trainer.train()
    assert "num_pairs" not in trainer.metrics[-1] and "pair_noise_share" not in trainer.metrics[-1]
    assert trainer.algorithm.estimator.num_pairs == 3 and "pair_control" not in trainer.algorithm.state_dict()


@pytest.mark.parametrize("smoothing", ["", ",smoothing=0.7"])
def test_a_resumed_run_continues_with_the_same_k(straight_and_resumed, smoothing):
    overrides = [ADAPTIVE.replace("every=2", "every=3") + smoothing, "iterations=5", "checkpoint_every=1"]
    straight, resumed = straight_and_resumed("vgrpo", overrides, until=2)
    keys = ("num_pairs", "pair_noise_share", "nfe_prepare", "reward_mean", "surrogate")
    assert [[r[k] for k in keys] for r in straight.metrics] == [[r[k] for k in keys] for r in resumed.metrics]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["vgrpo.adaptive_pairs=share=0.5"], r"vgrpo.adaptive_pairs needs share=S and max=K .* lacks max"),
        (["vgrpo.adaptive_pairs=share=1.5,max=8"], r"vgrpo.adaptive_pairs: share .* must be in \(0, 1\), got 1.5"),
        (["vgrpo.adaptive_pairs=share=0.5,max=2"], r"need 2 <= vgrpo.num_pairs \(the start, 4\) <= max \(2\)"),
        (["vgrpo.adaptive_pairs=share=0.5,max=9", "vgrpo.noise=antithetic"], r"max must be even with vgrpo.noise=antithetic"),
        (["vgrpo.adaptive_pairs=share=0.5,max=8,every=0"], r"vgrpo.adaptive_pairs: every must be >= 1"),
        (["vgrpo.adaptive_pairs=share=0.5,max=8,smoothing=1"], r"vgrpo.adaptive_pairs: smoothing .* must be in \[0, 1\)"),
        (["vgrpo.adaptive_pairs=share=0.5,max=8,often=1"], r"vgrpo.adaptive_pairs takes share=S,max=K .*got 'often=1'"),
        (["vgrpo.adaptive_pairs=share=half,max=8"], r"vgrpo.adaptive_pairs: share='half' does not parse"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(tiny_config, tmp_path, overrides, message):
    with pytest.raises(UsageError, match=message):
        Trainer(tiny_config("vgrpo", *overrides), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
