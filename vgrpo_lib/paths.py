"""Forward (noising) processes and conversions between velocity, data and noise predictions.

A path is ``z_t = a_t x + b_t eps`` with ``t in [0, 1]``, ``t = 1`` pure noise. The network predicts the
velocity ``v = dz_t/dt = a'_t x + b'_t eps``. Given ``(z_t, v)`` the pair ``(x, eps)`` is the solution of a
2x2 linear system with determinant ``a_t b'_t - a'_t b_t``, which is what :meth:`Path.x_from_v` and
:meth:`Path.eps_from_v` compute.

:class:`RectifiedFlow` (``a_t = 1 - t``, ``b_t = t``) is the SD3 / FLUX / diffusers convention and the default
everywhere; :class:`CosineVP` is a variance-preserving path (``a_t = cos(pi t / 2)``, ``b_t = sin(pi t / 2)``,
i.e. ``abar_t = cos^2``) that plugs into the same interface.
"""

from __future__ import annotations

import math

import torch

from vgrpo_lib._checks import choose

__all__ = ["Path", "RectifiedFlow", "CosineVP", "PATHS", "make_path"]


def _expand_time(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape ``t`` of shape ``like.shape[:t.ndim]`` to broadcast over the data dimensions of ``like``."""
    return t.reshape(t.shape + (1,) * (like.ndim - t.ndim))


class Path:
    """A forward process ``z_t = a_t x + b_t eps``; subclasses define ``a``, ``b`` and their derivatives."""

    name = "path"

    def a(self, t: torch.Tensor) -> torch.Tensor:
        """The data coefficient ``a_t``, elementwise (the shape of ``t``)."""
        raise NotImplementedError

    def b(self, t: torch.Tensor) -> torch.Tensor:
        """The noise coefficient ``b_t``, elementwise (the shape of ``t``)."""
        raise NotImplementedError

    def da(self, t: torch.Tensor) -> torch.Tensor:
        """``d a_t / dt``, elementwise (the shape of ``t``)."""
        raise NotImplementedError

    def db(self, t: torch.Tensor) -> torch.Tensor:
        """``d b_t / dt``, elementwise (the shape of ``t``)."""
        raise NotImplementedError

    def add_noise(self, x: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``z_t = a_t x + b_t eps``; ``t`` has the leading (batch) shape of ``x``."""
        return _expand_time(self.a(t), x) * x + _expand_time(self.b(t), x) * noise

    def velocity(self, x: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The regression target of a velocity network: ``a'_t x + b'_t eps``."""
        return _expand_time(self.da(t), x) * x + _expand_time(self.db(t), x) * noise

    def _det(self, t: torch.Tensor) -> torch.Tensor:
        return self.a(t) * self.db(t) - self.da(t) * self.b(t)

    def x_from_v(self, z: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Data prediction ``x_hat = (b'_t z - b_t v) / det``."""
        det = self._det(t)
        return (_expand_time(self.db(t) / det, z) * z) - _expand_time(self.b(t) / det, z) * v

    def eps_from_v(self, z: torch.Tensor, v: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Noise prediction ``eps_hat = (a_t v - a'_t z) / det``."""
        det = self._det(t)
        return _expand_time(self.a(t) / det, z) * v - _expand_time(self.da(t) / det, z) * z

    def v_from_x(self, z: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Velocity implied by a data prediction at ``z_t`` (singular where ``b_t = 0``)."""
        a, b, da, db = (_expand_time(f(t), z) for f in (self.a, self.b, self.da, self.db))
        eps = (z - a * x) / b
        return da * x + db * eps

    def log_snr(self, t: torch.Tensor) -> torch.Tensor:
        """``lambda_t = 2 log(a_t / b_t)``."""
        return 2.0 * (torch.log(self.a(t)) - torch.log(self.b(t)))

    def elbo_x_weight(self, t: torch.Tensor) -> torch.Tensor:
        """Weight on ``||x_hat - x||^2`` that makes the denoising loss the continuous-time ELBO.

        Kingma & Gao (2023): the ELBO is ``1/2 E_t[-dlambda/dt ||eps_hat - eps||^2]`` with
        ``||eps_hat - eps||^2 = (a/b)^2 ||x_hat - x||^2`` and ``dlambda/dt = 2 (a'/a - b'/b)``; the product
        simplifies to ``a_t det_t / b_t^3`` (finite at ``t = 1``, singular at ``t = 0``).
        Rectified flow: ``(1 - t) / t^3``.
        """
        return self.a(t) * self._det(t) / self.b(t) ** 3


class RectifiedFlow(Path):
    """``z_t = (1 - t) x + t eps``; velocity target ``eps - x``; ``x_hat = z - t v``; ``eps_hat = z + (1 - t) v``."""

    name = "rectified_flow"

    def a(self, t):
        return 1.0 - t

    def b(self, t):
        return t

    def da(self, t):
        return torch.full_like(t, -1.0)

    def db(self, t):
        return torch.ones_like(t)

    def x_from_v(self, z, v, t):
        return z - _expand_time(t, z) * v

    def eps_from_v(self, z, v, t):
        return z + _expand_time(1.0 - t, z) * v

    def velocity(self, x, noise, t):
        return noise - x


class CosineVP(Path):
    """Variance-preserving path ``a_t = cos(pi t / 2)``, ``b_t = sin(pi t / 2)`` (``abar_t = cos^2(pi t / 2)``)."""

    name = "cosine_vp"

    def a(self, t):
        return torch.cos(0.5 * math.pi * t)

    def b(self, t):
        return torch.sin(0.5 * math.pi * t)

    def da(self, t):
        return -0.5 * math.pi * torch.sin(0.5 * math.pi * t)

    def db(self, t):
        return 0.5 * math.pi * torch.cos(0.5 * math.pi * t)


PATHS = {"rectified_flow": RectifiedFlow, "cosine_vp": CosineVP}


def make_path(path: str | Path) -> Path:
    """Return a :class:`Path` from its name (``"rectified_flow"``, ``"cosine_vp"``) or pass one through."""
    if isinstance(path, Path):
        return path
    return PATHS[choose("path", path, PATHS)]()
