"""Hypothesis strategies for property tests of group-relative RL pieces and ELBO estimators.

Needs hypothesis (the ``test`` extra: ``pip install 'vgrpo-lib[test]'``). Each strategy draws valid inputs:

- :func:`group_ids`: prompt-group ids ``(B,)`` with chosen group sizes (arbitrary integer labels, shuffled);
- :func:`reward_batches`: ``(reward, group)`` with finite rewards ``(B,)`` (or ``(B, R)``), groups generic, constant
  or tied;
- :func:`sample_batches`: a TensorDict ``(B,)`` with ``"sample"`` ``(B, *D)``, ``"group"`` and ``"cond"``;
- :func:`video_shapes`: video latent shapes ``D = (C, F, H, W)`` with several frames (``sample_batches(data_shapes=
  video_shapes())`` draws video batches);
- :func:`estimator_configs` / :func:`estimators`: ``ELBOSurrogate`` keyword arguments (``num_pairs``,
  ``timesteps``, ``sharing``, ``weighting``, ``noise``) from the core's registries, and the estimators themselves.

Example:
    >>> from hypothesis import given
    >>> from vgrpo_lib.testing.strategies import estimators, sample_batches
    >>> @given(estimators(), sample_batches())
    ... def test_pairs_have_shape_b_k(estimator, batch):
    ...     pairs = estimator.sample_pairs(batch["sample"], batch["group"])
    ...     assert pairs.batch_size == (batch.shape[0], estimator.num_pairs)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

try:
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - exercised only where the extra is missing
    raise ImportError(
        "vgrpo_lib.testing.strategies needs hypothesis, from the test extra: pip install 'vgrpo-lib[test]'"
    ) from None

import torch
from tensordict import TensorDict

from vgrpo_lib.elbo import NOISE_SCHEMES, SHARING_SCOPES, ELBOSurrogate
from vgrpo_lib.timesteps import TIMESTEP_SAMPLERS, TimestepSampler
from vgrpo_lib.weighting import WEIGHTINGS

__all__ = ["estimator_configs", "estimators", "group_ids", "reward_batches", "sample_batches", "video_shapes"]


@st.composite
def group_ids(draw, min_groups: int = 1, max_groups: int = 4, min_size: int = 2, max_size: int = 5,
              shuffle: bool = True) -> torch.Tensor:
    """Group ids ``(B,)`` (int64): between ``min_groups`` and ``max_groups`` groups, each of ``min_size`` to
    ``max_size`` members, with distinct arbitrary integer labels; members interleaved when ``shuffle``."""
    sizes = draw(st.lists(st.integers(min_size, max_size), min_size=min_groups, max_size=max_groups))
    labels = draw(st.lists(st.integers(-1000, 1000), min_size=len(sizes), max_size=len(sizes), unique=True))
    ids = [label for label, size in zip(labels, sizes) for _ in range(size)]
    if shuffle:
        ids = [ids[i] for i in draw(st.permutations(range(len(ids))))]
    return torch.tensor(ids, dtype=torch.long)


@st.composite
def reward_batches(draw, num_rewards: int | None = None, dtype: torch.dtype = torch.float32,
                   values: st.SearchStrategy[float] | None = None, **group_options) -> tuple[torch.Tensor, torch.Tensor]:
    """``(reward, group)``: finite rewards ``(B,)`` (``(B, num_rewards)`` when given) in ``dtype`` with ``group``
    from :func:`group_ids` (``group_options``). Each group's rewards are drawn generic, constant (its advantages
    must be exactly 0) or tied (each member picks one of two values). ``values``: the strategy of one reward
    (default: float32-representable floats in [-10, 10]; a coarse grid such as ``st.integers(-4000, 4000).map(lambda
    i: i / 4)`` keeps group sums exact)."""
    if values is None:
        values = st.floats(-10, 10, allow_nan=False, allow_infinity=False, allow_subnormal=False, width=32)
    group = draw(group_ids(**group_options))
    width = 1 if num_rewards is None else num_rewards
    row = lambda: [draw(values) for _ in range(width)]  # noqa: E731
    reward = torch.empty(group.shape[0], width, dtype=torch.float64)
    for label in torch.unique(group).tolist():
        members = (group == label).nonzero().flatten().tolist()
        kind = draw(st.sampled_from(["generic", "constant", "ties"]))
        pool = [row()] if kind == "constant" else [row(), row()] if kind == "ties" else None
        for member in members:
            reward[member] = torch.tensor(row() if pool is None else draw(st.sampled_from(pool)), dtype=torch.float64)
    reward = reward.to(dtype)
    return (reward[:, 0] if num_rewards is None else reward), group


@st.composite
def video_shapes(draw, max_channels: int = 3, min_frames: int = 2, max_frames: int = 4,
                 max_side: int = 4) -> tuple[int, int, int, int]:
    """A video latent's shape ``(C, F, H, W)``: 1 to ``max_channels`` channels, ``min_frames`` to ``max_frames``
    frames and 1 to ``max_side`` latent pixels per side (the layout of Wan's ``(B, C, F, H, W)`` latents)."""
    return (draw(st.integers(1, max_channels)), draw(st.integers(min_frames, max_frames)),
            draw(st.integers(1, max_side)), draw(st.integers(1, max_side)))


@st.composite
def sample_batches(draw, data_shapes: Sequence[tuple[int, ...]] | st.SearchStrategy = ((2,), (3,), (2, 3)),
                   cond_dim: int = 0, dtype: torch.dtype = torch.float32, **group_options) -> TensorDict:
    """A TensorDict ``(B,)`` with ``"sample"`` ``(B, *D)`` (``D`` one of ``data_shapes``, or drawn by it when it is
    a strategy such as :func:`video_shapes`; standard normal values drawn from a hypothesis-chosen seed),
    ``"group"`` ``(B,)`` from :func:`group_ids` and, when ``cond_dim``, ``"cond"`` ``(B, cond_dim)``."""
    group = draw(group_ids(**group_options))
    shapes = data_shapes if isinstance(data_shapes, st.SearchStrategy) else st.sampled_from(list(data_shapes))
    shape = tuple(draw(shapes))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    batch = TensorDict({"sample": torch.randn((group.shape[0], *shape), generator=generator, dtype=dtype),
                        "group": group}, batch_size=[group.shape[0]])
    if cond_dim:
        batch["cond"] = torch.randn((group.shape[0], cond_dim), generator=generator, dtype=dtype)
    return batch


@st.composite
def estimator_configs(draw, num_pairs: Sequence[int] = (1, 2, 3, 4, 6, 8),
                      timesteps: Sequence[str | TimestepSampler] | None = None, sharing: Sequence[str] | None = None,
                      weightings: Sequence[str | Callable] | None = None, noise: Sequence[str] | None = None) -> dict:
    """Keyword arguments of :class:`~vgrpo_lib.elbo.ELBOSurrogate`: ``num_pairs`` from ``num_pairs`` and
    ``timesteps`` / ``sharing`` / ``weighting`` / ``noise`` from the given choices (None: every name of the core's
    registries ``TIMESTEP_SAMPLERS``, ``SHARING_SCOPES``, ``WEIGHTINGS``, ``NOISE_SCHEMES``). ``timesteps`` and
    ``weightings`` may hold your own samplers and weighting callables. ``noise="antithetic"`` is drawn only with an
    even ``num_pairs`` (it needs couples)."""
    config = {
        "num_pairs": draw(st.sampled_from(list(num_pairs))),
        "timesteps": draw(st.sampled_from(list(timesteps or TIMESTEP_SAMPLERS))),
        "sharing": draw(st.sampled_from(list(sharing or SHARING_SCOPES))),
        "weighting": draw(st.sampled_from(list(weightings or WEIGHTINGS))),
    }
    schemes = [n for n in (noise or NOISE_SCHEMES) if n != "antithetic" or config["num_pairs"] % 2 == 0]
    config["noise"] = draw(st.sampled_from(schemes or ["independent"]))
    return config


def estimators(**config_options) -> st.SearchStrategy[ELBOSurrogate]:
    """:class:`~vgrpo_lib.elbo.ELBOSurrogate` instances built from :func:`estimator_configs` (``config_options``)."""
    return estimator_configs(**config_options).map(lambda config: ELBOSurrogate(**config))
