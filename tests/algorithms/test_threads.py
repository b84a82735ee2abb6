"""The trainer uses no more torch threads than the cores it is given (``vgrpo_lib.algorithms.threads``)."""


import pytest
import torch

from vgrpo_lib.algorithms import threads
from vgrpo_lib.algorithms.threads import available_cores, limit_torch_threads
from vgrpo_lib.algorithms.trainer import Trainer


@pytest.fixture
def restored_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _given(monkeypatch, cores: int) -> None:
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)


def test_the_trainer_lowers_torch_threads_to_the_cores_it_is_given(tiny_config, tmp_path, monkeypatch, restored_threads):
    torch.set_num_threads(4)
    _given(monkeypatch, 1)
    Trainer(tiny_config("vgrpo", "iterations=1"), tmp_path / "run", progress=False)
    assert torch.get_num_threads() == 1


def test_threads_are_shared_among_local_processes_and_never_raised(monkeypatch, restored_threads):
    _given(monkeypatch, 8)
    assert available_cores() == 8
    torch.set_num_threads(8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert limit_torch_threads() == 2
    torch.set_num_threads(1)  # the user's lower choice stays
    assert limit_torch_threads() == 1


def test_omp_num_threads_is_the_users_choice(monkeypatch, restored_threads):
    _given(monkeypatch, 1)
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert limit_torch_threads() == 2 and torch.get_num_threads() == 2
