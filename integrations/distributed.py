"""Multi-process training with ``torch.distributed``: the few helpers the trainer needs.

Launch a run on N processes (one per GPU, or N CPU processes with gloo) with torchrun::

    torchrun --nproc_per_node 2 -m vgrpo_lib.algorithms.cli train --algo vgrpo --task digits8 --out runs/ddp2
    torchrun --nproc_per_node 2 --no-python vgrpo train --algo vgrpo --task digits8 --out runs/ddp2

How the work is split (data parallelism over whole prompt groups):

- Global batch = ``prompts_per_iteration * group_size`` samples. Rank ``r`` of ``W`` owns the contiguous
  block ``r`` of ``prompts_per_iteration / W`` whole prompt groups (:func:`shard_groups`), so a group
  never spans two ranks.
- Every random draw whose size depends on the batch (prompts, initial noise, V-GRPO's timestep-noise
  pairs, DiffusionNFT's pairs) is drawn for the GLOBAL batch on every rank from the same seeded
  generator, and each rank keeps its block (:class:`Shard`). Drawing a few global noise tensors is cheap
  next to the model forwards, and it buys two things: the generator streams stay identical on all
  ranks (nothing has to be broadcast, sharing scope ``"batch"`` included: every rank draws the same
  set), and a W-process run reproduces the 1-process run on the same global batch up to float
  summation order. No two ranks generate the same image by accident: they denoise different slices
  of one global noise tensor.
- Rewards are computed on each rank's own samples, then all-gathered (``B`` floats), so advantages
  and every logged reward statistic are those of the global batch on every rank.
- Gradients are averaged by DDP (:func:`wrap_model`): each rank's loss is the mean over its equal-sized
  block, and the mean of equal-sized means is the global mean.
- Only rank 0 writes files and evaluates; the other ranks wait at the next collective.

Exceptions to "equals the 1-process run": Flow-GRPO's per-step SDE noise is drawn inside
:func:`vgrpo_lib.samplers.sample_sde` for the local batch, so there each rank uses its own generator
(:meth:`Shard.independent_generator`): independent noise, statistically the same run, not bitwise. With
``optim.minibatch_size`` set, each rank takes local minibatches of ``minibatch_size / W`` rows of its
own block, so a global minibatch is W local random subsets rather than one random subset of the batch.

FSDP2 (``distributed.strategy=fsdp2``, for models that do not fit once per GPU): ``fully_shard`` on every
block of the trained policy (each item of its ``nn.ModuleList`` s, e.g. the transformer blocks) and then on
the whole model; the frozen copies the algorithms keep (a reference policy, DiffusionNFT's old policy) are
sharded the same way (:func:`shard_frozen`). Gradients are reduce-scattered as averages, exactly as DDP
all-reduces them, so the run is the same run. Checkpoints hold FULL state dicts gathered on rank 0
(:func:`model_state_dict`, :func:`optimizer_state_dict`): the same format as a DDP or single-process
run's. Works on CPU with gloo (tests/integrations/test_distributed.py).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "T", "STRATEGIES", "is_initialized", "rank", "world_size", "is_main", "init_from_env", "shutdown", "shard_groups",
    "all_gather_tensor", "broadcast_", "barrier", "decided_by_main", "all_finite", "metric_extreme",
    "all_reduce_metrics", "is_sharded", "wrap_model", "unwrap", "shard_frozen", "gradient_sync", "model_state_dict",
    "load_model_state_dict", "optimizer_state_dict", "load_optimizer_state_dict", "local_parameters", "full_tensor",
    "Shard",
]

T = TypeVar("T")

STRATEGIES = ("ddp", "fsdp2")


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    """Number of processes (1 without a process group)."""
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """Whether this process is rank 0, the one that writes files."""
    return rank() == 0


@contextlib.contextmanager
def init_from_env() -> Iterator[Shard]:
    """Join the process group torchrun describes in the environment, and leave it on exit.

    Reads ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. The backend is gloo
    without CUDA, and ``"cpu:gloo,cuda:nccl"`` with it (nccl for CUDA tensors, gloo for the CPU tensors the
    testbed trainer uses), with this process pinned to GPU ``LOCAL_RANK``. Without ``WORLD_SIZE`` (a plain
    ``python`` / ``vgrpo`` launch) nothing is initialised and the single-process :class:`Shard` is yielded.
    A process group that already exists (e.g. set up by a test) is used as is and left alone.
    """
    if "WORLD_SIZE" not in os.environ or is_initialized():
        yield Shard.current()
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend)
    try:
        yield Shard.current()
    except BaseException:
        dist.destroy_process_group()  # no barrier: the other ranks may not get there
        raise
    shutdown()


def shutdown() -> None:
    """Leave the process group: wait for every rank, then destroy it.

    Drop every DDP wrapper (e.g. the trainer) before calling this. A DDP wrapper's reducer holds the process group;
    if it is freed after ``destroy_process_group`` it destroys the gloo group itself while holding the GIL, and
    that hangs the process at exit whenever a gloo worker thread still needs the GIL to free a tensor (seen with
    torch 2.13: https://github.com/pytorch/pytorch/issues/56297). Freed before, it only drops a reference.
    """
    gc.collect()  # DDP wrappers sit in reference cycles: free the unreachable ones now
    dist.barrier()  # rank 0 still evaluates and writes after the others finish
    dist.destroy_process_group()


def shard_groups(num_prompts: int, world_size: int, rank: int) -> slice:
    """The prompt indices rank ``rank`` of ``world_size`` owns: a contiguous block of whole prompt groups.

    >>> shard_groups(8, 2, 1)
    slice(4, 8, None)
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"Need world_size >= 1 and 0 <= rank < world_size, got world_size={world_size}, rank={rank}.")
    if num_prompts % world_size:
        raise ValueError(
            f"prompts_per_iteration={num_prompts} is not divisible by the number of processes ({world_size}): "
            "every process must own the same number of whole prompt groups. Choose a multiple of "
            f"{world_size} or launch a number of processes that divides {num_prompts}."
        )
    per_rank = num_prompts // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def all_gather_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate along dim 0 the equal-shaped ``tensor`` of every rank, in rank order (the tensor itself
    without a process group)."""
    if world_size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def broadcast_(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Overwrite ``tensor`` in place with rank ``src``'s value on every rank; returns it."""
    if world_size() > 1:
        dist.broadcast(tensor, src)
    return tensor


def barrier() -> None:
    """Wait until every rank gets here (nothing without a process group). After rank 0 writes a checkpoint, so
    that no rank can read one that is not complete."""
    if world_size() > 1:
        dist.barrier()


def decided_by_main(decide: Callable[[], T]) -> T:
    """Run ``decide()`` on rank 0 only and give every rank its result, or raise its exception on every rank (a
    collective): for what rank 0 alone may look at or change, such as the run directory and its lock."""
    if world_size() == 1:
        return decide()
    payload: list = [None]
    if is_main():
        try:
            payload = [(True, decide())]
        except Exception as error:  # whatever rank 0 hit, every rank raises
            payload = [(False, error)]
    dist.broadcast_object_list(payload, src=0, device=torch.device("cpu"))
    succeeded, value = payload[0]
    if not succeeded:
        raise value
    return value


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` (on every rank; a DTensor's local shard here) is finite: one device
    sync and, with several processes, one all-reduce."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    finite = torch.stack([torch.isfinite(t).all() for t in local]).all().float().reshape(1).cpu()
    return bool(all_reduce_metrics(finite, ["finite_min"])[0] == 1)


def metric_extreme(name: str) -> str | None:
    """How a logged value combines across processes or micro-batches: ``"min"`` / ``"max"`` for names ending in
    ``_min`` / ``_max``, None (a weighted mean) for all others."""
    return "min" if name.endswith("_min") else "max" if name.endswith("_max") else None


def all_reduce_metrics(values: torch.Tensor, names: Sequence[str]) -> torch.Tensor:
    """Per-process logged values ``[..., len(names)]`` combined into global ones, identical on every rank.

    Names ending in ``_min`` / ``_max`` take the min / max over processes, all others the mean: exact for
    means over equal-sized blocks, an approximation for other non-linear statistics (e.g. ``ess``, the
    normalised effective sample size, becomes the mean of the per-process values).
    """
    if world_size() == 1:
        return values
    low, high, total = values.detach().clone(), values.detach().clone(), values.detach().clone()
    dist.all_reduce(low, dist.ReduceOp.MIN)
    dist.all_reduce(high, dist.ReduceOp.MAX)
    dist.all_reduce(total)
    is_min = torch.tensor([metric_extreme(name) == "min" for name in names], device=values.device)
    is_max = torch.tensor([metric_extreme(name) == "max" for name in names], device=values.device)
    return torch.where(is_min, low, torch.where(is_max, high, total / world_size()))


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"Unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}.")


def _fully_shard(model: nn.Module) -> nn.Module:
    """FSDP2 in place: each block (every item of every ``nn.ModuleList``, outermost lists first) is its own
    unit, so only one block's full parameters exist at a time; the rest of the model is the root unit."""
    from torch.distributed.fsdp import fully_shard

    blocks = [block for module in model.modules() if isinstance(module, nn.ModuleList) for block in module]
    covered: set[int] = set()  # modules inside a unit already made
    for block in blocks:
        if id(block) not in covered and any(True for _ in block.parameters()):
            fully_shard(block)
            covered.update(id(sub) for sub in block.modules())
    return fully_shard(model)


def is_sharded(model) -> bool:
    """Whether ``model`` is an FSDP2 module (its parameters are sharded DTensors)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def wrap_model(model: nn.Module, strategy: str = "ddp") -> nn.Module:
    """Make ``model``'s backward average gradients over ranks.

    ``"ddp"``: a ``DistributedDataParallel`` wrapper (call the wrapper for the forwards that carry gradients;
    the wrapped module's own parameters, state dict and optimizer stay as they are, see :func:`unwrap`).
    Buffers are not re-broadcast before every forward: velocity models have no running statistics, and
    their constant buffers are loaded identically on every rank.
    ``"fsdp2"``: ``fully_shard`` per block and on the whole model, in place (parameters become sharded
    DTensors; build the optimizer afterwards; save with :func:`model_state_dict`).
    Without a process group the model is returned unchanged.
    """
    _check_strategy(strategy)
    if world_size() == 1:
        return model
    if strategy == "fsdp2":
        return _fully_shard(model)
    ddp = nn.parallel.DistributedDataParallel
    # torch >= 2.13 renames broadcast_buffers to forward_sync_buffers (and then still syncs buffers once at init).
    no_sync = "forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(ddp).parameters else "broadcast_buffers"
    # No device_ids, also for a model on a GPU: DDP then leaves the inputs where they are. The trainer keeps its
    # batches on the CPU and a GPU policy moves each call's inputs itself and returns its output on the caller's
    # device (vgrpo_lib.integrations.tasks.hub.LoRAPolicy); with device_ids DDP would return GPU outputs.
    return ddp(model, **{no_sync: False})


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (any other module unchanged)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def shard_frozen(model, strategy: str):
    """A frozen policy copy prepared for ``strategy``: sharded like the trained model under FSDP2 (so that a
    large model is not held whole on every rank), unchanged under DDP, in one process, or when ``model`` is not
    an ``nn.Module`` (e.g. an adapter view that shares the trained model's weights)."""
    _check_strategy(strategy)
    if strategy != "fsdp2" or world_size() == 1 or not isinstance(model, nn.Module):
        return model
    return _fully_shard(model)


@contextlib.contextmanager
def gradient_sync(model, enabled: bool) -> Iterator[None]:
    """Inside the block, backward passes synchronise gradients across ranks only when ``enabled`` (the last
    micro-batch of an accumulated step); DDP's ``no_sync`` or FSDP2's ``set_requires_gradient_sync``."""
    if enabled or world_size() == 1:
        yield
    elif is_sharded(model):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        with model.no_sync():  # a DDP wrapper: the trainer wraps every multi-process policy
            yield


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def model_state_dict(model: nn.Module) -> dict:
    """``model``'s state dict with full (unsharded) tensors; for an FSDP2 model a collective (call it on every
    rank): rank 0 receives the tensors on the CPU, the other ranks an empty dict."""
    if not is_sharded(model):
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options())


def load_model_state_dict(model: nn.Module, state: dict) -> None:
    """Load a full state dict (as :func:`model_state_dict` writes) into a plain, DDP or FSDP2 model; every rank
    passes the full dict."""
    if not is_sharded(model):
        unwrap(model).load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state dict with full tensors (a collective for an FSDP2 ``model``, see
    :func:`model_state_dict`)."""
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options())


def load_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load :func:`optimizer_state_dict`'s output back (every rank passes the full dict)."""
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def local_parameters(model: nn.Module) -> list[nn.Parameter]:
    """``model``'s parameters as stored: for an FSDP2 model its shards (a root unit keeps its parameters gathered
    after a forward until told otherwise; it is resharded first), so that two identically sharded models can be
    combined elementwise (an EMA update)."""
    if is_sharded(model):
        model.reshard()
    return list(unwrap(model).parameters())


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (e.g. a gradient norm computed over sharded gradients); other tensors as they are."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


@dataclass(frozen=True)
class Shard:
    """This process's share of every global batch: rows ``[rank * n, (rank + 1) * n)`` of ``W * n``.

    The single-process default (``Shard()``) makes every method the identity, so code written against a
    shard runs unchanged in one process.
    """

    rank: int = 0
    world_size: int = 1

    @classmethod
    def current(cls) -> Shard:
        """The shard of this process in the current process group (single-process without one)."""
        return cls(rank(), world_size())

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def check_divisible(self, name: str, value: int) -> None:
        """A clear ``ValueError`` unless ``value`` (a global count named ``name``) splits evenly over ranks."""
        if value % self.world_size:
            raise ValueError(
                f"{name}={value} is not divisible by the number of processes ({self.world_size}); "
                f"choose a multiple of {self.world_size}."
            )

    def local(self, rows):
        """This rank's block of a global Tensor / TensorDict (rows along dim 0)."""
        self.check_divisible("the global batch", rows.shape[0])
        per_rank = rows.shape[0] // self.world_size
        return rows[self.rank * per_rank : (self.rank + 1) * per_rank]

    def global_like(self, local: torch.Tensor) -> torch.Tensor:
        """A zero-copy stand-in with the GLOBAL batch size, for draws that only read shape, dtype and device."""
        if self.world_size == 1:
            return local
        return local[:1].expand(local.shape[0] * self.world_size, *local.shape[1:])

    def all_gather(self, local: torch.Tensor) -> torch.Tensor:
        """The global tensor from every rank's equal-sized block, in rank order."""
        return local if self.world_size == 1 else all_gather_tensor(local)

    def randn(self, local_shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
        """Standard normal noise for this rank's rows: drawn for the global batch, block kept."""
        global_shape = (local_shape[0] * self.world_size, *local_shape[1:])
        return self.local(torch.randn(global_shape, generator=generator, device=generator.device))

    def independent_generator(self, generator: torch.Generator) -> torch.Generator:
        """A generator for per-rank draws that cannot be taken from a global draw (Flow-GRPO's SDE steps).

        One process: ``generator`` itself (runs are unchanged). Several: a fresh generator seeded from one
        draw of ``generator`` (consumed identically on every rank, so the shared stream stays in sync) plus
        the rank, so ranks draw independent noise.
        """
        if self.world_size == 1:
            return generator
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        return torch.Generator(device=generator.device).manual_seed(seed + self.rank)
