"""The micro-batch autotuner (rollout.micro_batch_size=auto, optim.micro_batch_size=auto).

Nothing runs out of memory on a CPU, so the phases are made to: a fake rollout / loss raises torch.OutOfMemoryError
above a row count, after doing its work (so a failed attempt has drawn from the generator, as a real one would).
"""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from vgrpo_lib.algorithms.autotune import MicroBatchSizes, fit_micro_batch
from vgrpo_lib.algorithms.errors import UsageError
from vgrpo_lib.algorithms.strategy import check_split
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.distributed import Shard


def out_of_memory_above(limit: int):
    """An attempt that fits up to ``limit`` rows, and the sizes it was tried at."""
    tried = []

    def attempt(size: int) -> str:
        tried.append(size)
        if size > limit:
            raise torch.OutOfMemoryError(f"{size} rows")
        return f"ran {size}"

    return attempt, tried


def test_the_search_halves_until_the_size_fits_and_rewinds_each_failure():
    attempt, tried = out_of_memory_above(5)
    rewinds = []
    assert fit_micro_batch(attempt, 64, rewind=lambda: rewinds.append(tried[-1]), what="x") == ("ran 4", 4)
    assert tried == [64, 32, 16, 8, 4]
    assert rewinds == [64, 32, 16, 8]  # each failed attempt undone before the next, none after the success


def test_the_search_gives_up_at_one_row_naming_the_phase_and_lets_other_errors_through():
    attempt, tried = out_of_memory_above(0)
    with pytest.raises(torch.OutOfMemoryError, match="The update .* even at a micro-batch of 1 row: 1 rows"):
        fit_micro_batch(attempt, 3, rewind=lambda: None, what="The update (optim.micro_batch_size=auto)")
    assert tried == [3, 1]

    def broken(size):
        raise RuntimeError("not memory")

    with pytest.raises(RuntimeError, match="not memory"):
        fit_micro_batch(broken, 8, rewind=pytest.fail, what="x")
    with pytest.raises(ValueError, match="size must be an int >= 1, got 0"):
        fit_micro_batch(broken, 0, rewind=lambda: None, what="x")


def test_sizes_are_searched_once_recorded_and_restored():
    sizes = MicroBatchSizes(rollout=4, update="auto")
    attempt, tried = out_of_memory_above(6)
    assert sizes.run("rollout", 16, attempt, lambda: None) == "ran 4"  # a fixed size is not searched
    assert sizes.run("rollout", 3, attempt, lambda: None) == "ran 3"  # ... and never exceeds the rows
    assert sizes.run("update", 24, attempt, lambda: None) == "ran 6"
    assert tried == [4, 3, 24, 12, 6]
    assert sizes.run("update", 5, attempt, lambda: None) == "ran 5"  # a short batch fits whole: the record stays
    assert sizes.run("update", 24, attempt, lambda: None) == "ran 6"  # the next starts from the record
    assert tried[-2:] == [5, 6]
    assert sizes.metrics() == {"micro_batch_update": 6} and sizes.state_dict() == {"rollout": None, "update": 6}
    resumed = MicroBatchSizes(rollout=4, update="auto")
    resumed.load_state_dict(sizes.state_dict())
    attempt, tried = out_of_memory_above(100)
    resumed.run("update", 24, attempt, lambda: None)
    assert tried == [6]  # a resumed run uses the recorded size, even where a larger one would fit now
    with pytest.raises(ValueError, match="update must be >= 1, or auto"):
        MicroBatchSizes(rollout=None, update=0)


def fake_out_of_memory(trainer: Trainer, rollout_limit: int, update_limit: int,
                       prepare_limit: int | None = None) -> dict[str, list[int]]:
    """Make ``trainer``'s rollout, loss (and the prepare's forward, with ``prepare_limit``) raise
    torch.OutOfMemoryError above these row counts (after running); returns the row counts they were called with."""
    calls = {"rollout": [], "update": [], "prepare": []}
    rollout, loss, prepare_forward = trainer.algorithm.rollout, trainer.algorithm.loss, trainer.algorithm.prepare_forward

    def limited_prepare_forward(rows):
        calls["prepare"].append(rows.shape[0])
        entries = prepare_forward(rows)
        if prepare_limit is not None and rows.shape[0] > prepare_limit:
            raise torch.OutOfMemoryError(f"prepare of {rows.shape[0]}")
        return entries

    def limited_rollout(cond, group, generator, iteration):
        calls["rollout"].append(group.shape[0])
        batch = rollout(cond, group, generator, iteration)
        if group.shape[0] > rollout_limit:
            raise torch.OutOfMemoryError(f"rollout of {group.shape[0]}")
        return batch

    def limited_loss(minibatch, generator):
        calls["update"].append(minibatch.shape[0])
        losses = loss(minibatch, generator)
        if minibatch.shape[0] > update_limit:
            raise torch.OutOfMemoryError(f"loss of {minibatch.shape[0]}")
        return losses

    trainer.algorithm.rollout, trainer.algorithm.loss = limited_rollout, limited_loss
    trainer.algorithm.prepare_forward = limited_prepare_forward
    return calls


def trained(trainer: Trainer) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The metrics rows (without times and the autotuner's columns) and the weights after training."""
    trainer.train()
    rows = [{k: v for k, v in row.items() if not (k.endswith(("_s", "seconds")) or k.startswith("micro_batch_"))}
            for row in trainer.metrics]
    return rows, {k: v.clone() for k, v in trainer.policy.state_dict().items()}


# AWM draws fresh pairs from the trainer's generator in every loss: a failed attempt must give its draws back.
AUTO = ["rollout.micro_batch_size=auto", "optim.micro_batch_size=auto"]


def test_a_tuned_run_equals_the_run_with_the_found_sizes_set_by_hand(tiny_config, tmp_path):
    auto = Trainer(tiny_config("awm", *AUTO), tmp_path / "auto", progress=False)
    calls = fake_out_of_memory(auto, rollout_limit=5, update_limit=3)
    auto_rows, auto_weights = trained(auto)
    # 16 samples: 16 and 8 run out of memory, 4 fits (four micro-batches of 4) and is kept for iteration 1.
    assert calls["rollout"] == [16, 8] + [4] * 4 + [4] * 4
    assert calls["update"][:4] == [16, 8, 4, 2]
    assert [(row["micro_batch_rollout"], row["micro_batch_update"]) for row in auto.metrics] == [(4, 2), (4, 2)]

    by_hand = Trainer(tiny_config("awm", "rollout.micro_batch_size=4", "optim.micro_batch_size=2"), tmp_path / "hand",
                      progress=False)
    calls = fake_out_of_memory(by_hand, rollout_limit=5, update_limit=3)
    hand_rows, hand_weights = trained(by_hand)
    assert max(calls["rollout"]) == 4 and max(calls["update"]) == 2  # nothing ran out of memory
    assert auto_rows == hand_rows
    for key, value in hand_weights.items():
        assert torch.equal(auto_weights[key], value), key


def test_a_resumed_run_reuses_the_recorded_sizes(tiny_config, tmp_path):
    whole = Trainer(tiny_config("awm", *AUTO), tmp_path / "whole", progress=False)
    fake_out_of_memory(whole, rollout_limit=5, update_limit=3)
    whole_rows, whole_weights = trained(whole)

    first = Trainer(tiny_config("awm", *AUTO), tmp_path / "cut", progress=False)
    fake_out_of_memory(first, rollout_limit=5, update_limit=3)
    first.train(until=1)
    resumed = Trainer.resume(tmp_path / "cut", progress=False)
    calls = fake_out_of_memory(resumed, rollout_limit=100, update_limit=100)  # everything would fit now
    resumed_rows, resumed_weights = trained(resumed)
    assert max(calls["rollout"]) == 4 and max(calls["update"]) == 2  # no new search: the checkpoint's sizes
    assert resumed.metrics[-1]["micro_batch_rollout"] == 4 and resumed.metrics[-1]["micro_batch_update"] == 2
    assert resumed_rows == whole_rows
    for key, value in whole_weights.items():
        assert torch.equal(resumed_weights[key], value), key


# V-GRPO with two epochs: the prepare computes the old surrogates (K forwards per sample without gradient).
PREPARED = ["optim.epochs=2"]


def test_the_prepare_searches_before_the_update_then_runs_at_the_update_size(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("vgrpo", *PREPARED, "optim.micro_batch_size=auto"), tmp_path / "run", progress=False)
    calls = fake_out_of_memory(trainer, rollout_limit=100, update_limit=3, prepare_limit=8)
    trainer.train(until=1)
    # Iteration 0: the prepare runs first (16 rows: 16 out of memory, 8 fits), and the update's search starts there.
    assert calls["prepare"] == [16, 8, 8]
    assert calls["update"][:3] == [8, 4, 2] and set(calls["update"][3:]) == {2}
    assert trainer.metrics[0]["micro_batch_update"] == 2 and trainer.micro_batches.state_dict()["update"] == 2
    calls["prepare"].clear()
    trainer.train()
    assert calls["prepare"] == [2] * 8  # iteration 1: at the update's size, no search

    resumed = Trainer.resume(tmp_path / "run", progress=False)  # a checkpoint at 1 holds the size
    assert resumed.micro_batches.state_dict()["update"] == 2


def test_the_prepare_runs_at_a_set_update_size_and_skips_without_forwards(tiny_config, tmp_path):
    fixed = Trainer(tiny_config("vgrpo", *PREPARED, "optim.micro_batch_size=4", "iterations=1"), tmp_path / "fixed",
                    progress=False)
    calls = fake_out_of_memory(fixed, rollout_limit=100, update_limit=100)
    fixed.train()
    assert calls["prepare"] == [4] * 4
    whole = Trainer(tiny_config("vgrpo", *PREPARED, "iterations=1"), tmp_path / "whole", progress=False)
    calls = fake_out_of_memory(whole, rollout_limit=100, update_limit=100)
    whole.train()
    assert calls["prepare"] == [16]  # optim.micro_batch_size=none: the whole rollout, as the update its minibatch
    single_step = Trainer(tiny_config("vgrpo", "optim.micro_batch_size=auto", "iterations=1"), tmp_path / "single",
                          progress=False)
    calls = fake_out_of_memory(single_step, rollout_limit=100, update_limit=3)
    single_step.train()
    assert calls["prepare"] == [] and calls["update"][0] == 16  # no prepare forwards: the update searches alone


def test_the_prepare_runs_out_of_memory_at_one_row_by_name(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("vgrpo", *PREPARED, "optim.micro_batch_size=auto"), tmp_path / "run", progress=False)
    fake_out_of_memory(trainer, rollout_limit=100, update_limit=100, prepare_limit=0)
    with pytest.raises(torch.OutOfMemoryError, match=r"^The prepare \(optim.micro_batch_size=auto\) runs out of "
                                                     r"memory even at a micro-batch of 1 row"):
        trainer.train()


def test_a_tuned_prepare_equals_the_run_with_the_found_size_set_by_hand(tiny_config, tmp_path):
    """Where the prepare's search ends at the update's size, the tuned run is the run with that size set by hand,
    bit for bit (the failed attempts of both phases undone)."""
    auto = Trainer(tiny_config("vgrpo", *PREPARED, *AUTO), tmp_path / "auto", progress=False)
    calls = fake_out_of_memory(auto, rollout_limit=5, update_limit=4, prepare_limit=4)
    auto_rows, auto_weights = trained(auto)
    assert calls["prepare"] == [16, 8] + [4] * 4 + [4] * 4
    by_hand = Trainer(tiny_config("vgrpo", *PREPARED, "rollout.micro_batch_size=4", "optim.micro_batch_size=4"),
                      tmp_path / "hand", progress=False)
    fake_out_of_memory(by_hand, rollout_limit=5, update_limit=4, prepare_limit=4)
    hand_rows, hand_weights = trained(by_hand)
    assert auto_rows == hand_rows
    for key, value in hand_weights.items():
        assert torch.equal(auto_weights[key], value), key


def test_the_prepare_forward_is_the_update_forward_without_gradient(tiny_config, tmp_path):
    """Why the update's size fits the prepare (vgrpo_lib.algorithms.autotune): at the same micro-batch the prepare
    evaluates the update's model on inputs of the same shapes, with gradient off (nothing kept for a backward)."""
    trainer = Trainer(tiny_config("vgrpo", *PREPARED, "optim.micro_batch_size=4", "iterations=1"), tmp_path / "run",
                      progress=False)
    seen, phase = {"prepare": [], "update": []}, []
    trainer.policy.register_forward_pre_hook(
        lambda module, args: seen[phase[-1]].append((tuple(args[0].shape), torch.is_grad_enabled())) if phase else None)
    prepare_forward, loss = trainer.algorithm.prepare_forward, trainer.algorithm.loss

    def in_phase(name, run):
        def wrapped(*args):
            phase.append(name)
            try:
                return run(*args)
            finally:
                phase.pop()
        return wrapped

    trainer.algorithm.prepare_forward = in_phase("prepare", prepare_forward)
    trainer.algorithm.loss = in_phase("update", loss)
    trainer.train()
    k = trainer.config.vgrpo.num_pairs
    assert seen["prepare"] and {grad for _, grad in seen["prepare"]} == {False}
    assert {grad for _, grad in seen["update"]} == {True}
    assert {shape for shape, _ in seen["prepare"]} == {shape for shape, _ in seen["update"]}
    assert {shape[0] for shape, _ in seen["prepare"]} == {4 * k}


def test_a_failed_update_attempt_leaves_no_gradient_behind(tiny_config, tmp_path):
    # Micro-batches of 8 backpropagate the first half, then run out of memory on the second: its gradient must be
    # dropped, so that the step is the one of micro-batches of 4 from the start.
    def gradient(trainer: Trainer) -> torch.Tensor:
        weight = next(trainer.policy.parameters())
        trainer.optimizer.zero_grad(set_to_none=True)
        seen = []

        def loss(micro, generator):
            seen.append(micro.shape[0])
            if micro.shape[0] == 8 and len(seen) == 2:
                raise torch.OutOfMemoryError("second micro-batch of 8")
            value = (weight.sum() * micro["x"].sum() + torch.rand((), generator=generator))
            return TensorDict({"loss_objective": value}, [])

        trainer.algorithm.loss = loss
        trainer._accumulate_gradients(TensorDict({"x": torch.arange(16.0)}, [16]))
        return weight.grad.clone()

    tuned = Trainer(tiny_config("vgrpo", "optim.micro_batch_size=8"), tmp_path / "a", progress=False)
    tuned.micro_batches.settings["update"] = "auto"
    tuned.micro_batches.tuned["update"] = 8
    fixed = Trainer(tiny_config("vgrpo", "optim.micro_batch_size=4"), tmp_path / "b", progress=False)
    assert torch.equal(gradient(tuned), gradient(fixed))
    assert tuned.micro_batches.tuned["update"] == 4


def test_auto_with_several_processes_is_refused(tiny_config):
    config = tiny_config("vgrpo", "optim.micro_batch_size=auto")
    with pytest.raises(UsageError, match=r"optim.micro_batch_size=auto searches in one process; with 2 processes"):
        check_split(config, Shard(rank=0, world_size=2))
    check_split(config, Shard())
