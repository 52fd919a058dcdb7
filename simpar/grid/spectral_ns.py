"""Pseudo-spectral 2-D incompressible Navier-Stokes (vorticity-streamfunction), any engine.

Equations on a periodic box ``L_x x L_y`` (``x`` along array axis 0, ``y`` along axis 1)::

    d(omega)/dt + u . grad(omega) = nu lap(omega) - mu omega + curl(f),
    lap(psi) = -omega,   u = d(psi)/dy,   v = -d(psi)/dx,

with kinematic viscosity ``nu`` (length^2/time), linear drag ``mu`` (1/time) and the optional
Kolmogorov body force ``f = (F sin(k_f y), 0)``, ``k_f = 2 pi n_f / L_y`` (its curl is
``-F k_f cos(k_f y)``).

**Space.** Fourier-Galerkin with the 2/3 rule: the state keeps only the modes with
``3 |m_a| < N_a`` on both axes (``m`` integer frequencies), and the advection term
``-(u d(omega)/dx + v d(omega)/dy)`` is computed on the grid from the four fields ``u, v,
d(omega)/dx, d(omega)/dy`` and truncated to the same modes. Products of two such fields are
then free of aliasing, so the truncated system conserves energy and enstrophy exactly in its
nonlinear term (only viscosity, drag and forcing change them).

**State.** The vorticity's Fourier coefficients ``omega_hat = ops.forward(omega)`` (unnormalised
``rfftn``/``fftn``), complex, in the Fourier layout of the transforms ``ops`` (see
``simpar.parallel.fft``): one block per device under ``pmap``/``shard_map``, a global array
under ``single``/``sharded``. Every multiplier (wavenumbers, mask, forcing) is built from
``ops.freq(axis)`` where the data sit, so nothing is transposed back between steps. Measured
on a 32x64 grid, ``sharded`` (2, 4) mesh (``tests/test_spectral_ns.py``): one RK4 step is
8 transform calls (per stage one batched inverse of ``u, v, omega_x, omega_y`` and one forward
of the advection term) = 24 all-to-alls; a physical-space state needs a forward at the start
and an inverse at the end of every step as well, 10 calls = 30 all-to-alls (25% more).

**Time.** ``"ifrk4"`` (default): integrating-factor RK4 (Lawson), the linear term
``L = -nu |k|^2 - mu`` integrated exactly by ``exp(L dt)``, RK4 for advection and forcing:
a Fourier mode the nonlinear term does not touch (Taylor-Green) decays exactly, and the
error is 4th order in ``dt``. ``"rk4"``: classical RK4 on the whole right-hand side (stable
for ``nu |k_max|^2 dt < 2.78``).

No device code here: transforms come in as ``ops`` (``simpar.parallel.fft.make_ops`` or
``simpar.grid.poisson.local_ops``), global reductions in diagnostics as a ``comm`` with
``psum``/``pmax`` (``simpar.parallel.fft.grid_comm`` under ``pmap``/``shard_map``; ``None``
for global arrays). Initial fields are built on the host as global real arrays (the engine
lays them out like any grid model's initial field); :func:`to_state` transforms them.
The 3-D velocity form is ``simpar.grid.spectral_ns3d`` (same ``Params`` and integrators).
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

SCHEMES = ("ifrk4", "rk4")


class Params(NamedTuple):
    """Physical and numerical parameters; every field a 0-d real array (a pytree leaf, so
    ``jax.grad`` and ``jax.vmap`` pass through a run) except ``length``.

    Attributes:
      nu: kinematic viscosity, length^2/time.
      dt: time step, time.
      drag: linear drag ``mu``, 1/time.
      forcing_amplitude: Kolmogorov force ``F``, length/time^2 (0: unforced).
      forcing_wavenumber: ``n_f``, the force's wavenumber in units of ``2 pi / L_y``
        (an integer value held as a float).
      length: ``(d,)`` box size ``(L_x, L_y[, L_z])``, length (``d = 3``: the 3-D velocity
        form, ``simpar.grid.spectral_ns3d``).
    """

    nu: jax.Array
    dt: jax.Array
    drag: jax.Array
    forcing_amplitude: jax.Array
    forcing_wavenumber: jax.Array
    length: jax.Array


def _concrete(v) -> bool:
    return not isinstance(v, jax.core.Tracer)


def make_params(
    nu,
    dt,
    length: Sequence = (2 * math.pi, 2 * math.pi),
    drag=0.0,
    forcing_amplitude=0.0,
    forcing_wavenumber=4,
    dtype=None,
) -> Params:
    """Validated :class:`Params` (see there for units).

    Args:
      nu, dt, drag, forcing_amplitude, forcing_wavenumber: numbers or 0-d arrays.
      length: ``(L_x, L_y)``, or ``(L_x, L_y, L_z)`` for ``simpar.grid.spectral_ns3d``.
      dtype: real dtype of every leaf (default: JAX's default float). ``"float64"`` with
        64-bit JAX off raises ``ConfigError`` (``simpar.precision``), never a silent float32.

    Raises:
      ConfigError: ``dtype`` float64 with ``jax_enable_x64`` off; ``physics.viscosity`` or ``physics.drag`` negative, ``time.dt`` not
        positive, ``grid.length`` not 2 or 3 positive numbers, ``forcing.wavenumber`` not a
        positive integer (checked on concrete values only; traced values pass through).
    """
    dtype = precision.resolve(dtype, key="dtype")
    checks = (
        ("physics.viscosity", nu, lambda x: x >= 0, "must be >= 0"),
        ("time.dt", dt, lambda x: x > 0, "must be > 0"),
        ("physics.drag", drag, lambda x: x >= 0, "must be >= 0"),
        (
            "forcing.wavenumber",
            forcing_wavenumber,
            lambda x: x >= 1 and float(x) == round(float(x)),
            "must be a positive integer (units of 2 pi / L_y)",
        ),
    )
    for key, value, ok, allowed in checks:
        if _concrete(value) and not (np.isfinite(np.asarray(value)) and ok(np.asarray(value))):
            raise ConfigError(key, f"{allowed}, got {value}")
    if _concrete(length):
        arr = np.asarray(length, dtype=float)
        if arr.shape not in ((2,), (3,)) or not np.all(np.isfinite(arr) & (arr > 0)):
            raise ConfigError("grid.length", f"need 2 or 3 positive box sizes, got {length}")
    leaf = lambda v: jnp.asarray(v, dtype)  # noqa: E731
    return Params(
        leaf(nu),
        leaf(dt),
        leaf(drag),
        leaf(forcing_amplitude),
        leaf(forcing_wavenumber),
        jnp.asarray(length, dtype).reshape(-1),
    )


def _check_ops(ops) -> tuple[int, int]:
    shape = tuple(ops.shape)
    if len(shape) != 2:
        raise ConfigError("grid.shape", f"spectral_ns is 2-D; got a {len(shape)}-D grid {shape}")
    return shape


def dealias_mask(ops) -> jax.Array:
    """The 2/3 rule on the (local) Fourier data: ``True`` where ``3 |m_a| < N_a`` on both axes.

    Returns:
      bool, broadcastable to the Fourier block ``(n_0, n_1)``; ``False`` on the zero padding
      of a real transform's half axis.
    """
    n0, n1 = _check_ops(ops)
    return (3 * jnp.abs(ops.freq(0)) < n0) & (3 * jnp.abs(ops.freq(1)) < n1)


class _Symbols(NamedTuple):
    kx: jax.Array  # (n_0, 1) wavenumber 2 pi m_x / L_x, 1/length
    ky: jax.Array  # (1, n_1)
    k2: jax.Array  # (n_0, n_1) |k|^2
    inv_k2: jax.Array  # 1 / |k|^2, 0 at k = 0
    mask: jax.Array  # dealiasing, bool


def _symbols(params: Params, ops) -> _Symbols:
    _check_ops(ops)
    if params.length.shape != (2,):
        raise ConfigError(
            "grid.length", f"a 2-D grid needs 2 box sizes, got {params.length.shape[0]}"
        )
    dtype = params.nu.dtype
    kx = ops.freq(0).astype(dtype) * (2 * math.pi / params.length[0])
    ky = ops.freq(1).astype(dtype) * (2 * math.pi / params.length[1])
    k2 = kx * kx + ky * ky
    zero = k2 == 0
    inv_k2 = jnp.where(zero, 0, 1 / jnp.where(zero, 1, k2))
    return _Symbols(kx, ky, k2, inv_k2, dealias_mask(ops))


def _real(x):
    return jnp.real(x) if jnp.iscomplexobj(x) else x


def to_state(omega: jax.Array, ops) -> jax.Array:
    """Vorticity on the grid -> the state ``omega_hat`` (Fourier coefficients, 2/3-truncated).

    Args:
      omega: ``(*lead, N_x, N_y)`` (or the block / sharded global array in the real-space
        layout of ``ops``), real, 1/time.

    Returns:
      complex ``(*lead, *fourier block)`` in the Fourier layout of ``ops``.

    Raises:
      ConfigError: ``omega`` is a float64 NumPy array and 64-bit JAX is off.
    """
    precision.require_input(omega, "spectral_ns.to_state(omega)")
    return jnp.where(dealias_mask(ops), ops.forward(omega), 0)


def to_physical(w_hat: jax.Array, ops) -> jax.Array:
    """The state -> vorticity on the grid (real, 1/time, the real-space layout of ``ops``)."""
    return _real(ops.inverse(w_hat))


def velocity_hat(w_hat: jax.Array, params: Params, ops) -> jax.Array:
    """Fourier coefficients of the velocity, ``(2, *block)`` complex: ``u_hat, v_hat``
    (``psi_hat = omega_hat / |k|^2``, ``u = d(psi)/dy``, ``v = -d(psi)/dx``)."""
    s = _symbols(params, ops)
    psi = w_hat * s.inv_k2
    return jnp.stack([1j * s.ky * psi, -1j * s.kx * psi])


def velocity(w_hat: jax.Array, params: Params, ops) -> jax.Array:
    """Velocity on the grid from the state: ``(2, N_x, N_y)`` (or the real-space block) real,
    ``(u, v)``, length/time. One (batched) inverse transform."""
    return _real(ops.inverse(velocity_hat(w_hat, params, ops)))


def forcing_hat(params: Params, ops) -> jax.Array:
    """Fourier coefficients of ``curl(f) = -F k_f cos(k_f y)`` on the (local) Fourier data.

    Returns:
      real, broadcastable to the Fourier block; 1/time^2 times ``N_x N_y`` (unnormalised
      coefficients, like the state). Zero where the 2/3 rule truncates.
    """
    n0, n1 = _check_ops(ops)
    dtype = params.nu.dtype
    n_f = params.forcing_wavenumber
    my = ops.freq(1).astype(dtype)
    # cos(k y) = (e^{i k y} + e^{-i k y}) / 2: N_x N_y / 2 at m = (0, +-n_f); a real transform's
    # half axis holds only +n_f
    hit = (ops.freq(0) == 0) & ((my == n_f) | (my == -n_f)) & dealias_mask(ops)
    k_f = n_f * (2 * math.pi / params.length[1])
    return jnp.where(hit, -params.forcing_amplitude * k_f * (n0 * n1 / 2), 0).astype(dtype)


def _advection_hat(w_hat, s: _Symbols, ops):
    """Truncated Fourier coefficients of ``-(u omega_x + v omega_y)`` (2 transform calls)."""
    psi = w_hat * s.inv_k2
    fields = _real(
        ops.inverse(
            jnp.stack([1j * s.ky * psi, -1j * s.kx * psi, 1j * s.kx * w_hat, 1j * s.ky * w_hat])
        )
    )
    u, v, wx, wy = fields[0], fields[1], fields[2], fields[3]
    return jnp.where(s.mask, ops.forward(-(u * wx + v * wy)), 0)


def step(w_hat: jax.Array, params: Params, ops, scheme: str = "ifrk4") -> jax.Array:
    """One time step ``dt`` of the state.

    Args:
      w_hat: state, complex ``(*fourier block)`` in the Fourier layout of ``ops`` (from
        :func:`to_state`); its dtype sets the precision (complex128 for float64 params).
      params: :class:`Params` (real leaves of the matching precision).
      ops: transforms (``forward``, ``inverse``, ``freq``, ``shape``, ``real``) of a 2-D grid.
      scheme: ``"ifrk4"`` or ``"rk4"`` (static; changing it recompiles).

    Returns:
      The state after ``dt``, same shape, dtype and layout.

    Raises:
      ConfigError: ``physics.scheme`` unknown, or ``ops`` not 2-D.
    """
    s = _symbols(params, ops)
    force = forcing_hat(params, ops)
    lin = -params.nu * s.k2 - params.drag  # (n_0, n_1) real, 1/time
    return time_step(w_hat, lin, lambda w: _advection_hat(w, s, ops) + force, params.dt, scheme)


def time_step(w, lin, nonlinear, dt, scheme: str = "ifrk4"):
    """One step of ``dw/dt = lin * w + nonlinear(w)`` (shared by the 2-D and 3-D forms).

    Args:
      w: state (any shape; complex Fourier coefficients).
      lin: real, broadcastable to ``w``: the linear (viscous + drag) symbol, 1/time.
      nonlinear: ``w -> dw/dt`` without the linear part (same shape as ``w``).
      dt: time step (0-d array), time.
      scheme: ``"ifrk4"``: integrating-factor RK4 (Lawson), ``lin`` exact through
        ``exp(lin dt)``; ``"rk4"``: classical RK4 on the whole right-hand side.

    Raises:
      ConfigError: ``physics.scheme`` unknown.
    """
    if scheme not in SCHEMES:
        raise ConfigError("physics.scheme", f"unknown scheme {scheme!r}; choose one of {SCHEMES}")
    if scheme == "rk4":

        def rhs(v):
            return lin * v + nonlinear(v)

        k1 = rhs(w)
        k2 = rhs(w + (dt / 2) * k1)
        k3 = rhs(w + (dt / 2) * k2)
        k4 = rhs(w + dt * k3)
        return w + (dt / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
    e1 = jnp.exp(lin * (dt / 2))  # integrating factor over half a step
    e2 = e1 * e1
    n1 = nonlinear(w)
    n2 = nonlinear(e1 * (w + (dt / 2) * n1))
    n3 = nonlinear(e1 * w + (dt / 2) * n2)
    n4 = nonlinear(e2 * w + dt * (e1 * n3))
    return e2 * w + (dt / 6) * (e2 * n1 + 2 * e1 * (n2 + n3) + n4)


def advance(w_hat: jax.Array, params: Params, ops, n: int, scheme: str = "ifrk4") -> jax.Array:
    """``n`` steps in one ``lax.fori_loop`` (``n`` may be traced); see :func:`step`."""
    return lax.fori_loop(0, n, lambda _, w: step(w, params, ops, scheme), w_hat)


# -- diagnostics -------------------------------------------------------------------------------


def _parseval_weight(ops, dtype) -> jax.Array:
    """Weight of each stored coefficient in ``sum |f|^2``: 2 on the interior of a real
    transform's half axis (its mirror image is not stored), else 1."""
    n1 = ops.shape[1]
    if not ops.real:
        return jnp.ones((1, 1), dtype)
    my = ops.freq(1)
    return jnp.where((my == 0) | (2 * my == n1), 1, 2).astype(dtype)


def n_shells(ops) -> int:
    """Number of energy-spectrum shells: ``max(N_x, N_y) // 2 + 1`` (static)."""
    return max(_check_ops(ops)) // 2 + 1


def diagnostics(w_hat: jax.Array, params: Params, ops, comm=None) -> dict:
    """Energy, enstrophy, shell-summed energy spectrum and the largest velocity of a state.

    Energy and enstrophy come from the Fourier coefficients (Parseval), so their balance
    ``dE/dt = -2 nu Z - 2 mu E + <u . f>`` is exact for the semi-discrete truncated system.

    Args:
      w_hat: state (block or global array), as in :func:`step`.
      params: :class:`Params`.
      ops: the transforms ``w_hat`` is laid out for.
      comm: under ``pmap``/``shard_map``, an object with ``psum`` and ``pmax`` over all
        devices (``simpar.parallel.fft.grid_comm(plan, engine)``); ``None`` for global arrays
        (``single``, ``sharded``).

    Returns:
      dict of real arrays (identical on every device):

      - ``energy``: ``E = <u^2 + v^2> / 2``, domain mean, length^2/time^2, ``()``.
      - ``enstrophy``: ``Z = <omega^2> / 2``, 1/time^2, ``()``.
      - ``spectrum``: ``(n_shells(ops),)``: energy in shell ``n``, the modes with
        ``n - 1/2 <= |k| / k_0 < n + 1/2``, ``k_0 = 2 pi / max(L_x, L_y)`` (higher ``|k|``,
        in non-square boxes only, go to the last shell); sums to ``energy``.
      - ``max_speed``: ``max |u|`` over the grid, length/time.
      - ``cfl``: ``dt (max|u| / dx + max|v| / dy)``, dimensionless.
    """
    n0, n1 = _check_ops(ops)
    psum = (lambda x: x) if comm is None else comm.psum
    pmax = (lambda x: x) if comm is None else comm.pmax
    s = _symbols(params, ops)
    dtype = params.nu.dtype
    w2 = _parseval_weight(ops, dtype) * (jnp.abs(w_hat) ** 2) / (2.0 * (n0 * n1) ** 2)
    e_modes = w2 * s.inv_k2  # |u_hat|^2 + |v_hat|^2 = |omega_hat|^2 / |k|^2
    nb = n_shells(ops)
    k0 = 2 * math.pi / jnp.max(params.length)
    shell = jnp.floor(jnp.sqrt(s.k2) / k0 + 0.5).astype(jnp.int32)
    shell = jnp.minimum(jnp.broadcast_to(shell, e_modes.shape), nb - 1)
    local = jnp.stack([jnp.sum(w2), jnp.sum(e_modes)])
    spectrum = jax.ops.segment_sum(e_modes.ravel(), shell.ravel(), num_segments=nb)
    enstrophy, energy = psum(local)
    spectrum = psum(spectrum)
    uv = velocity(w_hat, params, ops)
    amax = pmax(jnp.max(jnp.abs(uv), axis=(1, 2)))  # (2,)
    speed = pmax(jnp.max(jnp.sqrt(uv[0] ** 2 + uv[1] ** 2)))
    dx = params.length / jnp.asarray([n0, n1], dtype)
    return {
        "energy": energy,
        "enstrophy": enstrophy,
        "spectrum": spectrum,
        "max_speed": speed,
        "cfl": params.dt * jnp.sum(amax / dx),
    }


def shell_wavenumbers(ops, length: Sequence) -> np.ndarray:
    """Centres ``n k_0`` of the spectrum's shells, ``(n_shells(ops),)`` float64, 1/length."""
    return np.arange(n_shells(ops)) * (2 * math.pi / max(float(v) for v in length))


# -- initial fields (host side, global arrays) -------------------------------------------------


def _grid(shape, length):
    x = np.arange(shape[0]) * (length[0] / shape[0])
    y = np.arange(shape[1]) * (length[1] / shape[1])
    return x[:, None], y[None, :]


def taylor_green(
    shape: Sequence[int],
    length: Sequence = (2 * math.pi, 2 * math.pi),
    wavenumber: int = 1,
    amplitude: float = 1.0,
    nu: float = 0.0,
    t: float = 0.0,
    dtype=np.float64,
) -> np.ndarray:
    """Taylor-Green vortex vorticity, exact solution of the Navier-Stokes equations.

    ``u = U cos(k_x x) sin(k_y y) g``, ``v = -U (k_x / k_y) sin(k_x x) cos(k_y y) g``,
    ``omega = -U (k_x^2 + k_y^2) / k_y cos(k_x x) cos(k_y y) g``, ``g = exp(-nu |k|^2 t)``,
    ``k_a = 2 pi n / L_a`` (``n = wavenumber``); in a ``2 pi`` square box ``|k|^2 = 2 n^2``:
    the decay ``exp(-2 nu n^2 t)``.

    Args:
      shape: ``(N_x, N_y)``; length: ``(L_x, L_y)``; wavenumber: ``n`` (integer, ``3 n <
        min(N)`` to survive the 2/3 rule); amplitude: ``U``, length/time; nu, t: viscosity
        and time of the exact solution.

    Returns:
      ``(N_x, N_y)`` NumPy array of ``dtype``, 1/time.
    """
    x, y = _grid(shape, length)
    kx, ky = (2 * math.pi * wavenumber / float(L) for L in length)
    g = math.exp(-nu * (kx * kx + ky * ky) * t)
    w = -amplitude * (kx * kx + ky * ky) / ky * np.cos(kx * x) * np.cos(ky * y) * g
    return w.astype(dtype)


def random_turbulence(
    shape: Sequence[int],
    length: Sequence = (2 * math.pi, 2 * math.pi),
    seed: int = 0,
    peak_wavenumber: float = 4.0,
    energy: float = 0.5,
    dtype=np.float64,
) -> np.ndarray:
    """Random vorticity for decaying turbulence, reproducible from ``seed`` (NumPy's PCG64).

    Gaussian white noise shaped in Fourier space to the energy spectrum
    ``E(k) ~ k^4 exp(-2 (k / k_p)^2)`` (``k_p = peak_wavenumber * 2 pi / max(L)``), truncated
    by the 2/3 rule, with mean 0 and total energy ``<u^2 + v^2> / 2 = energy``.

    Args:
      shape: ``(N_x, N_y)``.
      length: ``(L_x, L_y)``, length.
      seed: NumPy generator seed (the same field on every machine and engine).
      peak_wavenumber: ``k_p`` in units of ``2 pi / max(L)``.
      energy: mean kinetic energy per unit mass, length^2/time^2.
      dtype: NumPy dtype of the result.

    Returns:
      ``(N_x, N_y)`` NumPy array of ``dtype``, 1/time.
    """
    n0, n1 = (int(n) for n in shape)
    noise = np.random.default_rng(seed).standard_normal((n0, n1))
    wh = np.fft.rfft2(noise)
    mx = np.fft.fftfreq(n0, 1.0 / n0)[:, None]
    my = np.arange(n1 // 2 + 1)[None, :]
    kx, ky = 2 * math.pi * mx / length[0], 2 * math.pi * my / length[1]
    k = np.sqrt(kx * kx + ky * ky)
    kp = peak_wavenumber * 2 * math.pi / max(float(v) for v in length)
    spec = (k / kp) ** 4 * np.exp(-2 * (k / kp) ** 2)
    keep = (3 * np.abs(mx) < n0) & (3 * my < n1) & (k > 0)
    # energy per mode |omega_hat|^2 / (2 k^2) ~ E(k) / k (modes per shell ~ k)
    wh = np.where(keep, wh * np.sqrt(spec * k), 0)
    weight = np.where((my == 0) | (2 * my == n1), 1.0, 2.0)
    e = np.sum(weight * np.abs(wh) ** 2 / np.where(keep, k * k, 1)) / (2.0 * (n0 * n1) ** 2)
    return (np.fft.irfft2(wh * math.sqrt(energy / e), s=(n0, n1))).astype(dtype)


__all__ = [
    "SCHEMES",
    "Params",
    "advance",
    "dealias_mask",
    "diagnostics",
    "forcing_hat",
    "make_params",
    "n_shells",
    "random_turbulence",
    "shell_wavenumbers",
    "step",
    "taylor_green",
    "time_step",
    "to_physical",
    "to_state",
    "velocity",
    "velocity_hat",
]
