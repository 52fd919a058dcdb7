"""Periodic Poisson solver: ``lap(phi) = f`` by Fourier transform, on one block or all of them.

The solve is a multiplication in Fourier space, ``phi_hat = f_hat / lambda(k)``, with either

- ``"spectral"``: ``lambda = -|k|^2``, ``k_a = 2 pi m_a / L_a``: exact for trigonometric
  polynomials the grid resolves;
- ``"discrete"``: ``lambda = sum_a (2 cos(k_a dx_a) - 2) / dx_a^2``, the eigenvalues of the
  second-order (2d+1)-point Laplacian (``simpar.grid.stencils.laplacian``, 5-point in 2-D,
  7-point in 3-D): applying that stencil to ``phi`` (periodic halo) gives back ``f`` to round-off.

The ``k = 0`` mode of ``phi`` is set to 0: the periodic problem needs a zero-mean ``f``, so the
mean of ``f`` is dropped (the solver answers for ``f - mean(f)``) and ``phi`` has zero mean.

No device code here. The transforms come in as an *ops* object with ``forward``, ``inverse``,
``freq(axis)``, ``shape`` and ``real`` (``simpar.parallel.fft.SpectralOps`` for the ``pmap``,
``shard_map`` and ``sharded`` engines, which the engine passes in; by default :func:`local_ops`,
``jnp.fft`` on one device). Fourier data stay in whatever layout ``forward`` produces:
``freq`` describes the local block, so no transpose back is needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from simpar import precision
from simpar.errors import ConfigError

KINDS = ("spectral", "discrete")


@dataclass(frozen=True)
class LocalOps:
    """``jnp.fft`` on the whole field (one device): the default transforms of :func:`solve`.

    Attributes:
      shape: grid ``(N_0, ..., N_{d-1})``; fields are ``(*lead, *shape)``.
      real: ``rfftn``/``irfftn`` (real fields) instead of ``fftn``/``ifftn``.
    """

    shape: tuple[int, ...]
    real: bool = True

    def _axes(self):
        return tuple(range(-len(self.shape), 0))

    def forward(self, x: jax.Array) -> jax.Array:
        """``(*lead, *shape)`` -> Fourier coefficients ``(*lead, ..., N_{d-1} // 2 + 1)``
        (``real``) or ``(*lead, *shape)``, complex."""
        fn = jnp.fft.rfftn if self.real else jnp.fft.fftn
        return fn(x, axes=self._axes())

    def inverse(self, k: jax.Array) -> jax.Array:
        """Inverse of :meth:`forward`."""
        if self.real:
            return jnp.fft.irfftn(k, s=self.shape, axes=self._axes())
        return jnp.fft.ifftn(k, axes=self._axes())

    def freq(self, axis: int) -> jax.Array:
        """Integer frequencies along ``axis``, int32, broadcastable over the ``d`` axes."""
        d, n = len(self.shape), self.shape[axis]
        if self.real and axis == d - 1:
            m = np.arange(n // 2 + 1)
        else:
            m = np.fft.fftfreq(n, 1.0 / n).round().astype(int)
        return jnp.asarray(m.reshape([-1 if a == axis else 1 for a in range(d)]), jnp.int32)


def local_ops(shape: Sequence[int], real: bool = True) -> LocalOps:
    """One-device transforms of a ``shape`` grid (``real``: rfftn)."""
    return LocalOps(tuple(int(n) for n in shape), bool(real))


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ConfigError("poisson.kind", f"unknown kind {kind!r}; choose one of {KINDS}")


def eigenvalues(ops, dx: Sequence, kind: str = "spectral", dtype=None) -> jax.Array:
    """Fourier symbol ``lambda(k)`` of the Laplacian on the (local) Fourier data of ``ops``.

    Args:
      ops: transforms (``forward``, ``inverse``, ``freq``, ``shape``, ``real``).
      dx: per spatial axis the cell size (length; floats or scalar arrays, differentiable).
      kind: ``"spectral"`` or ``"discrete"``.
      dtype: real dtype of the result (default: JAX's default float).

    Returns:
      Real, broadcastable to the Fourier data's ``d`` trailing axes; units 1/length^2.
      Zero exactly at ``k = 0``.

    Raises:
      ConfigError: unknown ``kind`` or ``dx`` of the wrong length.
    """
    _check_kind(kind)
    shape = tuple(ops.shape)
    if len(dx) != len(shape):
        raise ConfigError("grid.dx", f"need {len(shape)} cell sizes for grid {shape}, got {dx}")
    dtype = precision.resolve(dtype, key="dtype")
    lam = None
    for a, n in enumerate(shape):
        h = jnp.asarray(dx[a], dtype)
        theta = ops.freq(a).astype(dtype) * (2 * math.pi / n)  # k_a dx_a
        term = -((theta / h) ** 2) if kind == "spectral" else (2 * jnp.cos(theta) - 2) / h**2
        lam = term if lam is None else lam + term
    return lam


def solve(f: jax.Array, dx: Sequence, kind: str = "spectral", ops=None) -> jax.Array:
    """``phi`` with ``lap(phi) = f - mean(f)`` on a periodic grid, zero-mean.

    Args:
      f: source, ``(*lead, N_0, ..., N_{d-1})`` on one device (``ops=None``) or one block /
        one global sharded array in the real-space layout of ``ops``; real or complex
        float32/float64, units of phi / length^2.
      dx: per spatial axis the cell size (length).
      kind: ``"spectral"`` (``-|k|^2``) or ``"discrete"`` (the (2d+1)-point stencil's
        eigenvalues).
      ops: transforms; default ``local_ops(f.shape[-len(dx):], real=not complex f)``.

    Returns:
      ``phi``, same shape and layout as ``f``; real when ``f`` is real.

    Raises:
      ConfigError: ``f`` is a float64/complex128 (NumPy) array and 64-bit JAX is off: JAX
        would compute in float32 (``simpar.precision``).
    """
    precision.require_input(f, "poisson.solve(f)")
    real_in = not jnp.iscomplexobj(f)
    if ops is None:
        ops = local_ops(f.shape[f.ndim - len(dx) :], real=real_in)
    rdtype = jnp.real(jnp.zeros((), f.dtype)).dtype
    lam = eigenvalues(ops, dx, kind, rdtype)
    fk = ops.forward(f)
    zero = lam == 0
    phik = jnp.where(zero, 0, fk / jnp.where(zero, 1, lam))
    phi = ops.inverse(phik)
    return jnp.real(phi) if real_in and jnp.iscomplexobj(phi) else phi


__all__ = ["KINDS", "LocalOps", "eigenvalues", "local_ops", "solve"]
