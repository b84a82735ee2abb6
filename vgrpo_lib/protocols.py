"""The model contract: what every estimator, loss and sampler of vgrpo_lib calls.

    v = model(x_t, t, cond)

:class:`VelocityModel` is a ``typing.Protocol`` (runtime_checkable): any callable with this signature is one (an
``nn.Module``, a function, a diffusers transformer wrapped by :mod:`vgrpo_lib.integrations.diffusers_adapters`);
nothing needs to subclass it.
"""

from __future__ import annotations

from typing import Protocol, Union, runtime_checkable

import torch
from tensordict import TensorDictBase

__all__ = ["Condition", "VelocityModel"]

Condition = Union[torch.Tensor, TensorDictBase, None]
"""A model's conditioning: a Tensor or TensorDict whose first dimension is the batch N, or None (unconditional)."""


@runtime_checkable
class VelocityModel(Protocol):
    """A velocity model ``model(x_t, t, cond) -> v``.

    Args:
        x_t: ``(N, *D)`` the noised samples at time ``t`` (``D`` the sample's event shape: 2-D points ``(2,)``, image
            latents ``(C, H, W)``, video latents ``(C, F, H, W)``; every estimator, loss and sampler reduces over all
            of ``D``, so the number and meaning of its dimensions never matter).
        t: ``(N,)`` float in ``[0, 1]``, one time per row, with ``t = 1`` pure noise and ``t = 0`` data; its dtype
            and device follow ``x_t``. The samplers pass one time for the whole batch, repeated to ``(N,)``.
        cond: a Tensor or TensorDict with batch size ``N`` (row ``i`` conditions ``x_t[i]``), or None.

    Returns:
        ``v``: ``(N, *D)``, the shape (and device) of ``x_t``: the predicted velocity ``dx_t / dt``. Under the rectified
        flow ``x_t = (1 - t) x_0 + t eps`` (:class:`vgrpo_lib.paths.RectifiedFlow`, the default path) its target is
        ``eps - x_0``, so ``x_0 = x_t - t v`` and ``eps = x_t + (1 - t) v``; under another path
        (:class:`vgrpo_lib.paths.CosineVP`) the target is that path's ``velocity(x_0, eps, t)``.

    How :class:`vgrpo_lib.ELBOSurrogate` calls it: for B samples and K timestep-noise pairs it makes ONE call with
    ``N = B * K`` rows (or chunks of at most ``chunk_size`` rows), ordered sample-major: row ``b * K + k`` is sample
    ``b`` at pair ``k`` (``x_t`` is the ``(B, K, *D)`` tensor flattened to ``(B * K, *D)``, ``t`` the ``(B, K)`` times
    flattened), and ``cond`` is each sample's condition repeated K times in a row
    (``cond.repeat_interleave(K, dim=0)``, :func:`vgrpo_lib.elbo.repeat_rows`; a chunk gets the matching rows).
    So a model must treat rows independently (no batch statistics such as train-mode BatchNorm). The samplers
    (:mod:`vgrpo_lib.samplers`) call it with ``N = B`` once (Euler) or more (Heun, DPM-Solver++) per step.
    """

    def __call__(self, x_t: torch.Tensor, t: torch.Tensor, cond: Condition) -> torch.Tensor: ...
