"""Pseudo-spectral 3-D incompressible Navier-Stokes in velocity (rotational) form, any engine.

Equations on a periodic box ``L_x x L_y x L_z`` (``x, y, z`` along array axes 0, 1, 2)::

    du/dt = P[u x omega + f] + nu lap(u) - mu u,   omega = curl(u),   div(u) = 0,

``P(k) = I - k k^T / |k|^2`` the projection onto divergence-free fields (it takes the place of
the pressure gradient and of ``grad(|u|^2 / 2)``), ``f = (F sin(k_f y), 0, 0)`` the optional
Kolmogorov force, ``mu`` linear drag.

**Space and time** as in the 2-D form (``simpar.grid.spectral_ns``): Fourier-Galerkin with the
2/3 rule (``3 |m_a| < N_a`` on every axis) and integrating-factor RK4 (``"ifrk4"``) or RK4
(``"rk4"``) through :func:`simpar.grid.spectral_ns.time_step`. The truncated system conserves
energy (and helicity) in its nonlinear term; a Beltrami field (``curl u = lambda u``, e.g. the
ABC flow) has ``u x omega = 0`` and decays exactly.

**State.** ``u_hat``: complex ``(3, *fourier block)``, the velocity's Fourier coefficients
(unnormalised ``rfftn``/``fftn``) in the Fourier layout of ``ops`` (pencil on a 2-D mesh, slab
on a 1-D one; see ``simpar.parallel.fft``), solenoidal and truncated. Per step 8 transform
calls, each batched over the components: per stage one inverse of ``(u, omega)`` (6 fields)
and one forward of ``u x omega`` (3 fields); nothing is transposed back between steps
(``sharded`` on a (2, 4) pencil: 16 all-to-alls per step and no other collective, read from
the HLO in ``tests/test_spectral_ns3d.py``).

Parameters are :class:`simpar.grid.spectral_ns.Params` with three box sizes (``make_params(...,
length=(Lx, Ly, Lz))``). No device code here; diagnostics take a ``comm`` for the global sums
as in 2-D.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simpar import precision
from simpar.errors import ConfigError
from simpar.grid.spectral_ns import Params, time_step


def _check(params: Params, ops) -> tuple[int, int, int]:
    shape = tuple(ops.shape)
    if len(shape) != 3:
        raise ConfigError("grid.shape", f"spectral_ns3d is 3-D; got a {len(shape)}-D grid {shape}")
    if params is not None and params.length.shape != (3,):
        raise ConfigError(
            "grid.length", f"a 3-D grid needs 3 box sizes, got {params.length.shape[0]}"
        )
    return shape


def dealias_mask(ops) -> jax.Array:
    """2/3 rule on the (local) Fourier data: bool, broadcastable to the Fourier block."""
    n = _check(None, ops)
    return (
        (3 * jnp.abs(ops.freq(0)) < n[0])
        & (3 * jnp.abs(ops.freq(1)) < n[1])
        & (3 * jnp.abs(ops.freq(2)) < n[2])
    )


class _Symbols(NamedTuple):
    k: tuple  # 3 x (broadcastable) wavenumbers 2 pi m_a / L_a, 1/length
    k2: jax.Array  # |k|^2 on the Fourier block
    inv_k2: jax.Array  # 1 / |k|^2, 0 at k = 0
    mask: jax.Array  # dealiasing, bool


def _symbols(params: Params, ops) -> _Symbols:
    _check(params, ops)
    dtype = params.nu.dtype
    k = tuple(ops.freq(a).astype(dtype) * (2 * math.pi / params.length[a]) for a in range(3))
    k2 = k[0] * k[0] + k[1] * k[1] + k[2] * k[2]
    zero = k2 == 0
    return _Symbols(k, k2, jnp.where(zero, 0, 1 / jnp.where(zero, 1, k2)), dealias_mask(ops))


def _real(x):
    return jnp.real(x) if jnp.iscomplexobj(x) else x


def _project(v, s: _Symbols):
    """``P(k) v``: the divergence-free part of ``(3, ...)`` Fourier coefficients."""
    div = s.k[0] * v[0] + s.k[1] * v[1] + s.k[2] * v[2]
    return jnp.stack([v[a] - s.k[a] * (div * s.inv_k2) for a in range(3)])


def _curl(v, s: _Symbols):
    """``i k x v`` for ``(3, ...)`` Fourier coefficients."""
    kx, ky, kz = s.k
    return 1j * jnp.stack([ky * v[2] - kz * v[1], kz * v[0] - kx * v[2], kx * v[1] - ky * v[0]])


def to_state(u: jax.Array, params: Params, ops) -> jax.Array:
    """Velocity on the grid ``(3, N_x, N_y, N_z)`` (or its block / sharded array, real,
    length/time) -> the state ``u_hat``: transformed, projected onto divergence-free fields,
    truncated by the 2/3 rule. Complex ``(3, *fourier block)``. A float64 NumPy ``u`` with
    64-bit JAX off raises ``ConfigError`` (``simpar.precision``)."""
    precision.require_input(u, "spectral_ns3d.to_state(u)")
    s = _symbols(params, ops)
    return jnp.where(s.mask, _project(ops.forward(u), s), 0)


def to_physical(u_hat: jax.Array, ops) -> jax.Array:
    """The state -> velocity on the grid, ``(3, *real block)`` real, length/time."""
    return _real(ops.inverse(u_hat))


def vorticity(u_hat: jax.Array, params: Params, ops) -> jax.Array:
    """``curl u`` on the grid, ``(3, *real block)`` real, 1/time."""
    return _real(ops.inverse(_curl(u_hat, _symbols(params, ops))))


def forcing_hat(params: Params, ops) -> jax.Array:
    """Fourier coefficients of ``f_x = F sin(k_f y)`` (``k_f = 2 pi n_f / L_y``), the x component
    only: complex, broadcastable to the Fourier block; ``N_x N_y N_z`` times length/time^2."""
    n = _check(params, ops)
    dtype = params.nu.dtype
    n_f = params.forcing_wavenumber
    my = ops.freq(1).astype(dtype)
    on_axis = (ops.freq(0) == 0) & (ops.freq(2) == 0) & dealias_mask(ops)
    # sin(k y) = (e^{iky} - e^{-iky}) / 2i: -i N / 2 at m_y = +n_f, +i N / 2 at -n_f (y is
    # never the half axis of a real 3-D transform, so both are stored)
    sign = jnp.where(my == n_f, -1.0, 0.0) + jnp.where(my == -n_f, 1.0, 0.0)
    amp = params.forcing_amplitude * (math.prod(n) / 2)
    return jnp.where(on_axis, 1j * sign * amp, 0)


def _nonlinear_hat(u_hat, s: _Symbols, ops):
    """Truncated, projected ``u x omega`` (2 transform calls)."""
    fields = _real(ops.inverse(jnp.concatenate([u_hat, _curl(u_hat, s)])))
    u, w = fields[:3], fields[3:]
    cross = jnp.stack(
        [u[1] * w[2] - u[2] * w[1], u[2] * w[0] - u[0] * w[2], u[0] * w[1] - u[1] * w[0]]
    )
    return jnp.where(s.mask, _project(ops.forward(cross), s), 0)


def step(u_hat: jax.Array, params: Params, ops, scheme: str = "ifrk4") -> jax.Array:
    """One time step ``dt``.

    Args:
      u_hat: state, complex ``(3, *fourier block)`` (from :func:`to_state`).
      params: :class:`simpar.grid.spectral_ns.Params` with ``length`` of 3 entries.
      ops: transforms of a 3-D grid (``simpar.parallel.fft.make_ops``).
      scheme: ``"ifrk4"`` or ``"rk4"`` (static).

    Returns:
      The state after ``dt``, same shape, dtype and layout.

    Raises:
      ConfigError: unknown ``physics.scheme``; ``ops`` not 3-D or ``length`` not 3 entries.
    """
    s = _symbols(params, ops)
    fx = forcing_hat(params, ops)
    force = jnp.stack([fx, jnp.zeros_like(fx), jnp.zeros_like(fx)])
    lin = -params.nu * s.k2 - params.drag

    def nonlinear(v):
        return _nonlinear_hat(v, s, ops) + force

    return time_step(u_hat, lin, nonlinear, params.dt, scheme)


def advance(u_hat: jax.Array, params: Params, ops, n: int, scheme: str = "ifrk4") -> jax.Array:
    """``n`` steps in one ``lax.fori_loop`` (``n`` may be traced); see :func:`step`."""
    return lax.fori_loop(0, n, lambda _, u: step(u, params, ops, scheme), u_hat)


def _parseval_weight(ops, dtype):
    if not ops.real:
        return jnp.ones((1, 1, 1), dtype)
    mz = ops.freq(2)
    return jnp.where((mz == 0) | (2 * mz == ops.shape[2]), 1, 2).astype(dtype)


def n_shells(ops) -> int:
    """Number of energy-spectrum shells: ``max(N) // 2 + 1`` (static)."""
    return max(_check(None, ops)) // 2 + 1


def diagnostics(u_hat: jax.Array, params: Params, ops, comm=None) -> dict:
    """Energy, enstrophy, helicity, energy spectrum, divergence and largest speed of a state.

    Args:
      u_hat: state (block or global array), as in :func:`step`.
      params: :class:`simpar.grid.spectral_ns.Params` (3 box sizes).
      ops: the transforms ``u_hat`` is laid out for.
      comm: ``psum``/``pmax`` over all devices under ``pmap``/``shard_map``
        (``simpar.parallel.fft.grid_comm``); ``None`` for global arrays.

    Returns:
      dict of real arrays (identical on every device): ``energy`` ``<|u|^2> / 2``
      (length^2/time^2), ``enstrophy`` ``<|omega|^2> / 2`` (1/time^2), ``helicity``
      ``<u . omega>`` (length/time^2), ``spectrum`` ``(n_shells(ops),)`` energy per shell
      ``|k| / k_0`` rounded, ``k_0 = 2 pi / max(L)`` (sums to ``energy``), ``divergence_bound``
      ``sum |k . u_hat| / N >= max |div u|`` (1/time; round-off for a valid state),
      ``max_speed`` (length/time) and ``cfl`` ``dt sum_a max|u_a| / dx_a``.
    """
    n = _check(params, ops)
    psum = (lambda x: x) if comm is None else comm.psum
    pmax = (lambda x: x) if comm is None else comm.pmax
    s = _symbols(params, ops)
    dtype = params.nu.dtype
    norm = _parseval_weight(ops, dtype) / (2.0 * math.prod(n) ** 2)
    e_modes = norm * jnp.sum(jnp.abs(u_hat) ** 2, axis=0)
    w_hat = _curl(u_hat, s)
    helic = 2 * norm * jnp.real(jnp.sum(jnp.conj(u_hat) * w_hat, axis=0))
    nb = n_shells(ops)
    k0 = 2 * math.pi / jnp.max(params.length)
    shell = jnp.floor(jnp.sqrt(s.k2) / k0 + 0.5).astype(jnp.int32)
    shell = jnp.minimum(jnp.broadcast_to(shell, e_modes.shape), nb - 1)
    sums = psum(jnp.stack([jnp.sum(e_modes), jnp.sum(s.k2 * e_modes), jnp.sum(helic)]))
    spectrum = psum(jax.ops.segment_sum(e_modes.ravel(), shell.ravel(), num_segments=nb))
    div = s.k[0] * u_hat[0] + s.k[1] * u_hat[1] + s.k[2] * u_hat[2]
    # |div u| on the grid <= sum |coefficients| / N (a bound that is exact for one mode)
    div_bound = psum(jnp.sum(jnp.abs(div) * (2 * norm * math.prod(n))))
    u = to_physical(u_hat, ops)
    amax = pmax(jnp.max(jnp.abs(u), axis=(1, 2, 3)))
    speed = pmax(jnp.max(jnp.sqrt(jnp.sum(u * u, axis=0))))
    dx = params.length / jnp.asarray(n, dtype)
    return {
        "energy": sums[0],
        "enstrophy": sums[1],
        "helicity": sums[2],
        "spectrum": spectrum,
        "divergence_bound": div_bound,
        "max_speed": speed,
        "cfl": params.dt * jnp.sum(amax / dx),
    }


# -- initial fields (host side, global arrays) -------------------------------------------------


def _grid(shape, length):
    return np.meshgrid(
        *[np.arange(n) * (float(L) / n) for n, L in zip(shape, length, strict=True)],
        indexing="ij",
        sparse=True,
    )


def abc_flow(
    shape: Sequence[int],
    a: float = 1.0,
    b: float = 0.7,
    c: float = 0.4,
    nu: float = 0.0,
    t: float = 0.0,
    dtype=np.float64,
) -> np.ndarray:
    """Arnold-Beltrami-Childress flow in a ``2 pi`` cube, an exact Navier-Stokes solution.

    ``u = (A sin z + C cos y, B sin x + A cos z, C sin y + B cos x) exp(-nu t)``: ``curl u = u``,
    so ``u x omega = 0`` and only viscosity acts.

    Returns:
      ``(3, N_x, N_y, N_z)`` NumPy array of ``dtype``, length/time.
    """
    x, y, z = _grid(shape, (2 * math.pi,) * 3)
    g = math.exp(-nu * t)
    u = [
        a * np.sin(z) + c * np.cos(y),
        b * np.sin(x) + a * np.cos(z),
        c * np.sin(y) + b * np.cos(x),
    ]
    return (np.stack([np.broadcast_to(v, tuple(shape)) for v in u]) * g).astype(dtype)


def taylor_green(
    shape: Sequence[int],
    length: Sequence = (2 * math.pi,) * 3,
    amplitude: float = 1.0,
    dtype=np.float64,
) -> np.ndarray:
    """The 3-D Taylor-Green vortex, ``u = U (sin x cos y cos z, -cos x sin y cos z, 0)`` (in
    units ``2 pi / L_a`` per axis; divergence-free when ``L_x = L_y``, else :func:`to_state`
    projects it): the classic transition test. Returns ``(3, N_x, N_y, N_z)`` NumPy array of ``dtype``, length/time."""
    x, y, z = _grid(shape, length)
    kx, ky, kz = (2 * math.pi / float(L) for L in length)
    u = amplitude * np.sin(kx * x) * np.cos(ky * y) * np.cos(kz * z)
    v = -amplitude * np.cos(kx * x) * np.sin(ky * y) * np.cos(kz * z)
    return np.stack([u, v, np.zeros_like(u)]).astype(dtype)


__all__ = [
    "abc_flow",
    "advance",
    "dealias_mask",
    "diagnostics",
    "forcing_hat",
    "n_shells",
    "step",
    "taylor_green",
    "to_physical",
    "to_state",
    "vorticity",
]
