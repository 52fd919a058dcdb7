"""MD with any pair potential (LJ, Morse, a user's ``potentials.pair``): state, chunks, host loop.

Contract:
  * ``MDState`` is a pytree of fixed-capacity particle buffers (leading axis N = capacity)
    with a validity mask, plus the step counter, the random key and the last pair energy
    and virial. Changing N or the neighbour capacities recompiles.
  * ``MDParams`` holds what a user may sweep or differentiate (``dt``, ``kt``, ``gamma``) as
    array leaves of the state dtype.
  * ``run_chunk`` (jitted) advances ``n`` steps of the one MD step (``step.md_step``) with a
    local Verlet list (``local_provider``): the list is rebuilt inside the loop whenever a
    particle moved more than half the skin, and the loop stops early once a capacity
    overflowed (``NeighborList.error``, ``error_codes``). ``sharded`` runs it.
  * ``run_until_rebuild`` (jitted) runs the same steps up to the first that needs a new list,
    which ``single`` builds in a lean program (``lean_programs``) before resuming: the same
    bits, in a fifth of the compiler's memory.
  * ``Simulation`` is the host loop (``step.Regrowing``): it runs chunks, and when the
    neighbour list reports an overflow it regrows the capacities and redoes the chunk from
    its saved start state, so no interaction is ever dropped.

The same jitted code runs on ``single`` (arrays on one device) and ``sharded`` (particle
arrays placed with ``NamedSharding`` over a 1-D mesh with ``AxisType.Auto``; XLA partitions
the computation; the placement helper is ``simpar.parallel.particles.shard_particles``). The
decomposed engines run the same step with ghosts (``simpar.particles.decomposed``).

Every simulation (``Simulation`` here, ``decomposed_sim.DomainSimulation``) offers the same
interface to a driver: ``advance(k)``, ``thermo() -> dict``, ``snapshot() -> dict`` (global
host arrays in atom-id order: position, velocity, force float[n, 3], key, step), ``step``,
``regrows``, ``builds``, ``hops`` (None here) and ``error`` (``error_codes`` bits).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from simpar import precision
from simpar.memory import drop_compiled_if_cached, lean_jit, release_free_memory
from simpar.parallel.distributed import to_host
from simpar.parallel.particles import replicated
from simpar.particles import error_codes, neighbors, observables
from simpar.particles.forces import ROW_BLOCK_CPU as ROW_BLOCK_CPU  # former home: re-exported
from simpar.particles.forces import pair_forces as pair_forces  # former home: re-exported
from simpar.particles.neighbors import NeighborList, NeighborSpec
from simpar.particles.potentials import PairPotential
from simpar.particles.space import Space, volume, wrap
from simpar.particles.step import Provider, Regrowing, md_step, run_steps
from simpar.particles.step import run_until_rebuild as run_until_rebuild_steps

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


def compute_forces(spec: NeighborSpec, space: Space, pot: PairPotential, state: MDState,
                   nbrs: NeighborList) -> MDState:  # fmt: skip
    """``state`` with force, e_pair and virial recomputed at its positions."""
    f, e, w = pair_forces(pot, space, state.position, nbrs.idx)
    f = jnp.where(state.valid[:, None], f, 0.0)
    return state._replace(force=f, e_pair=e, virial=w)


def local_provider(spec: NeighborSpec, space: Space, block: int | None = -1,
                   policy: tuple[int, bool] = (1, True)) -> Provider:  # fmt: skip
    """The neighbour provider of ``single`` and ``sharded``: a Verlet list over the state's
    own slots (slot ``k`` holds atom ``k``), rebuilt by ``neighbors.build``; ``block``: the
    force kernel's rows per pass (``row_block``); ``policy``: ``(every, check)``, see
    ``step.Provider``."""

    def rebuild(s, nb, _init):
        return s, _rebuild_list(spec, space, s, nb)

    return Provider(
        skin=spec.skin,
        n_draw=spec.capacity,
        valid=lambda s: s.valid,
        ids=lambda s: None,
        reference=lambda s, nb: nb.ref_position,
        reduce_max=lambda x: x,
        rebuild=rebuild,
        refresh=lambda s, nb, _init: (s, nb),
        others=lambda s, nb: None,
        block=block,
        every=int(policy[0]),
        check=bool(policy[1]),
    )


def row_block(x) -> int | None:
    """Rows per pass of the force kernel for state arrays placed like ``x``: None (one pass)
    when ``x`` is split over several devices (``sharded``), whose partitioner keeps a
    one-pass kernel local to each shard but gathers the neighbour lists and all-reduces the
    force blocks of a row-blocked one (6.2 MB per device and step at 4,000 atoms on 8
    devices, against the 96 KB of the position all-gather); -1 (the backend's default,
    ``forces.pair_forces``) otherwise. The forces are the same bit for bit with FMA off.
    """
    sharding = getattr(x, "sharding", None)
    if sharding is not None and len(sharding.device_set) > 1:
        return None
    return -1


@functools.partial(jax.jit, static_argnums=(0, 1), static_argnames=("block", "policy"))
def run_chunk(ensemble: str, spec: NeighborSpec, space: Space, pot: PairPotential,
              params: MDParams, state: MDState, nbrs: NeighborList, n_steps,
              block: int | None = -1, policy: tuple[int, bool] = (1, True)):  # fmt: skip
    """Advance up to ``n_steps`` steps (stops early after a neighbour overflow).

    Args:
      ensemble: static, ``"nve"`` or ``"langevin"``.
      spec: static neighbour layout (changing it recompiles).
      space, pot, params: pytrees of parameters.
      state, nbrs: current state and its neighbour list.
      n_steps: int scalar (traced: one compilation serves every chunk length).
      block: static, the force kernel's rows per pass: ``row_block(state.position)``.
      policy: static ``(every, check)`` neighbour policy (``step.Provider``; default exact).

    Returns:
      (state, nbrs) after the chunk; check ``nbrs.error`` before trusting it.
    """
    prov = local_provider(spec, space, block, policy)
    step_fn = functools.partial(md_step, ensemble, space, pot, params, prov)
    state, nbrs = run_steps(step_fn, state, nbrs, n_steps)
    return _energy(space, pot, state, nbrs, block), nbrs


@functools.partial(
    jax.jit, static_argnums=(0, 1), static_argnames=("block", "policy"), donate_argnums=(5, 6)
)
def run_until_rebuild(ensemble: str, spec: NeighborSpec, space: Space, pot: PairPotential,
                      params: MDParams, state: MDState, nbrs: NeighborList, n_steps, resume,
                      block: int | None = -1, policy: tuple[int, bool] = (1, True)):  # fmt: skip
    """``step.run_until_rebuild`` with the local list: ``single``'s steps between two list
    builds (``Simulation`` rebuilds with ``rebuild_list``); arguments as ``run_chunk`` plus
    ``resume`` (bool); ``state``, ``nbrs`` donated. Returns (state, nbrs, done, pending)."""
    prov = local_provider(spec, space, block, policy)
    return run_until_rebuild_steps(ensemble, space, pot, params, prov, state, nbrs, n_steps,
                                   resume)  # fmt: skip


def _initial_state(space: Space, position, velocity, mass, valid, key, step) -> MDState:
    """The state of ``make_simulation`` (positions wrapped, zero forces; ``key`` None:
    ``PRNGKey(0)``)."""
    dtype, n = position.dtype, position.shape[0]
    valid = jnp.asarray(valid, bool)
    key = jax.random.PRNGKey(0) if key is None else jnp.asarray(key, jnp.uint32)
    zero = jnp.zeros((), dtype)
    position = wrap(space, position)
    return MDState(
        position, jnp.where(valid[:, None], jnp.asarray(velocity, dtype), 0.0),
        jnp.zeros_like(position), jnp.broadcast_to(jnp.asarray(mass, dtype), (n,)), valid,
        key, jnp.asarray(step, jnp.int32), zero, zero,
    )  # fmt: skip


def _rebuild_list(spec: NeighborSpec, space: Space, state: MDState, nbrs: NeighborList):
    """``nbrs`` merged with a list built at ``state``'s positions, taken whole (``replicated``,
    the identity on one device): ``sharded`` then bins and sorts the all-gather of float[N, 3]
    its forces use, where split positions all-reduced the cell-sorted copies with their z
    images, float[3N, 3] (issue 29 item 5: 4.2x all positions per build, now 1.2x)."""
    r = replicated(state.position)
    return neighbors.merge(nbrs, neighbors.build(spec, space, r, state.valid))


def _energy(space: Space, pot: PairPotential, state: MDState, nbrs: NeighborList, block=-1):
    """``state`` with the pair energy and virial at its positions (forces unchanged)."""
    _, e, w = pair_forces(pot, space, state.position, nbrs.idx, block=block)
    return state._replace(e_pair=e, virial=w)


@functools.cache
def lean_programs() -> dict:
    """The rarely run programs of ``single``, compiled lean (``simpar.memory.lean_jit``):
    ``rebuild_list(spec, space, state, nbrs)`` (a new list merged into the donated ``nbrs``),
    ``energy(space, pot, state, nbrs)``, ``forces`` (``compute_forces``), ``build``
    (``neighbors.build``), ``thermo`` and ``initial_state`` (``make_simulation``'s)."""
    rebuild = lean_jit(_rebuild_list, static_argnums=0, donate_argnums=3, keep_unused=True)
    return {
        "rebuild_list": rebuild,
        "energy": lean_jit(_energy),
        "forces": lean_jit(compute_forces, static_argnums=0),
        "build": neighbors.lean_build(),
        "thermo": lean_jit(_thermo),
        "initial_state": lean_jit(_initial_state),
    }


def thermo(space: Space, state: MDState) -> dict[str, jax.Array]:
    """LAMMPS-style thermo quantities of ``state`` (see ``observables.thermo``; compiled lean,
    ``lean_programs``)."""
    return lean_programs()["thermo"](space, state)


def _thermo(space: Space, state: MDState) -> dict[str, jax.Array]:
    return observables.thermo(
        state.velocity, state.mass, state.valid, state.e_pair, state.virial, volume(space)
    )


@dataclasses.dataclass
class Simulation(Regrowing):
    """Host-side driver of an MD run (owns the static layout, regrows on overflow).

    Attributes:
      ensemble: ``"nve"`` or ``"langevin"``.
      space, pot, params: pytrees of parameters.
      spec: neighbour layout (regrown when the list overflows).
      state, nbrs: current state and neighbour list.
      capacity_factor: head-room when regrowing.
      placement: optional function applied to (state, nbrs) after a regrow (sharding).
      regrows: number of overflow repairs so far.
      max_regrows: regrows allowed per chunk.
      every, check: neighbour policy (``step.Provider``; default: the exact skin/2 check
        after every step).
      consume_list: one device: a chunk donates the start's ``nbrs.idx`` instead of a copy
        (in.lj: 12 MiB), deleting it (a redo rebuilds it from ``ref_position``): for a
        driver that keeps no reference to a list (``simpar run``).
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
    every: int = 1
    check: bool = True
    consume_list: bool = False
    _compiled: set = dataclasses.field(default_factory=set, repr=False)  # chunk layouts built

    def _rebuild(self, state):
        nbrs = lean_programs()["build"](self.spec, self.space, state.position, state.valid)
        if self.placement is not None:
            nbrs = self.placement(nbrs)
        return nbrs

    # the regrow loop's hooks (step.Regrowing) ---------------------------------------------
    def _chunk(self, n_steps: int):
        kw = dict(block=row_block(self.state.position), policy=(self.every, self.check))
        if self.placement is not None:  # sharded: one program, partitioned by XLA
            self._compile_once(n_steps, self.state, self.nbrs)
            return run_chunk(self.ensemble, self.spec, self.space, self.pot, self.params,
                             self.state, self.nbrs, jnp.int32(n_steps), **kw)  # fmt: skip
        # one device: the time steps (fusion emitters: fast forces) and the list builds (lean:
        # their compilation would dominate the peak memory) are separate programs; the host
        # rebuilds between them, ~1 call per 10 steps, the same steps bit for bit
        steps = functools.partial(run_until_rebuild, self.ensemble, self.spec, self.space,
                                  self.pot, self.params, **kw)  # fmt: skip
        lean = lean_programs()
        # committed copies (the programs donate them; the start stays for a redo, ``_advance``)
        self.compile_chunks(n_steps)
        keep = self.nbrs._replace(idx=None) if self.consume_list else self.nbrs
        state, nbrs = jax.device_put((self.state, keep), self.state.position.sharding,
                                     may_alias=False)  # fmt: skip
        if self.consume_list:
            nbrs = nbrs._replace(idx=self.nbrs.idx)
        done, resume = 0, False
        while True:
            state, nbrs, k, pending = steps(state, nbrs, np.int32(n_steps - done), np.bool_(resume))
            done += int(k)
            if not bool(pending) or int(nbrs.error):
                break
            nbrs = lean["rebuild_list"](self.spec, self.space, state, nbrs)
            resume = True
        if int(nbrs.error):
            return state, nbrs
        return lean["energy"](self.space, self.pot, state, nbrs), nbrs

    def compile_chunks(self, n_steps: int = 1) -> None:
        """One device: compile the chunks' programs now (``simpar run``: before its frames)."""
        where = self.state.position.sharding
        sds = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where)  # noqa: E731
        self._compile_once(n_steps, *jax.tree.map(sds, (self.state, self.nbrs)))

    def _compile_once(self, n_steps: int, state, nbrs) -> None:
        """Compile the chunk's programs (``lowered``) ahead of their first call, handing the
        compiler's freed memory back before the chunk's buffers exist (in.lj: -70 MiB peak
        RSS); the calls find the compiled programs."""
        key = (self.ensemble, self.spec, row_block(self.state.position), self.every,
               self.check, self.placement is None)  # fmt: skip
        if key not in self._compiled:  # the lean ones too: their compilations do not stack
            for low in self.lowered(n_steps, lean=True, state=state, nbrs=nbrs).values():
                low.compile()
                release_free_memory()
            self._compiled.add(key)

    def lowered(self, n_steps: int, lean: bool = True, state=None, nbrs=None) -> dict:
        """The lowered programs of a chunk of ``n_steps`` from the current state (for
        ``memory_analysis()`` and HLO checks): ``steps``, ``rebuild_list`` and ``energy`` on
        one device (the last two only with ``lean``); ``chunk`` (``run_chunk``) when the
        state is placed (``sharded``). ``state``, ``nbrs``: other arrays of the same layout."""
        state, nbrs = (self.state, self.nbrs) if state is None else (state, nbrs)
        kw = dict(block=row_block(state.position), policy=(self.every, self.check))
        args = (self.space, self.pot, self.params, state, nbrs, np.int32(n_steps))
        if self.placement is not None:
            return {"chunk": run_chunk.lower(self.ensemble, self.spec, *args, **kw)}
        steps = run_until_rebuild.lower(self.ensemble, self.spec, *args, np.bool_(False), **kw)
        if not lean:
            return {"steps": steps}
        lean = lean_programs()
        return {"steps": steps,
                "rebuild_list": lean["rebuild_list"].lower(self.spec, self.space, state, nbrs),
                "energy": lean["energy"].lower(self.space, self.pot, state, nbrs)}  # fmt: skip

    def _error(self, nbrs) -> int:
        return int(np.asarray(nbrs.error))

    def _needed(self, nbrs):
        return np.asarray(nbrs.needed)

    def _regrow(self, nbrs) -> None:
        """Grow the layout from ``nbrs.needed`` and rebuild the saved start's list from the
        positions of its last build (``ref_position``), as the decomposed engines do: the
        same pairs as before, so a regrow never changes the trajectory or the build count
        (a list built at the chunk's start would hold other pairs, beyond the cutoff but in
        the radius, and shift the rebuild times and the force sums' rounding)."""
        self.spec = neighbors.regrow(self.spec, nbrs, self.capacity_factor)
        new = self._rebuild(self.state._replace(position=self.nbrs.ref_position))
        self.nbrs = new._replace(n_builds=self.nbrs.n_builds)

    def _commit(self, state, nbrs) -> None:
        self.state, self.nbrs = state, nbrs

    def _step_of(self, state) -> int:
        return int(np.asarray(state.step))

    def _repair(self, nbrs):
        """Regrow until a list built for ``self.state`` fits; returns it (set-up, resume).

        Raises:
          SimulationError: still overflowing after ``max_regrows`` regrows.
        """
        for _ in range(self.max_regrows):
            if not self._error(nbrs):
                return nbrs
            self._regrow(nbrs)
            self.regrows += 1
            nbrs = self.nbrs
        if self._error(nbrs):
            raise error_codes.decode(
                self._error(nbrs), self.step,
                f"still overflowing after {self.max_regrows} regrows; needed "
                f"{self._needed(nbrs).tolist()}",
            )  # fmt: skip
        return nbrs

    # the driver's interface -----------------------------------------------------------------
    def advance(self, n_steps: int) -> MDState:
        """Run ``n_steps`` steps; on overflow regrow and redo the chunk (never drops).

        Raises:
          SimulationError: capacities still overflowing after ``max_regrows`` regrows.
        """
        self._advance(n_steps)
        release_free_memory()  # a chunk's (re)compilation frees ~100 MB the C heap keeps
        return self.state

    def thermo(self) -> dict[str, float]:
        """Current thermo values as Python floats."""
        return {k: float(v) for k, v in thermo(self.space, self.state).items()}

    @property
    def step(self) -> int:
        """The step counter of the state."""
        return int(to_host(self.state.step))

    def current_step(self) -> int:
        """The step counter (``step``; the decomposed simulation's name)."""
        return self.step

    @property
    def builds(self) -> int:
        """Neighbour-list builds so far (regrows included)."""
        return int(to_host(self.nbrs.n_builds))

    @property
    def error(self) -> int:
        """The ``error_codes`` bits of the current list (0 after every ``advance``)."""
        return int(to_host(self.nbrs.error))

    hops = None  # ghost hops per axis: none on one device or ``sharded``

    def snapshot(self) -> dict:
        """Global host arrays in atom-id order (only the occupied slots): ``position``,
        ``velocity``, ``force`` float[n, 3], ``key`` uint32[2], ``step`` int (a collective
        across processes in multi-process runs: every process calls it)."""
        s = self.state
        valid = np.asarray(to_host(s.valid), bool)
        return {"position": to_host(s.position)[valid], "velocity": to_host(s.velocity)[valid],
                "force": to_host(s.force)[valid], "key": to_host(s.key),
                "step": int(to_host(s.step))}  # fmt: skip


def make_simulation(space: Space, pot: PairPotential, position, velocity, *, mass=1.0,
                    valid=None, key=None, dt: float, ensemble: str = "nve", kt: float = 0.0,
                    gamma: float = 0.0, skin: float = 0.3, step: int = 0,
                    max_neighbors: int | None = None, column_capacity: int | None = None,
                    capacity_factor: float = 1.2, all_pairs: bool = False, placement=None,
                    every: int = 1, check: bool = True) -> Simulation:  # fmt: skip
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
      every, check: LAMMPS's ``neigh_modify every N check yes|no`` (``step.Provider``);
        the default, 1 and True, is the exact policy.

    Returns:
      A ``Simulation`` at step ``step`` with forces, energy and virial computed.
    """
    if ensemble not in ENSEMBLES:
        raise ValueError(f"ensemble must be one of {ENSEMBLES}, got {ensemble!r}")
    position = jnp.asarray(position)
    dtype = position.dtype
    n = position.shape[0]
    valid = np.ones(n, bool) if valid is None else valid
    # one lean program, not a dozen eager operations whose executables JAX would keep
    lean = lean_programs()
    state = lean["initial_state"](space, position, velocity, mass, valid, key, step)
    spec = neighbors.size_list(  # on the host, then the chunks' own build program
        space, state.position, state.valid, cutoff=float(pot.cutoff), skin=skin,
        capacity_factor=capacity_factor, max_neighbors=max_neighbors,
        column_capacity=column_capacity, all_pairs=all_pairs,
        block=None if placement is None else n,  # sharded: one pass, as ``row_block``
    )  # fmt: skip
    if placement is None:  # committed as in the chunks: one rebuild_list program, not two
        state = jax.device_put(state, state.position.sharding)
    nbrs = lean["rebuild_list"](spec, space, state, neighbors.unbuilt(spec, state.position))
    params = make_params(dt, kt, gamma, dtype=dtype)
    if placement is not None:
        state, nbrs, space, pot, params = placement((state, nbrs, space, pot, params))
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an integer >= 1 (steps), got {every!r}")
    if not isinstance(check, bool):
        raise ValueError(f"check must be True or False, got {check!r}")
    sim = Simulation(ensemble, space, pot, params, spec, state, nbrs, capacity_factor, placement,
                     every=every, check=check)  # fmt: skip
    sim.nbrs = sim._repair(nbrs)
    sim.state = lean["forces"](sim.spec, space, pot, state, sim.nbrs)
    jax.block_until_ready(sim.state)  # set-up's programs, reloaded from JAX's cache when on:
    if not drop_compiled_if_cached(lean["initial_state"], lean["build"], lean["forces"]):
        release_free_memory()  # set-up's freed compiler memory (``simpar.memory``)
    return sim
