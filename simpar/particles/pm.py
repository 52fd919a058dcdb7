"""Particle-mesh (PM) gravity for one block: CIC deposit, periodic Poisson, CIC forces, leapfrog.

The periodic box ``L = (L_0, L_1, L_2)`` carries a grid of ``N_a`` nodes per axis at
``x = i * dx_a`` (``dx_a = L_a / N_a``), split into blocks as the FFT plan splits it in real
space (``simpar.parallel.fft``). A block owns the nodes ``origin_a .. origin_a + n_a - 1`` and
the particles whose wrapped position lies in its sub-box ``[origin_a dx_a, (origin_a + n_a)
dx_a)``; on ``single``/``sharded`` the block is the whole box and holds every particle.

One force evaluation (:func:`accelerations`):

1. **Deposit** (cloud in cell): each particle spreads its mass over the ``2^3`` nodes around it
   with weights ``prod_a (1 - |x_a / dx_a - i_a|)``, into the block padded by one node on each
   side; ``halo.fold`` adds the padding onto the neighbours' blocks (the reverse of the halo
   fill, by ``ppermute``), giving the density ``rho`` (mass / length^3).
2. **Poisson** by the distributed FFT: ``phi_k = -4 pi G rho_k / |k|^2`` with ``rho_0 = 0`` (the
   mean density is removed: a periodic box has no net source).
3. **Gradient** by the 4th-order centred difference ``(8 (phi_{i+1} - phi_{i-1}) - (phi_{i+2} -
   phi_{i-2})) / (12 dx)``, applied in Fourier space (``g_k = -i D(k) phi_k`` with ``D(k) =
   (8 sin(k dx) - sin(2 k dx)) / (6 dx)``, odd, zero at Nyquist; the choice of ``jaxpm``), three
   inverse transforms. (A pure spectral ``i k`` gradient of the unsmoothed Green's function rings:
   it gave repulsive forces along the grid axes at 6 cells.)
4. **Interpolation** (cloud in cell, the same weights): the field is padded by ``halo.pad``
   (forward halo fill) and read at the particles.

The same weights for deposit and interpolation and an odd force kernel make the pair forces
equal and opposite: total momentum is conserved to round-off, and a particle exerts no force on
itself. The mesh softens the force on scales of about two cells.

No collectives here: the ``comm`` (halo exchange), the transforms ``ops`` and the particle
``migrate`` step are passed in by the engine (``simpar.parallel.pm_engine``). Overflows use
the MD error bits and chunk loop (``error_codes``, ``step.run_steps``); the host loop that
regrows and redoes a chunk is ``simpar.particles.pm_sim``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from simpar.grid.boundary import Periodic
from simpar.grid.poisson import eigenvalues
from simpar.parallel import halo
from simpar.particles import error_codes
from simpar.particles.step import run_steps

D = 3  # spatial dimensions


class PMState(NamedTuple):
    """Particles of one block (fixed capacity ``P``; ``P = N`` on ``single``/``sharded``).

    Attributes:
      pos: ``(P, 3)`` float, wrapped positions in ``[0, L)`` (length).
      vel: ``(P, 3)`` float, velocities (length / time).
      mass: ``(P,)`` float, masses (mass; empty slots carry 1 and are masked).
      ids: ``(P,)`` int32, global particle ids; ``-1`` marks an empty slot.
      acc: ``(P, 3)`` float, accelerations at ``pos`` (length / time^2).
    """

    pos: jax.Array
    vel: jax.Array
    mass: jax.Array
    ids: jax.Array
    acc: jax.Array


class PMParams(NamedTuple):
    """Numbers a user may sweep or differentiate (array leaves).

    Attributes:
      dt: time step (time).
      G: gravitational constant (length^3 / (mass time^2)).
    """

    dt: jax.Array
    G: jax.Array


def _origin(comm, block: tuple[int, ...]):
    """First node index of this block per axis (traced int32; 0 on unsplit axes)."""
    return [comm.coord(a) * block[a] if comm.extent(a) > 1 else jnp.int32(0) for a in range(D)]


def _cic(pos, box, shape, block, comm):
    """Padded-block node index ``(P, 3)`` int32 of the lower corner and fractions ``(P, 3)``."""
    origin = _origin(comm, block)
    idx, frac = [], []
    for a in range(D):
        dx = box[a] / shape[a]
        s = pos[:, a] / dx - origin[a].astype(pos.dtype)
        # owned particles have -1 < s < n; round-off at a sub-box face stays inside the pad
        i = jnp.clip(jnp.floor(s), -1, block[a] - 1)
        idx.append(i.astype(jnp.int32) + 1)
        frac.append(jnp.clip(s - i, 0.0, 1.0))
    return jnp.stack(idx, axis=1), jnp.stack(frac, axis=1)


def _corners(idx, frac):
    """For each of the 8 CIC corners: (node indices tuple of ``(P,)`` arrays, weights ``(P,)``)."""
    for off in itertools.product((0, 1), repeat=D):
        w = None
        for a in range(D):
            wa = frac[:, a] if off[a] else 1.0 - frac[:, a]
            w = wa if w is None else w * wa
        yield tuple(idx[:, a] + off[a] for a in range(D)), w


def deposit(pos, mass, valid, box, shape, block, comm) -> jax.Array:
    """Cloud-in-cell mass density of the block's particles on its nodes, halos summed back.

    Args:
      pos: ``(P, 3)`` wrapped positions inside this block's sub-box (length).
      mass: ``(P,)`` masses; valid: ``(P,)`` bool, slots that hold a particle.
      box: ``(3,)`` box lengths ``L``; shape: global grid ``(N_0, N_1, N_2)`` (static).
      block: this block's grid shape ``(n_0, n_1, n_2)`` (static).
      comm: ``LocalComm`` (whole box) or the engine's per-block comm.

    Returns:
      ``block``-shaped density (mass / length^3), same float dtype as ``pos``.
    """
    idx, frac = _cic(pos, box, shape, block, comm)
    m = jnp.where(valid, mass, 0.0).astype(pos.dtype)
    grid = jnp.zeros(tuple(n + 2 for n in block), pos.dtype)
    for nodes, w in _corners(idx, frac):
        grid = grid.at[nodes].add(w * m)
    vol = (box[0] / shape[0]) * (box[1] / shape[1]) * (box[2] / shape[2])
    return halo.fold(grid, 1, D, comm) / vol


def _phi_k(rho, dx, G, ops) -> jax.Array:
    """Fourier-layout potential ``phi_k = -4 pi G rho_k / |k|^2`` (``phi_0 = 0``)."""
    lam = eigenvalues(ops, dx, "spectral", rho.dtype)  # -|k|^2, zero at k = 0
    rho_k = ops.forward(rho)
    zero = lam == 0
    return jnp.where(zero, 0.0, (4 * math.pi) * G * rho_k / jnp.where(zero, 1.0, lam))


def potential(rho, box, shape, G, ops) -> jax.Array:
    """Gravitational potential ``phi`` on the block's nodes (``lap phi = 4 pi G (rho - mean)``,
    zero mean), same layout and dtype as ``rho`` (length^2 / time^2)."""
    dx = [box[a] / shape[a] for a in range(D)]
    return jnp.real(ops.inverse(_phi_k(rho, dx, G, ops))).astype(rho.dtype)


def field(rho, box, shape, G, ops) -> jax.Array:
    """Gravitational acceleration ``g = -grad phi``, ``lap phi = 4 pi G (rho - mean rho)``.

    Args:
      rho: density on the block (or the whole grid), real layout of ``ops`` (mass / length^3).
      box: ``(3,)`` box lengths; shape: global grid (static); G: gravitational constant.
      ops: transforms of the engine (``simpar.parallel.fft.SpectralOps``, ``real=True``).

    Returns:
      ``(3, *rho.shape)`` acceleration (length / time^2); Green's function ``-1/|k|^2``,
      gradient by the 4th-order centred difference (in Fourier space).
    """
    dx = [box[a] / shape[a] for a in range(D)]
    phi_k = _phi_k(rho, dx, G, ops)
    out = []
    for a in range(D):
        theta = ops.freq(a).astype(rho.dtype) * (2 * math.pi / shape[a])  # k_a dx_a
        # 4th-order centred difference, applied in Fourier space (odd; zero at Nyquist)
        dk = (8 * jnp.sin(theta) - jnp.sin(2 * theta)) / (6 * dx[a])
        out.append(ops.inverse(-1j * dk * phi_k))
    return jnp.stack([jnp.real(g) for g in out])


def interpolate(g, pos, box, shape, block, comm) -> jax.Array:
    """Cloud-in-cell values of a block field at the block's particles.

    Args:
      g: ``(C, *block)`` field on this block's nodes.
      pos: ``(P, 3)`` wrapped positions inside the block's sub-box.

    Returns:
      ``(P, C)``.
    """
    padded = halo.pad(g, 1, ((Periodic(), Periodic()),) * D, comm)
    idx, frac = _cic(pos, box, shape, block, comm)
    out = jnp.zeros((pos.shape[0], g.shape[0]), g.dtype)
    for nodes, w in _corners(idx, frac):
        out = out + w[:, None] * padded[(slice(None), *nodes)].T
    return out


def accelerations(pos, mass, valid, box, shape, block, G, ops, comm) -> jax.Array:
    """PM accelerations ``(P, 3)`` of a block's particles (deposit, Poisson, gradient, CIC)."""
    rho = deposit(pos, mass, valid, box, shape, block, comm)
    return interpolate(field(rho, box, shape, G, ops), pos, box, shape, block, comm)


def _block(ops, comm) -> tuple[int, ...]:
    shape = ops.shape
    return tuple(shape[a] // comm.extent(a) for a in range(D))


def init_acc(state: PMState, params: PMParams, box, ops, comm) -> PMState:
    """``state`` with ``acc`` computed at its positions (before the first kick)."""
    shape, block = tuple(ops.shape), _block(ops, comm)
    acc = accelerations(
        state.pos, state.mass, state.ids >= 0, box, shape, block, params.G, ops, comm
    )
    return state._replace(acc=acc)


class PMCheck(NamedTuple):
    """What a chunk of PM steps saw (the same on every device; the ``nbrs`` of
    ``step.run_steps``).

    Attributes:
      error: int32[] ``error_codes`` bits, sticky: ``OWNED`` (a device owned more than
        ``pm.capacity``), ``MIGRATE`` (more than ``pm.migrate`` crossed one face), ``LOST``
        (a particle moved more than one sub-box in a step).
      needed: int32[2] largest owned count and migration count seen.
      done: int32[] steps run (the last one the step that set ``error``, if any).
    """

    error: jax.Array
    needed: jax.Array
    done: jax.Array


def error_bits(needed, capacities) -> jax.Array:
    """int32[] ``error_codes`` bits of one step's ``needed`` int32[3] (owned count, migration
    count, far flag; ``PMEngine.migrate_fn``) against ``capacities`` ``(capacity,
    migrate)`` (None: the particles do not migrate, no error)."""
    if capacities is None:
        return jnp.int32(0)
    over = error_codes.overflow(needed[:2], capacities, (error_codes.OWNED, error_codes.MIGRATE))
    return over | jnp.where(needed[2] > 0, error_codes.LOST, 0).astype(jnp.int32)


def step(state: PMState, params: PMParams, box, ops, comm, migrate: Callable):
    """One kick-drift-kick leapfrog step.

    Args:
      state: the block's particles, ``acc`` current.
      params: ``dt``, ``G``.
      box: ``(3,)`` box lengths (length).
      ops, comm: the engine's transforms and per-block comm.
      migrate: ``migrate(pos, vel, mass, ids) -> (pos, vel, mass, ids, needed)`` hands
        particles that left the sub-box to their owners (identity on ``single``/``sharded``;
        ``PMEngine.migrate_fn``); ``needed`` is int32 ``(3,)`` (see ``error_bits``).

    Returns:
      ``(state, needed)``.
    """
    dt = params.dt
    vel = state.vel + (0.5 * dt) * state.acc
    length = jnp.asarray(box, state.pos.dtype)
    pos = jnp.mod(state.pos + dt * vel, length)
    pos = jnp.where(pos >= length, 0.0, pos)  # mod may round up to L
    pos, vel, mass, ids, needed = migrate(pos, vel, state.mass, state.ids)
    state = init_acc(state._replace(pos=pos, vel=vel, mass=mass, ids=ids), params, box, ops, comm)
    vel = state.vel + (0.5 * dt) * state.acc
    return state._replace(vel=jnp.where((state.ids >= 0)[:, None], vel, 0.0)), needed


def advance(state: PMState, params: PMParams, n, box, ops, comm, migrate: Callable,
            capacities=None):  # fmt: skip
    """Up to ``n`` leapfrog steps in one ``lax.while_loop`` (``step.run_steps``, as every MD
    chunk), stopping after the first step that sets an error bit (``error_bits`` against
    ``capacities``; None: never).

    Returns:
      ``(state, PMCheck)``; after an error ``state`` is not usable (particles were dropped):
      the host redoes the chunk from its start (``pm_sim.PMSimulation``).
    """

    def one(s, chk):
        s, needed = step(s, params, box, ops, comm, migrate)
        error = chk.error | error_bits(needed, capacities)
        return s, PMCheck(error, jnp.maximum(chk.needed, needed[:2]), chk.done + 1)

    chk = PMCheck(jnp.int32(0), jnp.zeros(2, jnp.int32), jnp.int32(0))
    return run_steps(one, state, chk, n)


def make_program(eng, params_like=None):
    """The mapped functions of a PM run on a ``simpar.parallel.pm_engine.PMEngine``.

    The capacities are read when the functions are traced: after a regrow make new ones
    (``pm_sim.PMSimulation``).

    Returns:
      ``(start, chunk)``: ``start(pos, vel, mass, ids, params) -> PMState`` (accelerations
      computed); ``chunk(state, params, n) -> (state, check)`` runs up to ``n`` leapfrog
      steps, stopping at the first error; ``check`` is int32 ``[error, owned needed,
      migration needed, steps done]`` per device (the same on every device; read it with
      ``eng.per_device(check, 4)[0]``). ``state`` and ``check`` are in the engine's particle
      layout; ``eng.collect(state)`` brings the particles home in id order.
    """
    from simpar.parallel.pm_engine import PARTICLES

    box, ops, comm, migrate = eng.box, eng.ops, eng.comm, eng.migrate_fn()

    def start(pos, vel, mass, ids, params):
        s = PMState(pos, vel, mass, ids, jnp.zeros_like(pos))
        return init_acc(s, params, box, ops, comm)

    def chunk(state, params, n):
        s, chk = advance(state, params, n, box, ops, comm, migrate, eng.capacities())
        return s, jnp.concatenate([chk.error[None], chk.needed, chk.done[None]])

    start_m = eng.map(start, (PARTICLES,) * 4 + (None,), PARTICLES)
    chunk_m = eng.map(chunk, (PARTICLES, None, None), (PARTICLES, PARTICLES))
    return start_m, chunk_m


N_OBS = 6  # entries of block_observables


def block_observables(state: PMState, params: PMParams, box, ops, comm) -> jax.Array:
    """Diagnostics of one block: ``(6,)`` float ``[K, W, P_x, P_y, P_z, rho_max]``.

    ``K = sum m v^2 / 2`` (the block's particles), ``W = sum_nodes rho phi dV / 2`` (the
    block's nodes; the mesh potential energy of the periodic system, mean density removed),
    ``P = sum m v``, ``rho_max`` the largest node density of the block (mass / length^3).
    Totals over blocks: the sum of entries 0-4 and the max of entry 5 (done on the host).
    """
    shape, block = tuple(ops.shape), _block(ops, comm)
    valid = state.ids >= 0
    rho = deposit(state.pos, state.mass, valid, box, shape, block, comm)
    phi = potential(rho, box, shape, params.G, ops)
    vol = (box[0] / shape[0]) * (box[1] / shape[1]) * (box[2] / shape[2])
    m = jnp.where(valid, state.mass, 0.0)
    kin = 0.5 * jnp.sum(m * jnp.sum(state.vel**2, axis=1))
    pot = 0.5 * vol * jnp.sum(rho * phi)
    mom = jnp.sum(m[:, None] * state.vel, axis=0)
    return jnp.concatenate([jnp.stack([kin, pot]), mom, jnp.max(rho)[None]]).astype(rho.dtype)


def make_observe(eng):
    """``observe(state, params) -> per-device (6,) blocks`` of :func:`block_observables`
    mapped on a ``PMEngine`` (reduce them with ``eng.per_device``: sum 0-4, max 5)."""
    from simpar.parallel.pm_engine import PARTICLES

    box, ops, comm = eng.box, eng.ops, eng.comm

    def observe(state, params):
        return block_observables(state, params, box, ops, comm)

    return eng.map(observe, (PARTICLES, None), PARTICLES)


def momentum(state: PMState) -> jax.Array:
    """Total momentum ``(3,)`` of the block's particles (mass length / time)."""
    valid = (state.ids >= 0)[:, None]
    return jnp.sum(jnp.where(valid, state.mass[:, None] * state.vel, 0.0), axis=0)


__all__ = [
    "N_OBS",
    "PMCheck",
    "PMParams",
    "PMState",
    "accelerations",
    "block_observables",
    "advance",
    "deposit",
    "error_bits",
    "field",
    "init_acc",
    "interpolate",
    "make_observe",
    "make_program",
    "momentum",
    "potential",
    "step",
]
