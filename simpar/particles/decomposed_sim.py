"""Host driver of decomposed Lennard-Jones MD: ``DomainSimulation`` and
``make_domain_simulation`` (engines ``pmap``, ``shard_map`` and the one-device ``local``).

``DomainSimulation`` offers the driver interface of ``md.Simulation``: ``advance(k)``,
``thermo()``, ``snapshot()`` (global host arrays in atom-id order), ``step``, ``regrows``,
``builds``, ``hops`` and ``error``; the overflow -> regrow -> redo loop is ``step.Regrowing``,
the same as ``md.Simulation``'s. The host checks the atom count and the ids whenever it
gathers the state (``global_state``); a mismatch is a ``SimulationError`` ("lost atoms").
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from simpar.errors import ConfigError, SimulationError
from simpar.parallel import blocks, mapping
from simpar.parallel.capacity import check_mesh
from simpar.parallel.ghosts import collect, distribute
from simpar.parallel.mapping import REPLICATED, SLOTS, Mapping
from simpar.parallel.topology import DeviceGrid
from simpar.particles import error_codes, md
from simpar.particles.decomposed import (
    DomainLists,
    DomainState,
    chunk_block,
    empty_lists,
    make_spec,
    thermo_block,
)
from simpar.particles.domain_spec import DomainSpec, grow, guess, round8
from simpar.particles.potentials import PairPotential
from simpar.particles.space import Space
from simpar.particles.step import Regrowing

__all__ = ["DomainSimulation", "check_mesh", "make_domain_simulation"]

_LOST = error_codes.names(error_codes.LOST)[0]
_COMPILED: dict = {}  # (name, engine, devices, grid, spec, ensemble, policy) -> program


@dataclasses.dataclass
class DomainSimulation(Regrowing):
    """Host driver of a decomposed MD run (mirrors ``md.Simulation``).

    Attributes:
      engine: ``"pmap"``, ``"shard_map"`` or ``"local"`` (one device, ``LocalComm``).
      spec: static layout (regrown on overflow); state, lists: device arrays with a
        leading device axis.
      regrows: capacity repairs so far; builds: neighbour builds so far.
      every, check: the neighbour policy (``step.Provider``: LAMMPS's ``neigh_modify every
        N check yes|no``; default the exact skin/2 check after every step).
    """

    engine: str
    ensemble: str
    space: Space
    pot: PairPotential
    params: md.MDParams
    spec: DomainSpec
    mapper: Mapping
    state: DomainState = None
    lists: DomainLists = None
    capacity_factor: float = 1.2
    regrows: int = 0
    builds: int = 0
    max_regrows: int = 20
    every: int = 1
    check: bool = True
    _fns: dict = dataclasses.field(default_factory=lambda: _COMPILED)
    _pending: dict | None = None  # global arrays to lay out at the next chunk
    _base: int = 0  # the list's build count at the start of the last chunk

    # compiled block functions (one chunk program per layout) ------------------------------
    def _fn(self, name):
        # shared by every run with the same engine, devices, layout and ensemble: a new
        # run (or a test) with an equal layout reuses the compiled program
        k = (name, self.engine, tuple(self.mapper.devices), self.mapper.grid, self.spec,
             self.ensemble, self.every, self.check)  # fmt: skip
        if k not in self._fns:
            comm, spec, m = self.mapper.comm, self.spec, self.mapper
            if name == "chunk":
                ens, policy = self.ensemble, (self.every, self.check)

                def fn(s, nb, sp, pot, par, n, init):
                    return chunk_block(ens, spec, comm, sp, pot, par, s, nb, n, init, policy)

                self._fns[k] = m.map(fn, (SLOTS,) * 2 + (REPLICATED,) * 5, SLOTS)
            elif name == "thermo":
                self._fns[k] = m.map(
                    lambda s, sp: thermo_block(comm, sp, s), (SLOTS, REPLICATED), SLOTS
                )
        return self._fns[k]

    def _put(self, tree):
        """Host arrays ``(n_dev, ...)`` -> the devices, one entry per device (each process
        places only its own devices' entries). Under ``pmap`` the whole tree is placed by one
        program (``blocks.put_blocks``), not one per array shape (22 small compilations)."""
        m = self.mapper
        if m.kind.stacked:
            return blocks.put_blocks(jax.tree.map(lambda x: m.stack(x, SLOTS), tree), m.devices)
        return jax.tree.map(lambda x: m.place(x, SLOTS), tree)

    def _get(self, tree):
        """Host arrays ``(n_dev, ...)`` on every process (a collective across processes)."""
        return jax.tree.map(lambda x: self.mapper.gather(x, SLOTS), tree)

    def _first(self, x):
        """The value of a leaf replicated over the devices (error bits, needs, build count,
        step, thermo: reduced over all devices), read from this process's first device: no
        gather across processes (a synchronisation per call) on the chunk loop's path."""
        shards = getattr(x, "addressable_shards", None)
        local = shards[0].data if shards else self._get(x)
        return np.asarray(local).reshape((-1,) + np.shape(x)[1:])[0]

    # layout -------------------------------------------------------------------------------
    def global_state(self, state=None) -> dict:
        """The state as global host arrays in atom-id order (for output and checkpoints):
        ``position``, ``velocity``, ``force``, ``ref_position`` float[N, 3], ``mass``
        float[N], and ``key``, ``step``, ``e_pair``, ``virial``.

        Raises:
          SimulationError: the ids are not exactly ``0 .. N - 1`` ("lost atoms").
        """
        return collect(self._get(self.state if state is None else state),
                       self.spec.n_atoms)  # fmt: skip

    def _launch(self, g: dict, n_steps: int):
        """Lay out global arrays on the devices, rebuild lists and forces, run n steps."""
        while True:
            host, most = distribute(self.spec, self.space.box, g, int(g["step"]), g["key"],
                                    g["e_pair"], g["virial"])  # fmt: skip
            if most <= self.spec.capacity:
                break
            self._resize({"capacity": round8(self.capacity_factor * most)})
            self.regrows += 1
        state = self._put(DomainState(**host))
        lists = self._put(empty_lists(self.spec, host["position"].dtype))
        return self._fn("chunk")(state, lists, self.space, self.pot, self.params,
                                 np.int32(n_steps), True)  # fmt: skip

    def load(self, g: dict) -> None:
        """Lay out global arrays (as from ``global_state``, from any mesh) on this run's
        devices, growing capacities until everything fits. The ghosts and the list are
        rebuilt from ``ref_position``: the same list as when it was built."""
        self._pending = g
        self._advance(0)

    def _resize(self, caps: dict) -> None:
        """A new layout with the capacities ``caps`` (the others kept)."""
        old = {"capacity": self.spec.capacity, "migrate": self.spec.migrate,
               "send": self.spec.send, "max_neighbors": self.spec.nbr.max_neighbors,
               "column_capacity": self.spec.nbr.column_capacity}  # fmt: skip
        old.update(caps)
        self.spec = make_spec(
            self.spec.grid, np.asarray(self.space.box), self.spec.n_atoms,
            cutoff=float(self.pot.cutoff), skin=self.spec.skin, block=self.spec.nbr.block,
            **old,
        )  # fmt: skip

    # the regrow loop's hooks (step.Regrowing) ---------------------------------------------
    def _chunk(self, n_steps: int):
        if self._pending is not None:  # set-up, or the redo of a chunk after a regrow
            self._base = 1
            return self._launch(self._pending, n_steps)
        self._base = int(self._first(self.lists.n_builds))
        return self._fn("chunk")(self.state, self.lists, self.space, self.pot, self.params,
                                 np.int32(n_steps), False)  # fmt: skip

    def _error(self, lists) -> int:
        return int(self._first(lists.error))

    def _needed(self, lists):
        return self._first(lists.needed)

    def _regrow(self, lists) -> None:
        if self._pending is None:
            self._pending = self.global_state()  # the chunk's start: redo it in the new layout
        self._resize(grow(self.spec, self._needed(lists), self.capacity_factor))

    def _commit(self, state, lists) -> None:
        self.builds += int(self._first(lists.n_builds)) - self._base
        self.state, self.lists, self._pending = state, lists, None

    def _step_of(self, state) -> int:
        return int(self._first(state.step))

    # the driver's interface ---------------------------------------------------------------
    def advance(self, n_steps: int) -> None:
        """Run ``n_steps`` steps; on overflow regrow and redo the chunk from its start.

        Raises:
          SimulationError: lost atoms, or capacities still overflowing after
            ``max_regrows`` regrows (``error_codes.decode``); under a policy other than the
            exact one, lost atoms name the policy as the likely cause.
        """
        try:
            self._advance(n_steps)
        except SimulationError as err:
            if (self.every, self.check) == (1, True) or _LOST not in err.reason:
                raise
            policy = f"neighbors.every = {self.every}, neighbors.check = {str(self.check).lower()}"
            hint = (
                f"under the policy {policy} an atom may travel further than one sub-box "
                "between two neighbour builds, and migrating atoms move one sub-box per axis: "
                "use a smaller neighbors.every, neighbors.check = true, or fewer devices "
                f"along the thin axis; or {err.hint}"
            )
            raise SimulationError(err.step, err.reason, hint, err.checkpoint) from None

    def thermo(self) -> dict[str, float]:
        """Current thermo values (``observables.thermo`` keys) as Python floats."""
        out = self._fn("thermo")(self.state, self.space)
        return {k: float(self._first(v)) for k, v in out.items()}

    @property
    def step(self) -> int:
        """The step counter of the state (the same on every device)."""
        return int(self._first(self.state.step))

    def current_step(self) -> int:
        """The step counter of the state (``step``)."""
        return self.step

    @property
    def hops(self) -> tuple[int, int, int]:
        """Ghost hops per axis (``DomainSpec.hops``)."""
        return self.spec.hops

    @property
    def error(self) -> int:
        """The ``error_codes`` bits of the current lists (0 after every ``advance``)."""
        return self._error(self.lists)

    def snapshot(self) -> dict:
        """``global_state()``: global host arrays in atom-id order (``position``,
        ``velocity``, ``force`` float[N, 3], ``key``, ``step``, and ``ref_position``,
        ``mass``, ``e_pair``, ``virial``); checks the atom count and ids."""
        return self.global_state()

    def counts(self) -> np.ndarray:
        """Owned atoms per device (host)."""
        return (np.asarray(self._get(self.state.ids)) >= 0).sum(axis=1)


def _wrap_host(space: Space, r: np.ndarray) -> np.ndarray:
    """``space.wrap`` of host positions in NumPy: the same IEEE operations in ``r``'s dtype,
    so the same bits, without compiling four eager programs."""
    box = np.asarray(space.box).astype(r.dtype)
    return r - box * np.floor(r / box)


def make_domain_simulation(
    engine: str,
    mesh,
    space: Space,
    pot: PairPotential,
    position,
    velocity,
    *,
    mass=1.0,
    key=None,
    dt: float,
    ensemble: str = "nve",
    kt: float = 0.0,
    gamma: float = 0.0,
    skin: float = 0.3,
    step: int = 0,
    capacity_factor: float = 1.2,
    capacities: dict | None = None,
    devices=None,
    max_neighbors: int | None = None,
    restore: dict | None = None,
    every: int = 1,
    check: bool = True,
) -> DomainSimulation:
    """Set up a decomposed run (periodic box), like ``md.make_simulation``.

    Args:
      engine: ``"pmap"``, ``"shard_map"`` or ``"local"``.
      mesh: device-grid shape, 1 to 3 entries (e.g. ``(8,)``, ``(2, 4)``, ``(2, 2, 2)``).
      space: a periodic space; pot: the pair potential.
      position, velocity: float[N, 3] (atom ``i`` gets id ``i``); their dtype is the state's.
      capacities: optional initial capacities (keys of ``grow``'s result); too small values
        are repaired by regrowing.
      devices: devices to use (default ``jax.devices()[:prod(mesh)]``).
      max_neighbors: initial neighbour row length (default measured from the density).
      restore: global arrays in atom-id order as from ``DomainSimulation.global_state``
        (a checkpoint, from any mesh or engine): the run continues from them (``position``
        and ``velocity`` are then ignored), bit for bit on the same mesh.
      every, check: LAMMPS's ``neigh_modify every N check yes|no`` (``step.Provider``); the
        default, 1 and True, is the exact policy. Every policy follows ``single`` bitwise.
      Others as in ``md.make_simulation``.

    Raises:
      ConfigError: a sub-box thinner than cutoff + skin or too few devices.
      ValueError: an unknown ensemble or a bad ``every`` / ``check``.
    """
    if not space.periodic:
        raise ConfigError("system.boundary", "domain decomposition needs a periodic box")
    if ensemble not in md.ENSEMBLES:
        raise ValueError(f"ensemble must be one of {md.ENSEMBLES}, got {ensemble!r}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an integer >= 1 (steps), got {every!r}")
    if not isinstance(check, bool):
        raise ValueError(f"check must be True or False, got {check!r}")
    mesh = tuple(int(m) for m in mesh)
    grid = DeviceGrid(mesh, (True,) * len(mesh))
    devices = list(devices) if devices is not None else jax.devices()
    blocks.require_devices(mesh, len(devices))  # the one "needs N devices" check
    if mapping.kind(engine).one_device and grid.size != 1:
        raise ConfigError("--mesh", f"the local engine runs on one device, got mesh {mesh}")
    # on the host (NumPy: no set-up programs to compile); the dtype as jnp.asarray's
    position = np.asarray(position)
    dtype = jax.dtypes.canonicalize_dtype(position.dtype)
    position = position.astype(dtype)
    n = position.shape[0]
    box = np.asarray(space.box, np.float64)
    radius = float(pot.cutoff) + float(skin)
    check_mesh(mesh, box, radius, float(skin))
    position = _wrap_host(space, position)
    key = jax.random.PRNGKey(0) if key is None else key
    g = {
        "position": position,
        "velocity": np.asarray(velocity, dtype),
        "force": np.zeros_like(position),
        "ref_position": position,
        "mass": np.broadcast_to(np.asarray(mass, dtype), (n,)),
        "key": np.asarray(key, np.uint32),
        "step": step,
        "e_pair": 0.0,
        "virial": 0.0,
    }
    if restore is not None:
        g = dict(restore)
    caps = guess(grid, box, g["ref_position"], radius, float(skin), capacity_factor)
    if max_neighbors:
        caps["max_neighbors"] = int(max_neighbors)
    caps.update(capacities or {})
    spec = make_spec(grid, box, n, cutoff=float(pot.cutoff), skin=skin, **caps)
    mapper = Mapping(engine, grid, devices[: grid.size])
    sim = DomainSimulation(engine, ensemble, space, pot, md.make_params(dt, kt, gamma, dtype),
                           spec, mapper, capacity_factor=capacity_factor, every=every,
                           check=check)  # fmt: skip
    sim.load(g)
    sim.builds = 1
    return sim
