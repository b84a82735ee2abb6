"""rollout.overlap_rewards: each rollout micro-batch is scored in the background while the next rolls out, with the
rewards (and so the whole run) of scoring the same micro-batches one after another, and the same errors. The
overlap is shown by events (a reward call and the next micro-batch's rollout each wait for the other to have
started), never by timing; and a run trains through a real `vgrpo reward-server` process."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait

import pytest
import torch

from vgrpo_lib.algorithms import rollout_batches
from vgrpo_lib.algorithms.scoring import RewardError
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.rewards import get_reward
from vgrpo_lib.integrations.rewards.remote import remote_reward
from vgrpo_lib.integrations.testbed import get_task
from tests.test_reward_server import zoo_server  # noqa: F401 (the fixture: a served JPEG reward)

MICRO_BATCHES = ["iterations=1", "rollout.micro_batch_size=4"]  # 16 samples: 4 micro-batches
HANDSHAKE_S = 120  # a wait that only an overlap that does not happen would exhaust (then the test fails)


def trained(trainer: Trainer) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The metrics rows (without times) and the weights after training."""
    trainer.train()
    rows = [{k: v for k, v in row.items() if not k.endswith(("_s", "seconds"))} for row in trainer.metrics]
    return rows, {k: v.clone() for k, v in trainer.policy.state_dict().items()}


def record_events(trainer: Trainer, handshake: bool) -> tuple[list[tuple[str, int]], list[bool]]:
    """Record when each micro-batch's rollout and reward call start and end. With ``handshake``, reward call k and
    the rollout of micro-batch k + 1 each wait until the other has started: both finish only if they overlap."""
    events, waits, lock = [], [], threading.Lock()
    started = {"rollout": [threading.Event() for _ in range(8)], "reward": [threading.Event() for _ in range(8)]}
    rollout, reward = trainer.algorithm.rollout, trainer.reward_fn

    def log(what: str, index: int) -> None:
        with lock:
            events.append((what, index))

    def recorded(kind: str, index: int, other: str, other_index: int, run):
        started[kind][index].set()
        log(f"{kind} start", index)
        if handshake and other_index >= 0:
            waits.append(started[other][other_index].wait(HANDSHAKE_S))
        result = run()
        log(f"{kind} end", index)
        return result

    def recorded_rollout(cond, group, generator, iteration):
        index = sum(1 for what, _ in events if what == "rollout start")
        return recorded("rollout", index, "reward", index - 1, lambda: rollout(cond, group, generator, iteration))

    def recorded_reward(images, prompts):
        index = sum(1 for what, _ in events if what == "reward start")
        last = index + 1 == 4
        return recorded("reward", index, "rollout", -1 if last else index + 1, lambda: reward(images, prompts))

    trainer.algorithm.rollout, trainer.reward_fn = recorded_rollout, recorded_reward
    return events, waits


def test_overlapped_rewards_overlap_the_next_rollout_and_change_nothing(tiny_config, tmp_path):
    sequential = Trainer(tiny_config("vgrpo", *MICRO_BATCHES), tmp_path / "sequential", progress=False)
    events, _ = record_events(sequential, handshake=False)
    sequential_rows, sequential_weights = trained(sequential)
    assert [what for what, _ in events] == ["rollout start", "rollout end"] * 4 + ["reward start", "reward end"] * 4

    overlapped = Trainer(tiny_config("vgrpo", *MICRO_BATCHES, "rollout.overlap_rewards=true"), tmp_path / "overlapped",
                         progress=False)
    events, waits = record_events(overlapped, handshake=True)
    overlapped_rows, overlapped_weights = trained(overlapped)
    # Reward call k ran while micro-batch k + 1 rolled out: each waited for the other to start, and got it.
    assert waits == [True] * 6
    for k in range(3):
        assert events.index(("reward start", k)) < events.index(("rollout end", k + 1))
        assert events.index(("rollout start", k + 1)) < events.index(("reward end", k))
    assert [index for what, index in events if what == "reward start"] == [0, 1, 2, 3]  # in order
    assert overlapped_rows == sequential_rows
    for key, value in sequential_weights.items():
        assert torch.equal(overlapped_weights[key], value), key


@pytest.mark.parametrize("overlap", [False, True])
def test_a_failing_reward_is_the_same_error_either_way(overlap, tiny_config, tmp_path):
    config = tiny_config("vgrpo", *MICRO_BATCHES, f"rollout.overlap_rewards={overlap}", "reward_retries=1")
    trainer = Trainer(config, tmp_path / "run", progress=False)
    reward, calls = trainer.reward_fn, []

    def breaks_on_the_third(images, prompts):
        calls.append(images.shape[0])
        if len(calls) >= 3:
            raise RuntimeError("reward model crashed")
        return reward(images, prompts)

    trainer.reward_fn = breaks_on_the_third
    with pytest.raises(RewardError, match=r"^The reward function raised on 2 attempt\(s\) at iteration 0: "
                                          r"RuntimeError: reward model crashed$"), pytest.warns(UserWarning, match="retrying"):
        trainer.train()
    assert calls == [4, 4, 4, 4]  # micro-batches 0, 1, then 2 and its one retry; micro-batch 3 never scored


def test_an_overlapped_reward_failure_stops_the_rollout_at_the_next_micro_batch(tiny_config, tmp_path, monkeypatch):
    """Iteration 1's reward of micro-batch 0 fails, and has ended before micro-batch 1's rollout does (an event, not a
    time): the rollout stops at that boundary, 2 of its 4 micro-batches rolled out, with the error of the sequential
    path naming the reward; nothing of iteration 1 is written and the run resumes to the uninterrupted run's weights."""
    submitted = []

    class RecordingPool(ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            submitted.append(super().submit(*args, **kwargs))
            return submitted[-1]

    monkeypatch.setattr(rollout_batches, "ThreadPoolExecutor", RecordingPool)
    config = tiny_config("vgrpo", *MICRO_BATCHES[1:], "iterations=2", "rollout.overlap_rewards=true",
                         "reward_retries=0")
    trainer = Trainer(config, tmp_path / "run", progress=False)
    rollout, reward, rollouts = trainer.algorithm.rollout, trainer.reward_fn, []

    def counted_rollout(cond, group, generator, iteration):
        index = sum(1 for done in rollouts if done == iteration)
        if iteration == 1 and index > 0:  # the previous micro-batch's reward call has ended first
            assert wait(submitted[-1:], timeout=HANDSHAKE_S).not_done == set()
        rollouts.append(iteration)
        return rollout(cond, group, generator, iteration)

    def breaks_in_iteration_one(images, prompts):
        if trainer.iteration == 1:
            raise RuntimeError("reward 'jpeg_server' went away")
        return reward(images, prompts)

    trainer.algorithm.rollout, trainer.reward_fn = counted_rollout, breaks_in_iteration_one
    with pytest.raises(RewardError, match=r"^The reward function raised on 1 attempt\(s\) at iteration 1: "
                                          r"RuntimeError: reward 'jpeg_server' went away$"):
        trainer.train()
    assert rollouts == [0, 0, 0, 0, 1, 1]  # stopped before micro-batches 2 and 3 of iteration 1
    assert not any(thread.name.startswith("micro-batch-reward") for thread in threading.enumerate())
    assert [row["iteration"] for row in trainer.run.read_rows("metrics.csv")] == [0]

    resumed = Trainer.resume(tmp_path / "run", progress=False)
    resumed.train()
    straight = Trainer(config, tmp_path / "straight", progress=False)
    straight.train()
    assert [row["iteration"] for row in resumed.metrics] == [0, 1]
    for key, value in straight.policy.state_dict().items():
        assert torch.equal(resumed.policy.state_dict()[key], value), key


def test_overlap_without_micro_batches_is_refused(tiny_config):
    with pytest.raises(ValueError, match="rollout.overlap_rewards scores a rollout micro-batch while the next rolls "
                                         "out, and rollout.micro_batch_size=none"):
        tiny_config("vgrpo", "rollout.overlap_rewards=true")


class ServedRewardTask:
    """The digits8 testbed task scored by the zoo's JPEG compressibility, in process or served at ``url``: its
    one-channel images as three, its digit prompts as text (what a served reward reads)."""

    def __init__(self, url: str | None = None):
        self.base = get_task("digits8")
        self.score = get_reward("jpeg_compressibility") if url is None else remote_reward(url)

    def __getattr__(self, name):
        return getattr(self.base, name)

    def reward(self):
        return lambda images, prompts: self.score(images.expand(-1, 3, -1, -1), [f"digit {int(p)}" for p in prompts])


def test_a_run_through_a_reward_server_overlaps_and_equals_the_in_process_run(zoo_server, tiny_config, tmp_path):
    """uint8 on the wire is what JPEG compressibility quantises to anyway: the served scores are the in-process ones,
    so the runs match exactly."""
    runs = {}
    for name, url, overlap in [("local", None, False), ("served", zoo_server.url, False),
                               ("served_overlapped", zoo_server.url, True)]:
        config = tiny_config("vgrpo", "iterations=2", "rollout.micro_batch_size=4", f"rollout.overlap_rewards={overlap}")
        runs[name] = trained(Trainer(config, tmp_path / name, task=ServedRewardTask(url), progress=False))
    (local_rows, local_weights) = runs["local"]
    for name in ("served", "served_overlapped"):
        rows, weights = runs[name]
        assert rows == local_rows, name
        for key, value in local_weights.items():
            assert torch.equal(weights[key], value), (name, key)
