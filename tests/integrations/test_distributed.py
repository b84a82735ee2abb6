"""Multi-process training on CPU: 2 gloo ranks (real spawned processes) against 1 process on the same global batch.

The 2-rank runs (DDP, and FSDP2 with sharded reference / old policies and full-state-dict checkpoints) must make
the 1-process run's weight changes up to float32 summation order (each rank averages its own rows, then DDP / FSDP2
average the ranks), under SGD with momentum in AdamW's place (tests/same_steps.py says why), and log the same
metrics rows. Every spawn
has a hard timeout. Until the shipped ``digits8_policy`` checkpoint exists, the runs use a small seeded
``VelocityMLP`` (with a random, not zero, output layer so that rewards and gradients are not trivial).
"""

from __future__ import annotations

import math
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations import distributed
from vgrpo_lib.integrations.distributed import Shard, shard_groups
from tests.same_steps import assert_same_changes, train_with_sgd

# The spawn and each collective: generous, as on a loaded 2-core machine (CI, other jobs) the ~60 s of work took
# 20 minutes, and rank 0 alone writes files (fsyncs, plots) while the other ranks wait at the next collective.
TIMEOUT_S = 1500
METRICS_RTOL, METRICS_ATOL = 1e-4, 1e-6
TINY = [
    "task=digits8", "iterations=2", "prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4",
    "eval.per_prompt=2", "eval.num_steps=4", "eval.every=0",
]
RUNS = {  # name -> (algo, overrides); all full-batch except "vgrpo_minibatch"
    "vgrpo": ("vgrpo", []),
    "vgrpo_epochs2_batch_pairs": ("vgrpo", ["optim.epochs=2", "vgrpo.sharing=batch", "advantage.scale=batch"]),
    "diffusion_nft": ("diffusion_nft", []),
    "flow_grpo": ("flow_grpo", ["optim.minibatch_size=null"]),
    "vgrpo_minibatch": ("vgrpo", ["optim.minibatch_size=8", "optim.epochs=2"]),
    "vgrpo_fsdp2": ("vgrpo", ["distributed.strategy=fsdp2"]),
    # A sharded reference policy, and micro-batches (gradient sync on the last one only).
    "vgrpo_fsdp2_ref_kl_micro": ("vgrpo", ["distributed.strategy=fsdp2", "vgrpo.ref_kl_coef=1.0",
                                           "optim.micro_batch_size=4"]),
    "diffusion_nft_fsdp2": ("diffusion_nft", ["distributed.strategy=fsdp2"]),  # a sharded old policy
}
EQUAL_TO_ONE_PROCESS = ("vgrpo", "vgrpo_epochs2_batch_pairs", "diffusion_nft", "vgrpo_fsdp2", "vgrpo_fsdp2_ref_kl_micro",
                        "diffusion_nft_fsdp2")
FSDP2_RUNS = tuple(name for name, (_, overrides) in RUNS.items() if "distributed.strategy=fsdp2" in overrides)
def _config(name: str):
    algo, overrides = RUNS[name]
    return build_config(algo, None, "testbed", TINY + overrides)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, world_size: int, port: int) -> None:
    torch.set_num_threads(1)  # 2 ranks on 2 shared cores
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
        timeout=timedelta(seconds=TIMEOUT_S),
    )


def _spawn(worker, *args, world_size: int = 2) -> None:
    """Run ``worker(rank, world_size, port, *args)`` in ``world_size`` fresh processes; fail after TIMEOUT_S."""
    context = mp.start_processes(
        worker, args=(world_size, _free_port(), *args), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{world_size} ranks did not finish within {TIMEOUT_S} s")


# -- helpers on their own ------------------------------------------------------------------------------


def test_shard_groups_blocks_of_whole_prompts():
    assert [shard_groups(8, 2, r) for r in range(2)] == [slice(0, 4), slice(4, 8)]
    assert shard_groups(6, 1, 0) == slice(0, 6)
    covered = torch.cat([torch.arange(12)[shard_groups(12, 3, r)] for r in range(3)])
    assert torch.equal(covered, torch.arange(12))


@pytest.mark.parametrize(
    "args, message",
    [((6, 4, 0), "not divisible by the number of processes"), ((4, 0, 0), "world_size >= 1"), ((4, 2, 2), "rank < world_size")],
)
def test_shard_groups_errors(args, message):
    with pytest.raises(ValueError, match=message):
        shard_groups(*args)


def test_shard_draws_are_blocks_of_the_global_draw():
    local = [Shard(r, 2).randn((3, 2), torch.Generator().manual_seed(5)) for r in range(2)]
    assert torch.equal(torch.cat(local), torch.randn((6, 2), generator=torch.Generator().manual_seed(5)))
    x = torch.randn(3, 4)
    assert Shard(1, 2).global_like(x).shape == (6, 4) and Shard().global_like(x) is x
    assert torch.equal(Shard(1, 3).local(torch.arange(6)), torch.tensor([2, 3]))
    g = torch.Generator().manual_seed(0)
    assert Shard().independent_generator(g) is g
    streams = [Shard(r, 2).independent_generator(torch.Generator().manual_seed(0)) for r in range(2)]
    assert not torch.equal(torch.randn(4, generator=streams[0]), torch.randn(4, generator=streams[1]))


def test_single_process_defaults(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    model = nn.Linear(2, 2)
    assert distributed.wrap_model(model) is model and distributed.unwrap(model) is model
    x = torch.arange(3.0)
    assert distributed.all_gather_tensor(x) is x and distributed.all_reduce_metrics(x, ["a", "b", "c"]) is x
    with distributed.init_from_env() as shard:  # no WORLD_SIZE: a no-op
        assert shard == Shard() and not dist.is_initialized()


def test_trainer_refuses_indivisible_prompt_count(monkeypatch, tmp_path):
    monkeypatch.setattr(Shard, "current", classmethod(lambda cls: cls(0, 3)))
    with pytest.raises(ValueError, match="prompts_per_iteration=4 is not divisible by the number of processes"):
        Trainer(_config("vgrpo"), tmp_path / "run", progress=False)


def _helpers_worker(rank: int, world_size: int, port: int) -> None:
    _join(rank, world_size, port)
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (rank, 2, rank == 0)
    with distributed.init_from_env() as shard:  # an existing group is used as is
        assert shard == Shard(rank, 2)
    mine = torch.full((2, 3), float(rank))
    assert torch.equal(distributed.all_gather_tensor(mine), torch.cat([torch.zeros(2, 3), torch.ones(2, 3)]))
    logged = distributed.all_reduce_metrics(torch.tensor([rank, rank, rank]) + 1.0, ["loss", "ratio_min", "ratio_max"])
    assert torch.equal(logged, torch.tensor([1.5, 1.0, 2.0]))
    assert torch.equal(distributed.broadcast_(torch.tensor([rank + 7.0])), torch.tensor([7.0]))

    # DDP and FSDP2 backward = the full model's gradient averaged over ranks.
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 4))
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(rank))
    base(x).square().mean().backward()
    reference = [p.grad for p in base.parameters()]
    for grad in reference:
        dist.all_reduce(grad)
        grad /= world_size
    for strategy in distributed.STRATEGIES:
        model = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 4))
        model.load_state_dict(base.state_dict())
        wrapped = distributed.wrap_model(model, strategy)
        wrapped(x).square().mean().backward()
        for p, g in zip(distributed.unwrap(wrapped).parameters(), reference):
            grad = p.grad.full_tensor() if strategy == "fsdp2" else p.grad
            torch.testing.assert_close(grad, g, rtol=1e-6, atol=1e-7)
    del model, wrapped
    distributed.shutdown()


def test_collectives_ddp_and_fsdp2_on_two_gloo_ranks():
    _spawn(_helpers_worker)


# -- the trainer: 2 ranks vs 1 process ---------------------------------------------------------------------


def _full_weights(model: nn.Module) -> dict:
    """Plain full tensors on every rank (FSDP2 parameters are DTensor shards)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not distributed.is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def _trainer_worker(rank: int, world_size: int, port: int, out: str) -> None:
    _join(rank, world_size, port)
    train_with_sgd()
    for name in RUNS:
        trainer = Trainer(_config(name), Path(out) / name, progress=False)
        evaluations = trainer.train()
        if name in FSDP2_RUNS:
            assert distributed.is_sharded(trainer.policy), "the trained policy is sharded"
        result = {"policy": _full_weights(trainer.policy), "metrics": trainer.metrics, "evaluations": evaluations}
        torch.save(result, Path(out) / f"{name}_rank{rank}.pt")
        del trainer  # its DDP wrapper must go before the process group (see distributed.shutdown)
    # FSDP2 cut after one iteration and resumed from its full-state-dict checkpoint (optimizer and old policy too).
    # Rank 0 writes that checkpoint 3 s late: rank 1, done first, must not look for it before it is complete.
    real_save = RunDir.save_checkpoint

    def late_save(self, *args, **kwargs):
        time.sleep(3.0)
        return real_save(self, *args, **kwargs)

    RunDir.save_checkpoint = late_save
    Trainer(_config("diffusion_nft_fsdp2"), Path(out) / "fsdp2_cut", progress=False).train(until=1)
    RunDir.save_checkpoint = real_save
    resumed = Trainer.resume(Path(out) / "fsdp2_cut", progress=False)
    resumed.train()
    torch.save({"policy": _full_weights(resumed.policy), "metrics": resumed.metrics}, Path(out) / f"fsdp2_resumed_rank{rank}.pt")
    del resumed
    try:
        Trainer(build_config("vgrpo", None, "testbed", TINY + ["prompts_per_iteration=3"]), Path(out) / "odd")
    except ValueError as error:
        torch.save(str(error), Path(out) / f"odd_rank{rank}.pt")
    distributed.shutdown()


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    _spawn(_trainer_worker, str(out))
    return out


def _load(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def _comparable(row: dict) -> dict:
    """A metrics row without wall-clock times and ``ess`` (combined over processes as a mean of per-process
    values, documented as approximate in ``all_reduce_metrics``)."""
    return {k: v for k, v in row.items() if not k.endswith("_s") and k not in ("train_seconds", "ess")}


@pytest.mark.slow
@pytest.mark.parametrize("name", EQUAL_TO_ONE_PROCESS)
def test_two_ranks_equal_one_process(name, two_rank_runs, tmp_path, monkeypatch):
    train_with_sgd(monkeypatch)
    single = Trainer(_config(name), tmp_path / "run", progress=False)
    single.train()
    ranks = [_load(two_rank_runs / f"{name}_rank{r}.pt") for r in range(2)]
    base = single.task.load_policy().state_dict()
    for rank in ranks:
        assert_same_changes(rank["policy"], single.policy.state_dict(), base)
    for rank in ranks:
        assert len(rank["metrics"]) == len(single.metrics) == 2
        for got, expected in zip(rank["metrics"], single.metrics):
            got, expected = _comparable(got), _comparable(expected)
            assert got.keys() == expected.keys()
            for key in expected:
                close = math.isclose(got[key], expected[key], rel_tol=METRICS_RTOL, abs_tol=METRICS_ATOL)
                assert close, (key, got[key], expected[key])


def test_fsdp2_resume_from_full_state_dict_checkpoint_is_exact(two_rank_runs):
    straight = _load(two_rank_runs / "diffusion_nft_fsdp2_rank0.pt")
    checkpoint = _load(two_rank_runs / "diffusion_nft_fsdp2" / "checkpoints" / "iter_000002.pt")
    for key, value in straight["policy"].items():  # the checkpoint holds plain full tensors, not shards
        assert type(checkpoint["policy"][key]) is torch.Tensor and torch.equal(checkpoint["policy"][key], value), key
    assert set(checkpoint["algorithm"]["old_policy"]) == set(straight["policy"])
    for rank in range(2):
        resumed = _load(two_rank_runs / f"fsdp2_resumed_rank{rank}.pt")
        for key, value in straight["policy"].items():
            assert torch.equal(resumed["policy"][key], value), key
        assert [_comparable(r) for r in resumed["metrics"]] == [_comparable(r) for r in straight["metrics"]]


@pytest.mark.parametrize("name", ["flow_grpo", "vgrpo_minibatch"])
def test_two_ranks_stay_in_sync_where_not_bitwise(name, two_rank_runs):
    """Flow-GRPO (per-rank SDE noise) and local minibatches: not a 1-process run, but one model on all ranks."""
    ranks = [_load(two_rank_runs / f"{name}_rank{r}.pt") for r in range(2)]
    for key, value in ranks[0]["policy"].items():
        assert torch.equal(value, ranks[1]["policy"][key]), key
    assert len(ranks[0]["metrics"]) == 2 and all(math.isfinite(v) for row in ranks[0]["metrics"] for v in row.values())
    assert [_comparable(r) for r in ranks[0]["metrics"]] == [_comparable(r) for r in ranks[1]["metrics"]]


def test_only_rank_zero_evaluates_and_writes(two_rank_runs):
    for name in RUNS:
        main, other = (_load(two_rank_runs / f"{name}_rank{r}.pt") for r in range(2))
        assert len(main["evaluations"]) == 2 and other["evaluations"] == []
        run = two_rank_runs / name
        assert {"config.json", "metrics.csv", "eval.jsonl", "reward.png"} <= {p.name for p in run.iterdir()}
        assert len(run.joinpath("metrics.csv").read_text().splitlines()) == 3  # header + one row per iteration
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000002.json", "iter_000002.pt"]
    assert not (two_rank_runs / "odd").exists()


def test_indivisible_prompt_count_is_refused_on_every_rank(two_rank_runs):
    for rank in range(2):
        assert "prompts_per_iteration=3 is not divisible by the number of processes (2)" in _load(
            two_rank_runs / f"odd_rank{rank}.pt"
        )
