"""The Lennard-Jones (or Morse) molecular-dynamics model: state, chunked run, host loop.

Contract:
  * ``MDState`` is a pytree of fixed-capacity particle buffers (leading axis N = capacity)
    with a validity mask, plus the step counter, the random key and the last pair energy
    and virial. Changing N or the neighbour capacities recompiles.
  * ``MDParams`` holds what a user may sweep or differentiate (``dt``, ``kt``, ``gamma``) as
    array leaves of the state dtype.
  * ``run_chunk`` (jitted) advances ``n`` steps inside one ``lax.while_loop``; the neighbour
    list is rebuilt inside the loop (``lax.cond``) whenever a particle moved more than half
    the skin, and the loop stops early once a capacity overflowed.
  * ``Simulation`` is the host loop: it runs chunks, and when the neighbour list reports an
    overflow it regrows the capacities and redoes the chunk from its saved start state,
    so no interaction is ever dropped.

The same jitted code runs on ``single`` (arrays on one device) and ``sharded`` (particle
arrays placed with ``NamedSharding`` over a 1-D mesh with ``AxisType.Auto``; XLA partitions
the computation; the placement helper is ``simpar.parallel.particles.shard_particles``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simpar import precision
from simpar.particles import integrate, neighbors, observables
from simpar.particles.neighbors import NeighborList, NeighborSpec
from simpar.particles.potentials import PairPotential, pair_terms
from simpar.particles.space import Space, volume, wrap

ENSEMBLES = ("nve", "langevin")


class MDState(NamedTuple):
    """Particle state (a pytree); N is the buffer capacity.

    Attributes:
      position: float[N, 3] (sigma), wrapped into the box when periodic.
      velocity: float[N, 3] (sigma / tau); zero on invalid slots.
      force: float[N, 3] (epsilon / sigma) at ``position``.
      mass: float[N] (mass unit m).
      valid: bool[N], occupied slots.
      key: uint32[2], raw ``jax.random`` key (Langevin noise).
      step: int32[], time-step counter.
      e_pair: float[], total pair energy at ``position`` (epsilon); refreshed at the
        end of every chunk (``run_chunk``), not inside the time steps.
      virial: float[], total pair virial ``sum_{i<j} r_ij . f_ij`` (epsilon).
    """

    position: jax.Array
    velocity: jax.Array
    force: jax.Array
    mass: jax.Array
    valid: jax.Array
    key: jax.Array
    step: jax.Array
    e_pair: jax.Array
    virial: jax.Array


class MDParams(NamedTuple):
    """Run parameters (array leaves of the state dtype).

    Attributes:
      dt: time step (tau).
      kt: Langevin temperature (epsilon); unused for NVE.
      gamma: Langevin friction (1 / tau); unused for NVE.
    """

    dt: jax.Array
    kt: jax.Array
    gamma: jax.Array


def make_params(dt: float, kt: float = 0.0, gamma: float = 0.0, dtype=None) -> MDParams:
    """``MDParams`` with every leaf in ``dtype`` (a float64 run keeps dt in float64).

    Args:
      dt: time step (tau).
      kt: Langevin temperature (epsilon); unused for NVE.
      gamma: Langevin friction (1 / tau); unused for NVE.
      dtype: float dtype of the leaves; None: JAX's default float (``simpar.precision``).

    Returns:
      ``MDParams`` of scalar array leaves.
    """
    dtype = precision.resolve(dtype)
    a = lambda x: jnp.asarray(x, dtype=dtype)  # noqa: E731
    return MDParams(a(dt), a(kt), a(gamma))


ROW_BLOCK_CPU = 1024  # neighbour rows per pass on CPU (see ``pair_forces``)


def _row_block() -> int | None:
    """Rows per pass of the force kernel: ``ROW_BLOCK_CPU`` on CPU, None (one pass) on
    accelerators, whose kernels want all rows at once."""
    return ROW_BLOCK_CPU if jax.default_backend() == "cpu" else None


def _pair_rows(pot, space, r, idx, cols, energy: bool):
    """``pair_forces`` for rows ``r`` (float[B, 3]) against ``cols``: the neighbours'
    coordinates one axis at a time, each float[K + 1] ending with the padding entry."""
    mask = idx < cols[0].shape[0] - 1
    # Structure-of-arrays gathers (one coordinate at a time) vectorise better on CPU
    # than gathering (N, M, 3) rows.
    comps, r2 = [], jnp.zeros(idx.shape, r.dtype)
    for d in range(3):
        dx = r[:, d, None] - cols[d][idx]
        if space.periodic:
            box = space.box[d].astype(r.dtype)
            dx = dx - box * jnp.round(dx * (1.0 / box))  # one division, not one per pair
        comps.append(dx)
        r2 = r2 + dx * dx
    e, f_over_r = pair_terms(pot, r2, mask)
    force = jnp.stack([jnp.sum(f_over_r * dx, axis=1) for dx in comps], axis=-1)
    if not energy:
        return force
    return force, 0.5 * jnp.sum(e), 0.5 * jnp.sum(f_over_r * r2)


def pair_forces(pot: PairPotential, space: Space, r, idx, energy: bool = True, others=None,
                block: int | None = -1):  # fmt: skip
    """Forces, pair energy and virial from a full neighbour list.

    Args:
      pot: pair potential.
      space: the space.
      r: float[N, 3] positions (sigma) of the particles whose forces are wanted.
      idx: int32[N, M] neighbour indices into ``others``, padded with ``len(others)``.
      energy: static; False returns the force alone (the time steps need nothing else,
        and the two extra reductions cost ~40% of the kernel on CPU).
      others: float[K, 3] positions of the neighbours (default ``r``); a domain block
        passes its owned atoms followed by its ghosts.
      block: rows per pass (static): the kernel runs over ``block`` rows at a time
        (``lax.map``), so its (rows, M) temporaries stay in cache: on CPU 4x faster than
        one pass over 32,000 x 96 slots. The forces equal one pass's bit for bit with FMA
        off (as the tests run); with FMA on XLA may contract differently per pass (float32:
        4e-7 of the largest force). -1 (default): 1,024 on CPU, one pass on accelerators;
        None: one pass.

    Returns:
      (force float[N, 3], e_pair scalar, virial scalar); each pair is seen twice in a
      full list, hence the factors 1/2 (in a domain block: the block's share). Only the
      force when ``energy`` is False.
    """
    src = r if others is None else others
    cols = [jnp.concatenate([src[:, d], jnp.zeros(1, r.dtype)]) for d in range(3)]
    block = _row_block() if block == -1 else block
    n_rows = r.shape[0]
    if block is None or n_rows <= block:
        return _pair_rows(pot, space, r, idx, cols, energy)
    nb = -(-n_rows // block)
    pad = nb * block - n_rows
    rb = jnp.concatenate([r, jnp.zeros((pad, 3), r.dtype)]).reshape(nb, block, 3)
    fill = jnp.full((pad, idx.shape[1]), src.shape[0], idx.dtype)
    ib = jnp.concatenate([idx, fill]).reshape(nb, block, idx.shape[1])
    out = jax.lax.map(lambda a: _pair_rows(pot, space, a[0], a[1], cols, energy), (rb, ib))
    if not energy:
        return out.reshape(nb * block, 3)[:n_rows]
    force, e, w = out
    return force.reshape(nb * block, 3)[:n_rows], jnp.sum(e), jnp.sum(w)


def compute_forces(spec: NeighborSpec, space: Space, pot: PairPotential, state: MDState,
                   nbrs: NeighborList) -> MDState:  # fmt: skip
    """``state`` with force, e_pair and virial recomputed at its positions."""
    f, e, w = pair_forces(pot, space, state.position, nbrs.idx)
    f = jnp.where(state.valid[:, None], f, 0.0)
    return state._replace(force=f, e_pair=e, virial=w)


def _step(ensemble, spec, space, pot, params, state, nbrs):
    valid = state.valid

    def force_fn(r):
        nb = neighbors.update(spec, space, nbrs, r, valid)
        f = pair_forces(pot, space, r, nb.idx, energy=False)
        return jnp.where(valid[:, None], f, 0.0), nb

    shift = functools.partial(wrap, space)
    key = state.key
    if ensemble == "nve":
        r, v, f, nb = integrate.velocity_verlet(
            state.position, state.velocity, state.force, state.mass, params.dt,
            force_fn, shift,
        )  # fmt: skip
    else:
        r, v, f, nb, key = integrate.langevin_baoab(
            state.position, state.velocity, state.force, state.mass, params.dt,
            params.gamma, params.kt, state.key, force_fn, shift,
        )  # fmt: skip
        v = jnp.where(valid[:, None], v, 0.0)
        r = jnp.where(valid[:, None], r, state.position)
    # e_pair / virial are refreshed once per chunk (run_chunk), not every step
    new = MDState(r, v, f, state.mass, valid, key, state.step + 1, state.e_pair,
                  state.virial)  # fmt: skip
    return new, nb


@functools.partial(jax.jit, static_argnums=(0, 1))
def run_chunk(ensemble: str, spec: NeighborSpec, space: Space, pot: PairPotential,
              params: MDParams, state: MDState, nbrs: NeighborList, n_steps):  # fmt: skip
    """Advance up to ``n_steps`` steps (stops early after a neighbour overflow).

    Args:
      ensemble: static, ``"nve"`` or ``"langevin"``.
      spec: static neighbour layout (changing it recompiles).
      space, pot, params: pytrees of parameters.
      state, nbrs: current state and its neighbour list.
      n_steps: int scalar (traced: one compilation serves every chunk length).

    Returns:
      (state, nbrs) after the chunk; check ``nbrs.did_overflow`` before trusting it.
    """

    def cond(carry):
        i, _, nb = carry
        return (i < n_steps) & ~nb.did_overflow

    def body(carry):
        i, s, nb = carry
        s, nb = _step(ensemble, spec, space, pot, params, s, nb)
        return i + 1, s, nb

    _, state, nbrs = jax.lax.while_loop(cond, body, (jnp.int32(0), state, nbrs))
    _, e, w = pair_forces(pot, space, state.position, nbrs.idx)
    return state._replace(e_pair=e, virial=w), nbrs


@jax.jit
def thermo(space: Space, state: MDState) -> dict[str, jax.Array]:
    """LAMMPS-style thermo quantities of ``state`` (see ``observables.thermo``)."""
    return observables.thermo(
        state.velocity, state.mass, state.valid, state.e_pair, state.virial, volume(space)
    )


@dataclasses.dataclass
class Simulation:
    """Host-side driver of an MD run (owns the static layout, regrows on overflow).

    Attributes:
      ensemble: ``"nve"`` or ``"langevin"``.
      space, pot, params: pytrees of parameters.
      spec: neighbour layout (regrown when the list overflows).
      state, nbrs: current state and neighbour list.
      capacity_factor: head-room when regrowing.
      placement: optional function applied to (state, nbrs) after a regrow (sharding).
      regrows: number of overflow repairs so far.
    """

    ensemble: str
    space: Space
    pot: PairPotential
    params: MDParams
    spec: NeighborSpec
    state: MDState
    nbrs: NeighborList
    capacity_factor: float = 1.2
    placement: object = None
    regrows: int = 0
    max_regrows: int = 10

    def _rebuild(self, state):
        nbrs = jax.jit(neighbors.build, static_argnums=0)(
            self.spec, self.space, state.position, state.valid
        )
        if self.placement is not None:
            nbrs = self.placement(nbrs)
        return nbrs

    def _repair(self, nbrs):
        """Regrow the layout from ``nbrs.needed``; returns a list built for ``self.state``."""
        builds = self.nbrs.n_builds
        for _ in range(self.max_regrows):
            self.spec = neighbors.regrow(self.spec, nbrs, self.capacity_factor)
            self.regrows += 1
            nbrs = self._rebuild(self.state)
            builds = builds + 1
            nbrs = nbrs._replace(n_builds=builds)  # keep counting across regrows
            if not bool(nbrs.did_overflow):
                return nbrs
        raise RuntimeError(
            f"neighbour list still overflows after {self.max_regrows} regrows "
            f"(needed {np.asarray(nbrs.needed).tolist()})"
        )

    def advance(self, n_steps: int) -> MDState:
        """Run ``n_steps`` steps; on overflow regrow and redo the chunk (never drops)."""
        if bool(self.nbrs.did_overflow):
            self.nbrs = self._repair(self.nbrs)
        while True:
            state, nbrs = run_chunk(
                self.ensemble, self.spec, self.space, self.pot, self.params,
                self.state, self.nbrs, jnp.int32(n_steps),
            )  # fmt: skip
            if not bool(nbrs.did_overflow):
                break
            self.nbrs = self._repair(nbrs)  # redo the chunk from self.state
        self.state, self.nbrs = state, nbrs
        return state

    def thermo(self) -> dict[str, float]:
        """Current thermo values as Python floats."""
        return {k: float(v) for k, v in thermo(self.space, self.state).items()}


def make_simulation(
    space: Space,
    pot: PairPotential,
    position,
    velocity,
    *,
    mass=1.0,
    valid=None,
    key=None,
    dt: float,
    ensemble: str = "nve",
    kt: float = 0.0,
    gamma: float = 0.0,
    skin: float = 0.3,
    step: int = 0,
    max_neighbors: int | None = None,
    column_capacity: int | None = None,
    capacity_factor: float = 1.2,
    all_pairs: bool = False,
    placement=None,
) -> Simulation:
    """Set up a run: allocate the neighbour list and compute the step-0 forces.

    Args:
      space: the space; pot: the pair potential.
      position, velocity: float[N, 3]; their dtype is the state dtype.
      mass: scalar or float[N].
      valid: bool[N] occupied slots (default all).
      key: raw uint32[2] ``jax.random`` key (default ``PRNGKey(0)``).
      dt: time step (tau).
      ensemble: ``"nve"`` or ``"langevin"`` (then ``kt`` and ``gamma`` apply).
      skin: Verlet skin (sigma).
      step: initial step counter.
      max_neighbors, column_capacity: fixed initial capacities (default: measured); too
        small values are detected and repaired by regrowing.
      capacity_factor: head-room when sizing / regrowing.
      all_pairs: all-pairs candidates instead of a cell list.
      placement: optional ``tree -> tree`` applied to every array set (sharding).

    Returns:
      A ``Simulation`` at step ``step`` with forces, energy and virial computed.
    """
    if ensemble not in ENSEMBLES:
        raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {ensemble!r}")
    position = jnp.asarray(position)
    dtype = position.dtype
    n = position.shape[0]
    velocity = jnp.asarray(velocity, dtype)
    valid = jnp.ones(n, bool) if valid is None else jnp.asarray(valid, bool)
    mass = jnp.broadcast_to(jnp.asarray(mass, dtype), (n,))
    key = jax.random.PRNGKey(0) if key is None else jnp.asarray(key, jnp.uint32)
    position = wrap(space, position)
    spec, nbrs = neighbors.allocate(
        space, position, valid, cutoff=float(pot.cutoff), skin=skin,
        capacity_factor=capacity_factor, max_neighbors=max_neighbors,
        column_capacity=column_capacity, all_pairs=all_pairs,
    )  # fmt: skip
    zero = jnp.zeros((), dtype)
    state = MDState(
        position, jnp.where(valid[:, None], velocity, 0.0), jnp.zeros_like(position),
        mass, valid, key, jnp.int32(step), zero, zero,
    )  # fmt: skip
    params = make_params(dt, kt, gamma, dtype=dtype)
    if placement is not None:
        state, nbrs, space, pot, params = placement((state, nbrs, space, pot, params))
    sim = Simulation(ensemble, space, pot, params, spec, state, nbrs, capacity_factor, placement)
    if bool(nbrs.did_overflow):
        sim.nbrs = sim._repair(nbrs)
    sim.state = jax.jit(compute_forces, static_argnums=0)(sim.spec, space, pot, state, sim.nbrs)
    return sim
