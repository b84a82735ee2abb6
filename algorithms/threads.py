"""How many CPU threads torch uses in a run: no more than the cores the process may run on.

torch sizes its intra-op thread pool from the machine, not from the cores the process is given (``taskset``, a
container's cpuset, a batch scheduler's allocation), and every process of a ``torchrun`` job sizes its pool alike.
On a shared or busy machine those threads then contend for the same cores: the runs' CPU seconds rose 3-4x for the
same work. :func:`limit_torch_threads` (called by the trainer when it starts) lowers torch's thread count to
``cores given / local processes``; it never raises it, and it leaves the count alone when ``OMP_NUM_THREADS`` is set
(the user's choice; torch reads it at import) or when the user lowered it with ``torch.set_num_threads``.

On a machine shared with other jobs, give each run its cores explicitly, e.g. ``OMP_NUM_THREADS=1 vgrpo train ...``
or ``taskset -c 0,1 vgrpo train ...``.
"""

from __future__ import annotations

import os

import torch

__all__ = ["available_cores", "limit_torch_threads"]


def available_cores() -> int:
    """The number of cores this process may run on (its CPU affinity; ``os.cpu_count()`` where the platform has
    no affinity)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def limit_torch_threads() -> int:
    """Lower torch's intra-op thread count to this process's share of its cores (the cores given, divided by the
    processes of this node under ``torchrun``: ``LOCAL_WORLD_SIZE``), unless ``OMP_NUM_THREADS`` is set. Returns the
    thread count in use."""
    if os.environ.get("OMP_NUM_THREADS"):
        return torch.get_num_threads()
    share = max(1, available_cores() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    if torch.get_num_threads() > share:
        torch.set_num_threads(share)
    return torch.get_num_threads()
