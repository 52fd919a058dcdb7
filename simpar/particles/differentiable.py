"""Differentiable MD runs: ``jax.grad`` / ``jax.jvp`` through a trajectory on every engine.

Contract:
  * ``rollout(engine, space, pot, position, velocity, n_steps=..., dt=..., ...)`` sizes the
    run on the host (a forward ``md.Simulation`` / ``decomposed_sim.DomainSimulation`` of
    the same steps, regrowing its capacities until nothing overflows) and returns a pure,
    jittable function ``run(pot, position, velocity, params=None) -> Trajectory`` of the
    potential (any ``potentials.pair``: its ``params`` leaves are differentiable), the
    initial positions and velocities float[N, 3] (atom ``i`` in row ``i``) and ``MDParams``
    (``dt``, ``kt``, ``gamma``). ``jax.grad`` and ``jax.jvp`` of a scalar of the
    ``Trajectory`` pass through the neighbour rebuilds, the ghost exchanges and the
    migrations (the transpose of a ``ppermute`` is the reverse ``ppermute``); the integer
    bookkeeping (lists, cells, slots, ids) carries no tangent (``neighbors.build`` stops
    the gradient of the positions it bins).
  * The steps are ``step.md_step`` (the engines' one step) in a ``lax.scan`` of a fixed
    length, in chunks of ``checkpoint`` steps wrapped in ``jax.checkpoint``: the reverse
    pass stores one state per chunk, recomputes the states of a chunk's steps, then the
    intermediates of one step at a time (two levels of ``jax.checkpoint``), so the memory
    grows with ``n_steps / checkpoint + checkpoint`` states plus one step's intermediates,
    not with ``n_steps`` steps' intermediates.
  * Overflow is never silent: the capacities are fixed inside a differentiated run; an
    overflow (new parameters or positions that need more neighbours, ghosts, slots than the
    forward sizing found) sets ``Trajectory.error`` (``error_codes`` bits) and turns every
    output and every gradient into NaN (``_poison``); ``check(traj)`` and
    ``value_and_grad`` raise the decoded ``SimulationError`` on the host.

Units are LJ reduced units (sigma, epsilon, tau, m).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simpar.parallel import mapping
from simpar.parallel.ghosts import distribute
from simpar.parallel.mapping import SLOTS, Mapping
from simpar.particles import decomposed, error_codes, md, neighbors, observables
from simpar.particles.decomposed import DomainState
from simpar.particles.decomposed_sim import make_domain_simulation
from simpar.particles.domain_spec import DomainSpec
from simpar.particles.forces import pair_forces
from simpar.particles.space import Space, wrap
from simpar.particles.step import md_step

ENGINES = ("single", "pmap", "shard_map")


class Trajectory(NamedTuple):
    """What a differentiable run returns (global arrays, atom ``i`` in row ``i``).

    Attributes:
      position: float[N, 3] final wrapped positions (sigma).
      velocity: float[N, 3] final velocities (sigma / tau).
      kinetic: float[T] kinetic energy after each of the T steps (epsilon).
      e_pair: float[] pair energy at the final positions (epsilon).
      virial: float[] pair virial ``sum_{i<j} r_ij . f_ij`` at the final positions (epsilon).
      error: int32[] ``error_codes`` bits (0: no capacity overflowed, the numbers hold).
      builds: int32[] neighbour-list builds in the run (the one at the start included).
    """

    position: jax.Array
    velocity: jax.Array
    kinetic: jax.Array
    e_pair: jax.Array
    virial: jax.Array
    error: jax.Array
    builds: jax.Array


@jax.custom_jvp
def _poison(x, error):
    """``x``, or NaN where ``error`` is set, in the value and in every derivative."""
    return jnp.where(error != 0, jnp.nan, x)


@_poison.defjvp
def _poison_jvp(primals, tangents):
    x, error = primals
    bad = jnp.where(error != 0, jnp.nan, 1.0).astype(x.dtype)
    return _poison(x, error), tangents[0] * bad  # linear in the tangent: transposes to NaN


def check(traj: Trajectory, step: int = 0) -> Trajectory:
    """``traj`` after checking its error bits on the host.

    Raises:
      SimulationError: a capacity overflowed inside the run (the outputs and gradients are
        NaN); rebuild the run function with ``rollout(..., capacity_factor=...)`` larger.
    """
    err = int(np.asarray(traj.error))
    if err:
        raise error_codes.decode(
            err, step, "a capacity sized by rollout's forward run overflowed inside the "
            "differentiated run (other parameters or positions): call rollout again with "
            "these, or a larger capacity_factor",
        )  # fmt: skip
    return traj


def value_and_grad(loss: Callable, argnums=0) -> Callable:
    """``jax.value_and_grad(loss, argnums, has_aux=True)`` for a ``loss(...) -> (value,
    Trajectory)``, raising ``SimulationError`` when the trajectory overflowed."""
    vg = jax.value_and_grad(loss, argnums=argnums, has_aux=True)

    def call(*args):
        (value, traj), grads = vg(*args)
        check(traj)
        return value, grads

    return call


def _scan_steps(step_fn, observe, carry, n_steps: int, checkpoint: int | None):
    """``n_steps`` of ``step_fn(carry) -> carry`` in a scan, chunked under ``jax.checkpoint``
    (``checkpoint`` steps per chunk; None: no rematerialisation); returns (carry,
    float[n_steps] ``observe(carry)`` after each step)."""

    def one(c, _):
        c = step_fn(c)
        return c, observe(c)

    if not checkpoint or checkpoint >= n_steps:
        return jax.lax.scan(one, carry, None, length=n_steps)
    n_chunks, rest = divmod(n_steps, checkpoint)

    @jax.checkpoint
    def chunk(c, _):  # two levels: the backward pass of a chunk recomputes its steps'
        # states, then each step's intermediates, one step at a time
        return jax.lax.scan(jax.checkpoint(one), c, None, length=checkpoint)

    carry, obs = jax.lax.scan(chunk, carry, None, length=n_chunks)
    obs = obs.reshape(-1)
    if rest:
        carry, tail = jax.lax.scan(one, carry, None, length=rest)
        obs = jnp.concatenate([obs, tail])
    return carry, obs


def _single_run(ensemble, spec, n_steps, checkpoint, mass, valid, key):
    """The pure run of ``single`` (one device, local Verlet list)."""

    def run(space: Space, pot, position, velocity, params: md.MDParams) -> Trajectory:
        dtype = position.dtype
        pos = wrap(space, position)
        nbrs = neighbors.build(spec, space, pos, valid)
        # one pass of the force kernel (no row passes: a loop of traced length has no
        # reverse mode), the same forces bit for bit with FMA off
        prov = md.local_provider(spec, space, block=None)
        f, _, _ = pair_forces(pot, space, pos, nbrs.idx, block=None)
        f = jnp.where(valid[:, None], f, 0.0)
        zero = jnp.zeros((), dtype)
        state = md.MDState(pos, jnp.where(valid[:, None], velocity, 0.0), f,
                           jnp.broadcast_to(jnp.asarray(mass, dtype), valid.shape), valid,
                           key, jnp.int32(0), zero, zero)  # fmt: skip
        step = functools.partial(md_step, ensemble, space, pot, params, prov)

        def ke(c):
            s = c[0]
            return observables.kinetic_energy(s.velocity, s.mass, s.valid)

        (state, nbrs), kin = _scan_steps(lambda c: step(*c), ke, (state, nbrs), n_steps,
                                         checkpoint)  # fmt: skip
        _, e, w = pair_forces(pot, space, state.position, nbrs.idx, block=None)
        return Trajectory(state.position, state.velocity, kin, e, w, nbrs.error, nbrs.n_builds)

    return run


def _domain_block(ensemble, spec, comm, n_steps, checkpoint):
    """The per-device program of the decomposed engines."""

    def block(state: DomainState, lists, space, pot, params):
        # one force pass (no loop of traced length: it has no reverse mode); the rebuild
        # decision (a largest displacement over all devices) carries no tangent
        prov = decomposed.domain_provider(spec, comm, space)._replace(
            block=None, rows=None, reduce_max=lambda x: comm.pmax(jax.lax.stop_gradient(x))
        )
        step = functools.partial(md_step, ensemble, space, pot, params, prov)
        state, lists = step(state, lists, jnp.asarray(True))  # lay out ghosts, list, forces

        def ke(c):
            s = c[0]
            return observables.kinetic_energy(s.velocity, s.mass, s.ids >= 0)

        (state, lists), kin = _scan_steps(lambda c: step(*c), ke, (state, lists), n_steps,
                                          checkpoint)  # fmt: skip
        others = jnp.concatenate([state.position, lists.ghost_position])
        _, e, w = pair_forces(pot, space, state.position, lists.idx, others=others, block=None)
        return state.position, state.velocity, state.ids, kin, e, w, lists.error, lists.n_builds

    return block


def _domain_run(spec, mapper, ensemble, n_steps, checkpoint, key):
    """The pure run of a decomposed engine laid out by ``spec`` (sized by a forward run)
    on ``mapper``'s devices: the host fixes which atom sits in which slot at the start (from
    the sizing run's initial positions); the traced positions and velocities are gathered
    into those slots, and atoms outside their sub-box migrate at the first step."""
    n_dev = spec.grid.size
    program = mapper.map(_domain_block(ensemble, spec, mapper.comm, n_steps, checkpoint),
                         (SLOTS,) * 5, SLOTS)
    lists0 = decomposed.empty_lists(spec, np.float64)

    def run(space: Space, pot, position, velocity, params, layout) -> Trajectory:
        host, mass = layout
        dtype = position.dtype
        ids = jnp.asarray(host["ids"])
        valid = ids >= 0
        take = jnp.maximum(ids, 0)
        pos = jnp.where(valid[..., None], wrap(space, position)[take], 0.0)
        vel = jnp.where(valid[..., None], velocity[take], 0.0)
        zero = jnp.zeros((n_dev,), dtype)
        state = DomainState(
            pos, vel, jnp.zeros_like(pos), jnp.where(valid, mass[take], 1.0), ids, pos,
            jnp.broadcast_to(key, (n_dev, 2)), jnp.zeros((n_dev,), jnp.int32), zero, zero,
        )  # fmt: skip
        lists = jax.tree.map(lambda x: jnp.asarray(x).astype(
            dtype if np.issubdtype(np.asarray(x).dtype, np.floating) else np.asarray(x).dtype),
            lists0)  # fmt: skip
        rep = lambda t: jax.tree.map(lambda x: jnp.broadcast_to(x, (n_dev,) + jnp.shape(x)), t)  # noqa: E731
        p, v, out_ids, kin, e, w, err, nb = program(state, lists, rep(space), rep(pot), rep(params))
        n = position.shape[0]
        slot = jnp.where(out_ids >= 0, out_ids, n).reshape(-1)
        gpos = jnp.zeros((n, 3), dtype).at[slot].add(p.reshape(-1, 3), mode="drop")
        gvel = jnp.zeros((n, 3), dtype).at[slot].add(v.reshape(-1, 3), mode="drop")
        return Trajectory(gpos, gvel, jnp.sum(kin, axis=0), jnp.sum(e), jnp.sum(w),
                          jnp.max(err), nb[0])  # fmt: skip

    return run


def rollout(engine: str, space: Space, pot, position, velocity, *, n_steps: int, dt: float,
            ensemble: str = "nve", kt: float = 0.0, gamma: float = 0.0, key=None, mass=1.0,
            mesh=(1,), skin: float = 0.3, checkpoint: int | None = None,
            capacity_factor: float = 1.3, devices=None, capacities=None) -> Callable:  # fmt: skip
    """A differentiable MD run of ``n_steps`` steps on ``engine``, sized on the host.

    Args:
      engine: ``"single"``, ``"pmap"`` or ``"shard_map"``.
      space: a periodic space; pot: the pair potential (its cutoff is static from here on).
      position, velocity: float[N, 3] the start that sizes the capacities (sigma, sigma/tau).
      n_steps: steps per run (static); dt: time step (tau).
      ensemble: ``"nve"`` or ``"langevin"`` (``kt``, ``gamma``; the noise is a fixed
        function of ``key``, raw uint32[2], default ``PRNGKey(0)``).
      mass: scalar or float[N]; mesh: device-grid shape of the decomposed engines.
      skin: Verlet skin (sigma); checkpoint: steps per rematerialised chunk (None: none).
      capacity_factor: head-room of the capacities over the sizing run's needs.
      devices: devices of the decomposed engines (default the first ``prod(mesh)``).
      capacities: ``run.capacities`` of an earlier ``rollout`` of the same engine kind
        (one-device or decomposed), mesh, space and atom count: reused as they are, with no
        forward sizing run (the steps, ensemble, checkpoint and start may differ; a start
        that needs more room sets ``Trajectory.error``, as any overflow).

    Returns:
      ``run(pot, position, velocity, params=None) -> Trajectory``, pure and jittable;
      ``params``: ``md.MDParams`` (default those of ``dt``, ``kt``, ``gamma``). Outputs and
      gradients are NaN when ``Trajectory.error`` is set (``check`` raises then).
      ``run.capacities`` holds the sized layout (a ``NeighborSpec`` or ``DomainSpec``).

    Raises:
      ValueError: an unknown engine, or ``capacities`` of another engine kind, mesh or
        atom count; ConfigError: a mesh too fine for the box (as the forward engines).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    position = jnp.asarray(position)
    dtype = position.dtype
    velocity = jnp.asarray(velocity, dtype)
    n = position.shape[0]
    key = jax.random.PRNGKey(0) if key is None else jnp.asarray(key, jnp.uint32)
    kw = dict(dt=dt, ensemble=ensemble, kt=kt, gamma=gamma, key=key, mass=mass, skin=skin,
              capacity_factor=capacity_factor)  # fmt: skip
    params0 = md.make_params(dt, kt, gamma, dtype=dtype)
    cutoff = float(pot.cutoff)  # the lists' radius is cutoff + skin from here on
    if mapping.kind(engine).one_device:
        if capacities is None:
            sim = md.make_simulation(space, pot, position, velocity, **kw)
            sim.advance(n_steps)  # sizing: the list's capacities grow until nothing overflows
            spec = sim.spec
        else:
            spec = _reused(capacities, neighbors.NeighborSpec, n, "capacity")
        valid = jnp.ones(n, bool)
        body = _single_run(ensemble, spec, n_steps, checkpoint, mass, valid, key)

        def run(pot, position, velocity, params=None):
            t = body(space, pot, position, velocity, params0 if params is None else params)
            return _guard(t, pot, cutoff)

        run.capacities = spec
        return run
    if capacities is None:
        sim = make_domain_simulation(engine, mesh, space, pot, position, velocity,
                                     devices=devices, **kw)  # fmt: skip
        sim.advance(n_steps)
        spec, mapper = sim.spec, sim.mapper
    else:
        spec = _reused(capacities, DomainSpec, n, "n_atoms")
        if tuple(spec.grid.shape) != tuple(int(m) for m in mesh):
            raise ValueError(f"capacities were sized on mesh {spec.grid.shape}, not {mesh}")
        devices = list(jax.devices() if devices is None else devices)[: spec.grid.size]
        mapper = Mapping(engine, spec.grid, devices)
    host, _ = distribute(spec, np.asarray(space.box), {
        "position": np.asarray(wrap(space, position)), "velocity": np.asarray(velocity),
        "force": np.zeros((n, 3), dtype), "ref_position": np.asarray(wrap(space, position)),
        "mass": np.broadcast_to(np.asarray(mass, dtype), (n,)),
    }, 0, key)  # fmt: skip
    layout = ({"ids": host["ids"]}, jnp.broadcast_to(jnp.asarray(mass, dtype), (n,)))
    body = _domain_run(spec, mapper, ensemble, n_steps, checkpoint, key)

    def run(pot, position, velocity, params=None):
        t = body(space, pot, position, velocity, params0 if params is None else params, layout)
        return _guard(t, pot, cutoff)

    run.capacities = spec
    return run


def _reused(spec, kind, n: int, field: str):
    """``spec`` (``run.capacities`` of an earlier rollout) checked against the engine kind
    and the atom count."""
    if not isinstance(spec, kind):
        raise ValueError(f"capacities must be the run.capacities of a rollout on this kind of "
                         f"engine (a {kind.__name__}), got {type(spec).__name__}")  # fmt: skip
    if getattr(spec, field) != n:
        raise ValueError(f"capacities were sized for {getattr(spec, field)} atoms, not {n}")
    return spec


def _guard(t: Trajectory, pot, cutoff: float) -> Trajectory:
    """Every float output NaN (value and derivatives) when ``t.error`` is set; a cutoff
    beyond the sized one sets ``NEIGHBORS`` (the lists would miss pairs)."""
    far = jnp.asarray(pot.cutoff) > cutoff
    t = t._replace(error=t.error | jnp.where(far, error_codes.NEIGHBORS, 0).astype(t.error.dtype))
    return t._replace(
        **{
            k: _poison(getattr(t, k), t.error)
            for k in ("position", "velocity", "kinetic", "e_pair", "virial")
        }
    )


def lj_start(cells, density: float = 0.8442, kt: float = 1.44, seed: int = 1,
             jitter: float = 0.0):  # fmt: skip
    """The LJ start of the gradient scripts: fcc ``cells`` at ``density``, Maxwell-Boltzmann
    velocities at ``kt`` (key ``seed``), positions jittered by ``jitter`` sigma (normal; off
    the lattice, whose shells may sit exactly at a cutoff).

    Returns:
      (space, position float[N, 3], velocity float[N, 3]) in JAX's default float.
    """
    from simpar.particles import lattice
    from simpar.particles.space import periodic

    r, box = lattice.cubic_lattice("fcc", density, cells)
    if jitter:
        r = r + jitter * jax.random.normal(jax.random.PRNGKey(seed + 3), r.shape, r.dtype)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(seed), r.shape[0], kt)
    return periodic(box), r, v
