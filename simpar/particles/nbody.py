"""Gravitational N-body physics: softened all-pairs gravity, leapfrog, Plummer sphere.

Contract: every function here is pure and knows nothing about devices. The force kernel
works on one *block* of targets against one block of sources, so the same kernel serves
the single-device all-pairs sum (targets = sources = everything), the ring algorithm of
``simpar.parallel.ring`` (targets = the local block, sources = the block that is passing
by) and the ``sharded`` engine (global arrays, partitioned by XLA). The per-block programs
(init, run, observables) are written once against a ``Ring`` (sum a pair kernel over every
source block, sum over blocks); :func:`make_engine` hands them to
``simpar.parallel.ring.make_ring_engine``, which maps them over the devices.

Units: N-body (Henon) units are the convention for the Plummer sphere (G = M = 1,
total energy E = -1/4, virial radius 1); the kernels accept any consistent units through
``G``. Softening is Plummer softening: the pair potential is
``-G m_i m_j / sqrt(r^2 + eps^2)``.

Shapes: ``N`` particles in 3-D; positions and velocities ``(N, 3)``, masses ``(N,)``, all
of one floating dtype (pass it explicitly; float64 needs ``jax_enable_x64``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simpar import precision
from simpar.parallel.mapping import kind
from simpar.parallel.ring import RingEngine, RingKernels, check_layout, make_ring_engine

Array = jax.Array


class NBodyState(NamedTuple):
    """State of an N-body system (one block of it under the parallel engines).

    Attributes:
      pos: (N, 3) float, positions [length].
      vel: (N, 3) float, velocities [length / time].
      acc: (N, 3) float, accelerations at ``pos`` [length / time^2]; carried so that a
        kick-drift-kick step costs one force evaluation.
      mass: (N,) float, masses [mass]; zero-mass particles feel forces but exert none.
    """

    pos: Array
    vel: Array
    acc: Array
    mass: Array


class NBodyParams(NamedTuple):
    """Numbers a user may sweep or differentiate (array leaves; changing them never
    recompiles).

    Attributes:
      dt: () float, time step [time].
      G: () float, gravitational constant [length^3 / (mass time^2)].
      eps: () float, Plummer softening length [length]; 0 means no softening.
    """

    dt: Array
    G: Array
    eps: Array


def make_params(dt: float, G: float = 1.0, eps: float = 0.0, dtype=None) -> NBodyParams:
    """``NBodyParams`` with scalar leaves of ``dtype``.

    Args:
      dt: time step [time].
      G: gravitational constant.
      eps: Plummer softening length [length].
      dtype: float dtype of the leaves; None: JAX's default float (``simpar.precision``).
    """
    dtype = precision.resolve(dtype)
    return NBodyParams(
        dt=jnp.asarray(dt, dtype), G=jnp.asarray(G, dtype), eps=jnp.asarray(eps, dtype)
    )


def _pair_terms(targets_pos: Array, sources_pos: Array, eps: Array):
    """Separation components and softened inverse distances for all target/source pairs.

    Components are kept as three ``(n_t, n_s)`` arrays (structure of arrays): a trailing
    axis of length 3 vectorises badly on CPUs (measured 2-4x slower).

    Returns:
      (dx, dy, dz): (n_t, n_s) each, ``sources - targets``.
      inv_r: (n_t, n_s) ``1 / sqrt(|d|^2 + eps^2)``, set to 0 where ``|d| = 0`` (a
        particle with itself, or two particles at exactly the same place).
    """
    d = tuple(sources_pos[None, :, k] - targets_pos[:, k, None] for k in range(3))
    r2_raw = d[0] * d[0] + d[1] * d[1] + d[2] * d[2]
    r2 = r2_raw + eps * eps
    self_pair = r2_raw == 0
    # Double-where keeps gradients finite through the excluded pairs.
    safe = jnp.where(self_pair, jnp.ones_like(r2), r2)
    inv_r = jnp.where(self_pair, jnp.zeros_like(r2), jax.lax.rsqrt(safe))
    return d, inv_r


def _over_target_blocks(fn: Callable[[Array], Array], targets_pos: Array, block: int | None):
    """``fn(targets_pos)`` evaluated ``block`` targets at a time (``lax.map``).

    Keeps the ``(block, n_s)`` pair arrays in cache on CPUs (measured ~3x faster at
    N = 4096 with block 64); each target's sum over sources is unchanged. Targets are
    padded to a multiple of ``block`` and the padding is dropped from the result.
    """
    n_t = targets_pos.shape[0]
    if block is None or n_t <= block:
        return fn(targets_pos)
    n_blocks = -(-n_t // block)
    padded = jnp.pad(targets_pos, ((0, n_blocks * block - n_t), (0, 0)))
    out = jax.lax.map(fn, padded.reshape(n_blocks, block, 3))
    return out.reshape((n_blocks * block,) + out.shape[2:])[:n_t]


def accelerations(
    targets_pos: Array,
    sources_pos: Array,
    sources_mass: Array,
    G: Array,
    eps: Array,
    *,
    target_block: int | None = None,
) -> Array:
    """Softened gravitational acceleration of targets due to sources.

    ``a_i = G sum_j m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^(3/2)``. Pairs at zero
    separation (a particle with itself) contribute nothing, so the targets may be among
    the sources.

    Args:
      targets_pos: (n_t, 3) float, target positions [length].
      sources_pos: (n_s, 3) float, source positions [length].
      sources_mass: (n_s,) float, source masses [mass].
      G: () float, gravitational constant.
      eps: () float, softening length [length].
      target_block: evaluate this many targets at a time (static; None: all at once).
        A performance setting only: 64 suits CPUs, None suits GPUs.

    Returns:
      (n_t, 3) float, accelerations [length / time^2], dtype of ``targets_pos``.
    """

    def dense(t):
        (dx, dy, dz), inv_r = _pair_terms(t, sources_pos, eps)
        w = sources_mass[None, :] * inv_r * inv_r * inv_r
        return G * jnp.stack(
            [jnp.sum(dx * w, axis=1), jnp.sum(dy * w, axis=1), jnp.sum(dz * w, axis=1)],
            axis=1,
        )

    return _over_target_blocks(dense, targets_pos, target_block)


def potentials(
    targets_pos: Array,
    sources_pos: Array,
    sources_mass: Array,
    G: Array,
    eps: Array,
    *,
    target_block: int | None = None,
) -> Array:
    """Softened gravitational potential at the targets due to the sources.

    ``phi_i = -G sum_{j, x_j != x_i} m_j / sqrt(|x_j - x_i|^2 + eps^2)``. Pairs at zero
    separation are excluded (this is how the self term is left out; two distinct
    particles at exactly the same position would also be left out).

    Args:
      targets_pos: (n_t, 3) float [length].
      sources_pos: (n_s, 3) float [length].
      sources_mass: (n_s,) float [mass].
      G: () float.
      eps: () float [length].
      target_block: as for ``accelerations``.

    Returns:
      (n_t,) float, potentials [length^2 / time^2].
    """

    def dense(t):
        _, inv_r = _pair_terms(t, sources_pos, eps)
        return -G * jnp.sum(sources_mass[None, :] * inv_r, axis=1)

    return _over_target_blocks(dense, targets_pos, target_block)


@jax.jit
def potential_energy(pos: Array, mass: Array, G: Array, eps: Array) -> Array:
    """Total potential energy ``W = 1/2 sum_i m_i phi_i`` of a whole system.

    Args:
      pos: (N, 3) float [length].
      mass: (N,) float [mass].
      G, eps: () float.

    Returns:
      () float [energy].
    """
    return 0.5 * jnp.sum(mass * potentials(pos, pos, mass, G, eps))


def leapfrog_step(
    state: NBodyState, dt: Array, accel_fn: Callable[[Array, Array], Array]
) -> NBodyState:
    """One kick-drift-kick (velocity Verlet) step; one call of ``accel_fn``.

    Symplectic and time-reversible: the energy error stays bounded (no drift) and the
    total momentum is conserved to round-off when ``accel_fn`` is antisymmetric pairwise.

    Args:
      state: the current state; ``state.acc`` must be ``accel_fn(state.pos, state.mass)``.
      dt: () float, time step.
      accel_fn: ``(pos (n, 3), mass (n,)) -> acc (n, 3)``; for a block under a parallel
        engine it performs the ring exchange itself.

    Returns:
      The state one step later.
    """
    vel_half = state.vel + 0.5 * dt * state.acc
    pos = state.pos + dt * vel_half
    acc = accel_fn(pos, state.mass)
    vel = vel_half + 0.5 * dt * acc
    return NBodyState(pos=pos, vel=vel, acc=acc, mass=state.mass)


class Observables(NamedTuple):
    """Conserved quantities and diagnostics of a whole system (or, before a ``psum``,
    the additive contributions of one block).

    Attributes:
      kinetic: () float, ``1/2 sum m v^2`` [energy].
      potential: () float, ``1/2 sum m phi`` [energy].
      momentum: (3,) float, ``sum m v``.
      angular_momentum: (3,) float, ``sum m x cross v``.
    """

    kinetic: Array
    potential: Array
    momentum: Array
    angular_momentum: Array

    @property
    def total(self) -> Array:
        """Total energy ``kinetic + potential``."""
        return self.kinetic + self.potential

    @property
    def virial_ratio(self) -> Array:
        """``kinetic / |potential|``; 0.5 in virial equilibrium."""
        return self.kinetic / jnp.abs(self.potential)


def block_observables(pos: Array, vel: Array, mass: Array, phi: Array) -> Observables:
    """Additive observables of a block given the potential ``phi`` at its particles.

    Summing the results of all blocks (``psum``) gives the whole system's values.

    Args:
      pos, vel: (n, 3) float.
      mass: (n,) float.
      phi: (n,) float, potential at each particle due to *all* particles.

    Returns:
      ``Observables`` of the block.
    """
    return Observables(
        kinetic=0.5 * jnp.sum(mass * jnp.sum(vel * vel, axis=-1)),
        potential=0.5 * jnp.sum(mass * phi),
        momentum=jnp.sum(mass[:, None] * vel, axis=0),
        angular_momentum=jnp.sum(mass[:, None] * jnp.cross(pos, vel), axis=0),
    )


@jax.jit
def observables(state: NBodyState, G: Array, eps: Array) -> Observables:
    """Observables of a whole system on one device (all-pairs potential).

    Args:
      state: whole-system state.
      G, eps: () float.

    Returns:
      ``Observables``.
    """
    phi = potentials(state.pos, state.pos, state.mass, G, eps)
    return block_observables(state.pos, state.vel, state.mass, phi)


def init_state(pos: Array, vel: Array, mass: Array, G: Array, eps: Array, dtype=None) -> NBodyState:
    """Whole-system state with the initial accelerations computed (single device).

    Args:
      pos, vel: (N, 3) positions and velocities.
      mass: (N,) masses.
      G, eps: () gravitational constant and softening.
      dtype: floating dtype of the state (default: that of ``pos``).
    """
    dtype = dtype or jnp.asarray(pos).dtype
    pos, vel, mass = (jnp.asarray(a, dtype) for a in (pos, vel, mass))
    acc = jax.jit(accelerations)(pos, pos, mass, jnp.asarray(G, dtype), jnp.asarray(eps, dtype))
    return NBodyState(pos=pos, vel=vel, acc=acc, mass=mass)


def plummer_sphere(
    n: int, seed: int, dtype=np.float64, r_max: float = 10.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Equal-mass Plummer sphere (Aarseth, Henon & Wielen 1974) in N-body units.

    Radii from the inverted cumulative mass ``r = (X^(-2/3) - 1)^(-1/2)`` (scale length 1,
    redrawn beyond ``r_max`` scale lengths); isotropic directions; speeds ``v = q v_esc``
    with ``q`` drawn by von Neumann rejection from ``g(q) = q^2 (1 - q^2)^(7/2)``
    (``max g < 0.1``). Then scaled to N-body units (G = M = 1, E = -1/4: lengths by
    ``3 pi / 16``, velocities by ``sqrt(16 / (3 pi))``), and the centre of mass is put at
    rest at the origin. The virial ratio ``T / |W|`` is 0.5 up to sampling noise
    (no rescaling is applied).

    Args:
      n: number of particles (>= 2).
      seed: seed of ``numpy.random.default_rng``; the same seed gives the same sphere.
      dtype: NumPy floating dtype of the returned arrays.
      r_max: truncation radius in Plummer scale lengths.

    Returns:
      pos (n, 3), vel (n, 3), mass (n,) with ``mass = 1 / n``.
    """
    if n < 2:
        raise ValueError(f"a Plummer sphere needs n >= 2 particles, got {n}")
    rng = np.random.default_rng(seed)
    # Radii, with redraws beyond r_max (vectorised, deterministic for a seed).
    r = np.empty(n)
    filled = 0
    while filled < n:
        x = rng.uniform(0.0, 1.0, n - filled)
        with np.errstate(divide="ignore"):
            cand = 1.0 / np.sqrt(x ** (-2.0 / 3.0) - 1.0)
        cand = cand[np.isfinite(cand) & (cand <= r_max)]
        r[filled : filled + cand.size] = cand
        filled += cand.size

    def isotropic(radius: np.ndarray) -> np.ndarray:
        cos_t = rng.uniform(-1.0, 1.0, radius.size)
        phi = rng.uniform(0.0, 2.0 * np.pi, radius.size)
        sin_t = np.sqrt(1.0 - cos_t**2)
        return radius[:, None] * np.stack([sin_t * np.cos(phi), sin_t * np.sin(phi), cos_t], axis=1)

    pos = isotropic(r)
    # Speeds: q from g(q) = q^2 (1 - q^2)^3.5 by rejection.
    q = np.empty(n)
    filled = 0
    while filled < n:
        m = 2 * (n - filled) + 16
        x4 = rng.uniform(0.0, 1.0, m)
        x5 = rng.uniform(0.0, 1.0, m)
        acc = x4[0.1 * x5 < x4**2 * (1.0 - x4**2) ** 3.5][: n - filled]
        q[filled : filled + acc.size] = acc
        filled += acc.size
    v_esc = np.sqrt(2.0) * (1.0 + r**2) ** -0.25
    vel = isotropic(q * v_esc)
    pos *= 3.0 * np.pi / 16.0
    vel *= np.sqrt(16.0 / (3.0 * np.pi))
    mass = np.full(n, 1.0 / n)
    pos -= np.average(pos, axis=0, weights=mass)
    vel -= np.average(vel, axis=0, weights=mass)
    return pos.astype(dtype), vel.astype(dtype), mass.astype(dtype)


# ------------------------------------------------ per-block programs and the engines


def _block_init(pos, vel, mass, params: NBodyParams, *, ring, tb) -> NBodyState:
    """The state of one block with its accelerations due to every block (``ring``: see
    ``simpar.parallel.ring.Ring``; ``tb``: the kernel tiling)."""

    def kernel(t, sp, sm):
        return accelerations(t, sp, sm, params.G, params.eps, target_block=tb)

    return NBodyState(pos=pos, vel=vel, acc=ring.over_sources(kernel, pos, pos, mass), mass=mass)


def _block_observe(state: NBodyState, params: NBodyParams, *, ring, tb) -> Observables:
    """Whole-system observables from one block (potentials over every block, then a sum)."""

    def kernel(t, sp, sm):
        return potentials(t, sp, sm, params.G, params.eps, target_block=tb)

    phi = ring.over_sources(kernel, state.pos, state.pos, state.mass)
    return ring.total(block_observables(state.pos, state.vel, state.mass, phi))


def _block_run(state: NBodyState, params: NBodyParams, n_steps, *, ring, tb):
    """``n_steps`` (traced) leapfrog steps of one block, then the whole system's observables."""

    def accel_fn(pos, mass):
        def kernel(t, sp, sm):
            return accelerations(t, sp, sm, params.G, params.eps, target_block=tb)

        return ring.over_sources(kernel, pos, pos, mass)

    state = jax.lax.fori_loop(0, n_steps, lambda _, s: leapfrog_step(s, params.dt, accel_fn), state)
    return state, _block_observe(state, params, ring=ring, tb=tb)


def kernels(target_block: int | None = None) -> RingKernels:
    """The N-body per-block programs handed to ``simpar.parallel.ring.make_ring_engine``.

    Args:
      target_block: kernel tiling (see :func:`accelerations`), static.
    """
    return RingKernels(
        init=functools.partial(_block_init, tb=target_block),
        run=functools.partial(_block_run, tb=target_block),
        observe=functools.partial(_block_observe, tb=target_block),
    )


def default_target_block(engine: str) -> int | None:
    """Kernel tiling for ``engine`` on the default backend: 64 targets at a time on CPU
    (cache-sized pair arrays, ~3x faster), whole blocks elsewhere (GPUs want one big
    parallel kernel). The ``sharded`` engine keeps the untiled kernel so that XLA can
    partition it (a sequential loop over a sharded axis would not be)."""
    if kind(engine).partitioned or jax.default_backend() != "cpu":
        return None
    return 64


def make_engine(
    engine: str, n_devices: int = 1, target_block: int | None | str = "auto"
) -> RingEngine:
    """The N-body programs of one engine on the first ``n_devices`` devices (cached).

    ``init``/``run``/``observables`` take and give device state (``NBodyState`` in the
    engine's layout); ``run`` returns ``Observables`` of the whole system; ``fetch`` gives an
    ``NBodyState`` of NumPy ``(N, ...)`` arrays (see ``simpar.parallel.ring.RingEngine``).

    Args:
      engine: one of ``simpar.parallel.blocks.ENGINES``.
      n_devices: ring size; must be 1 for ``single``.
      target_block: kernel tiling (:func:`accelerations`); "auto" picks
        ``default_target_block(engine)``. Changing it recompiles.

    Raises:
      ConfigError: unknown engine or too many devices.
    """
    check_layout(n_devices, engine, n_devices)
    if target_block == "auto":
        target_block = default_target_block(engine)
    return _make_engine(engine, n_devices, target_block)


@functools.cache
def _make_engine(engine: str, n_devices: int, tb: int | None) -> RingEngine:
    return make_ring_engine(engine, n_devices, kernels(tb))


def nbody_run(
    state: NBodyState,
    params: NBodyParams,
    n_steps: int,
    engine: str = "single",
    n_devices: int = 1,
) -> tuple[NBodyState, Observables]:
    """Run ``n_steps`` leapfrog steps of a whole system on one engine, in one dispatch.

    The accelerations are recomputed by the engine from ``state.pos`` first (one extra
    force evaluation; ``state.acc`` is ignored). For chunked runs that keep the state on
    the devices, use ``make_engine(engine, n_devices)`` directly.

    Args:
      state: whole-system state, arrays (N, 3) / (N,) of one floating dtype.
      params: time step, G and softening (cast to the state's dtype).
      n_steps: number of steps (>= 0); 0 returns the engine's forces at ``state.pos``.
      engine: one of ``simpar.parallel.blocks.ENGINES``.
      n_devices: ring size (1 for ``single``); must divide N.

    Returns:
      (final state as NumPy arrays, observables of the final state as NumPy values).

    Raises:
      ConfigError: unknown engine, too many devices, or N not divisible by n_devices.
    """
    check_layout(len(state.mass), engine, n_devices)
    eng = make_engine(engine, n_devices)
    dstate = eng.init(state.pos, state.vel, state.mass, params)
    dstate, obs = eng.run(dstate, params, n_steps)
    return eng.fetch(dstate), Observables(*(np.asarray(o) for o in obs))
