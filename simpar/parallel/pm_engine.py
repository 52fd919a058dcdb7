"""Particle-mesh programs on every engine: particles owned by sub-box, the grid as the FFT splits it.

A PM program (``simpar.particles.pm``) is written once for one block: the block's particles
(fixed-capacity buffers, id ``-1`` = empty slot) and its part of the grid. This module gives
it the transforms (``ops``), the halo ``comm`` and a particle ``migrate`` step, and maps it
over the devices. It imports no model: the program is passed in.

=============  ======================================  ==========================================
engine         particles                               grid, transforms, migrate
=============  ======================================  ==========================================
``single``     all ``N``, global arrays                whole grid, ``jnp.fft``, identity
``pmap``       ``(n_dev, P, ...)`` buffers by sub-box  blocks, per-block FFT, ``ghosts.migrate``
``shard_map``  ``(n_dev * P, ...)`` sharded by device  blocks, per-block FFT, ``ghosts.migrate``
``sharded``    all ``N`` (sharded along ``N`` when it  global view on ``NamedSharding`` arrays
               divides), global arrays                 (FFT transposes by ``shard_map``), identity
=============  ======================================  ==========================================

Sub-box ownership follows the FFT plan's real-space split: device ``c`` (grid coordinates, C
order over ``plan.mesh``) owns the nodes and the particles of ``[c_a n_a dx_a, (c_a + 1) n_a
dx_a)`` per axis. Particles that drift out move to the neighbour by ``ppermute``
(``simpar.parallel.ghosts.migrate``) at every step; what it needed (owned count, largest
migration count, a particle more than one sub-box away) is reduced over the devices at every
step (one all-reduce), so that the program stops every device at the first overflow (the
error bits and the regrow loop are the particles' own: ``simpar.particles.pm_sim``), and
:meth:`PMEngine.collect` checks that every id is present once.

What moves (compiled HLO, 16^3 on (2, 4), ``tests/test_pm.py``): under ``shard_map`` a step is
8 all-to-alls (the FFT's transposes), 11 collective-permutes (halo fold and fill, migration)
and one all-reduce (the migration needs), no all-gather. Under ``sharded`` XLA partitions the global-view deposit and
interpolation itself: the particles are split along ``N`` (not by sub-box), so every device
needs every particle's contribution to its grid block and XLA all-gathers the per-particle
scatter operands, 24 per step on (8,) and (2, 4): per CIC corner the int32 ``(N, 3)`` node
indices and the float ``(N,)`` weighted masses of the deposit and the indices again for the
interpolation (read from the HLO; ``tests/test_pm.py`` checks that no all-gather is larger
than ``3 N`` elements, i.e. the grid is never gathered). A ``shard_map`` deposit cannot remove
them without owning the particles by sub-box, which is what the ``shard_map`` engine does: it
is correct but not the scalable path; use ``shard_map`` or ``pmap`` for large runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from simpar import precision
from simpar.errors import ConfigError, SimulationError
from simpar.parallel import ghosts, mapping
from simpar.parallel.comm import LocalComm
from simpar.parallel.spectral_engine import SpectralEngine

PARTICLES = mapping.PARTICLES  # per-device particle buffers, split along the particle axis


class _MigrateSpec(NamedTuple):
    capacity: int
    migrate: int


class PMEngine:
    """Transforms, comm, particle placement and mapped programs of one PM run.

    Args:
      engine: ``"single"``, ``"pmap"``, ``"shard_map"`` or ``"sharded"``.
      shape: global grid ``(N_0, N_1, N_2)`` nodes (changing it recompiles).
      mesh: devices per spatial axis (``(8,)``, ``(2, 4)``; ignored for ``single``).
      box: box lengths ``(L_0, L_1, L_2)`` (length).
      capacity: particle slots per device (``pmap``/``shard_map``; default the larger of
        1.5 x the mean and 1.25 x the largest count at ``distribute``, rounded up to 8)
        (changing it recompiles).
      migrate: slots per axis and direction for particles changing device in one step
        (default a quarter of ``capacity``).
      key: the option or config key blamed when ``mesh`` does not fit the grid or the devices.

    Attributes:
      engine, plan, ops, comm (per-block comm, or a ``LocalComm`` for global arrays),
      box (tuple of floats), n_dev, decomposed (particles owned by sub-box).

    Raises:
      ConfigError: on ``key`` when the mesh does not divide the grid; on ``pm.capacity`` /
        ``pm.migrate`` for sizes below 1.
    """

    def __init__(
        self,
        engine: str,
        shape: Sequence[int],
        mesh: Sequence[int] = (1,),
        box: Sequence[float] = (1.0, 1.0, 1.0),
        capacity: int | None = None,
        migrate: int | None = None,
        key: str = "--mesh",
    ):
        shape = tuple(int(n) for n in shape)
        if len(shape) != 3 or len(box) != 3:
            raise ConfigError("pm.shape", f"PM needs a 3-D grid and box, got {shape}, {box}")
        self._se = SpectralEngine(engine, shape, mesh, real=True, key=key)
        self.engine = engine
        self.plan = self._se.plan
        self.ops = self._se.ops
        self.devices = self._se.devices
        self.mesh = self._se.mesh
        self.box = tuple(float(b) for b in box)
        self.n_dev = math.prod(self.plan.mesh)
        self.mapping = self._se.mapping
        self.decomposed = self.mapping.kind.per_block
        self.comm = self._se.comm if self.decomposed else LocalComm(3)
        for key, v in (("pm.capacity", capacity), ("pm.migrate", migrate)):
            if v is not None and int(v) < 1:
                raise ConfigError(key, f"must be a positive number of slots, got {v}")
        self.n_particles: int | None = None  # set by ``distribute``
        self.capacity = None if capacity is None else int(capacity)
        self.migrate_cap = None if migrate is None else int(migrate)
        self._names = None if self.mesh is None else tuple(self.mesh.axis_names)

    # -- particles: host <-> devices ------------------------------------------------------------
    def _owners(self, pos: np.ndarray) -> np.ndarray:
        flat = np.zeros(len(pos), np.int64)
        for a in range(3):
            n = self.plan.mesh[a]
            c = np.asarray(ghosts.owner(jnp.asarray(pos[:, a]), self.box[a], n))
            flat = flat * n + c
        return flat

    def distribute(self, pos, vel, mass, *extra):
        """Host arrays in id order -> placed ``(pos, vel, mass, ids, *extra)`` in the particle
        layout.

        Args:
          pos: ``(N, 3)`` positions (wrapped into the box here); vel: ``(N, 3)``; mass: ``(N,)``.
          *extra: more ``(N, ...)`` per-particle arrays placed like ``vel`` (e.g. the
            accelerations of a checkpoint; empty slots hold zeros).

        Returns:
          ``pmap``: ``(n_dev, P, ...)`` stacked buffers; ``shard_map``: ``(n_dev * P, ...)``;
          ``single``/``sharded``: ``(N, ...)`` with ``ids = 0 .. N-1``.

        Raises:
          ConfigError: on ``pm.capacity`` when a device would own more than ``capacity``; on
            ``pos``/``vel``/``mass`` when float64 and 64-bit JAX is off (``simpar.precision``:
            never run in float32 without a word).
        """
        pos = np.asarray(pos)
        for name, x in (("pos", pos), ("vel", vel), ("mass", mass)):
            precision.require_input(np.asarray(x), f"PMEngine.distribute({name})")
        pos = np.mod(pos, np.asarray(self.box, pos.dtype))  # keeps float32 float32
        vel, mass = np.asarray(vel), np.asarray(mass)
        extra = tuple(np.asarray(x) for x in extra)
        n = len(pos)
        self.n_particles = n
        if not self.decomposed:
            arrays = (pos, vel, mass, np.arange(n, dtype=np.int32), *extra)
            return tuple(self._put(x) for x in arrays)
        own = self._owners(pos)
        counts = np.bincount(own, minlength=self.n_dev)
        if self.capacity is None:
            need = max(1.5 * n / self.n_dev, 1.25 * counts.max(), 8)
            self.capacity = int(-(-int(need) // 8) * 8)
        if self.migrate_cap is None:
            self.migrate_cap = max(8, self.capacity // 4)
        if counts.max() > self.capacity:
            raise ConfigError(
                "pm.capacity",
                f"a device owns {counts.max()} particles, more than capacity {self.capacity}; "
                "raise pm.capacity",
            )
        cap = self.capacity
        bp = np.zeros((self.n_dev, cap, 3), pos.dtype)
        bv = np.zeros((self.n_dev, cap, 3), vel.dtype)
        bm = np.ones((self.n_dev, cap), mass.dtype)
        bi = np.full((self.n_dev, cap), -1, np.int32)
        bx = [np.zeros((self.n_dev, cap, *x.shape[1:]), x.dtype) for x in extra]
        for d in range(self.n_dev):
            sel = np.flatnonzero(own == d)
            k = len(sel)
            bp[d, :k], bv[d, :k], bm[d, :k], bi[d, :k] = pos[sel], vel[sel], mass[sel], sel
            for b, x in zip(bx, extra, strict=True):
                b[d, :k] = x[sel]
        return tuple(self._put(x) for x in (bp, bv, bm, bi, *bx))

    def _put(self, x: np.ndarray):
        if self.decomposed:  # (n_dev, P, ...) buffers: P slots per device, flattened
            x = x.reshape(-1, *x.shape[2:])
        return self.mapping.place(x, mapping.PARTICLES)

    def _gather(self, x) -> np.ndarray:
        """A placed particle array -> host ``(n_dev * P, ...)`` (``(N, ...)`` undecomposed)."""
        return self.mapping.gather(x, mapping.PARTICLES)

    def collect(self, arrays, step: int = 0):
        """Placed ``(pos, vel, mass, ids, ...)`` -> host arrays of the ``N`` particles in id order.

        Raises:
          SimulationError: when an id is missing or present twice (a particle was lost).
        """
        host = []
        for x in arrays:
            host.append(self._gather(x))
        ids = host[3]
        keep = ids >= 0
        got = np.sort(ids[keep])
        if len(got) != self.n_particles or np.any(got != np.arange(self.n_particles)):
            raise SimulationError(
                step,
                f"particle count {len(got)} (unique {len(np.unique(got))}) != "
                f"{self.n_particles}: particles were lost",
                "raise pm.capacity / pm.migrate or reduce time.dt",
            )
        order = np.argsort(ids[keep], kind="stable")
        return tuple(h[keep][order] for h in host)

    # -- per-block helpers for the program ---------------------------------------------------------
    def migrate_fn(self) -> Callable:
        """``migrate(pos, vel, mass, ids) -> (pos, vel, mass, ids, needed)`` for the program.

        ``needed``: int32 ``(3,)``, the maxima over all devices (``comm.pmax``: the same on
        every device) of the owned count before truncation, the largest migration count of
        one axis and direction, and 1 if a particle moved more than one sub-box. Compare the
        first two with :meth:`capacities`. Identity (zeros) on ``single``/``sharded``.
        """
        if not self.decomposed:
            return lambda p, v, m, i: (p, v, m, i, jnp.zeros(3, jnp.int32))
        comm, box = self.comm, self.box

        def migrate(pos, vel, mass, ids):
            # capacities are read when the program is traced (after ``distribute`` sized them)
            spec = _MigrateSpec(pos.shape[0], self.migrate_cap)
            length = jnp.asarray(box, pos.dtype)
            p, v, m, _, i, need, count, far = ghosts.migrate(
                spec, comm, length, pos, vel, mass, pos, ids
            )
            return p, v, m, i, comm.pmax(jnp.stack([count, need, far.astype(jnp.int32)]))

        return migrate

    def capacities(self) -> tuple[int, int] | None:
        """``(capacity, migrate)`` slots (the limits of ``migrate_fn``'s first two needs), or
        None when the particles do not migrate (``single``/``sharded``)."""
        return (self.capacity, self.migrate_cap) if self.decomposed else None

    def owned_counts(self, pos) -> np.ndarray:
        """Particles each device would own (host ``(n_dev,)`` int) for positions ``pos``
        ``(N, 3)`` (wrapped into the box here)."""
        pos = np.mod(np.asarray(pos), np.asarray(self.box, np.asarray(pos).dtype))
        return np.bincount(self._owners(pos), minlength=self.n_dev)

    def per_device(self, x, width: int) -> np.ndarray:
        """Per-device results of a mapped program (declared ``PARTICLES``) on the host,
        ``(n_blocks, width)`` (one row on ``single``/``sharded``)."""
        return np.asarray(self._gather(x)).reshape(-1, width)

    # -- mapped programs -------------------------------------------------------------------------
    def map(self, fn: Callable, in_layouts: Sequence, out_layouts, donate: bool = False):
        """``fn`` on every device; layouts ``PARTICLES`` (a pytree of particle buffers) or
        ``None`` (replicated: parameters, step counts), mapped by ``simpar.parallel.mapping``.

        Under ``pmap``/``shard_map`` ``fn`` sees one device's buffers; per-device results
        (e.g. flags) are declared ``PARTICLES`` and come back stacked.
        """
        return self.mapping.map(fn, tuple(in_layouts), out_layouts, donate=donate)


__all__ = ["PARTICLES", "PMEngine"]
