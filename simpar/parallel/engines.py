"""Engines: where each block of a grid model lives and how its halo arrives.

The same per-block step (``advance_block``, ``simpar.parallel.grid_block``) runs under four
engines, each a thin user of ``simpar.parallel.blocks`` (meshes, mapped programs, transfers):

=========== ================================================================================
``single``   one device; the block is the whole domain, boundary conditions fill the halo.
``pmap``     ``jax.pmap`` over one flat axis of the ``DeviceGrid`` (nested pmap is broken in
             current JAX); halos by ``lax.ppermute``; row profiles by ``axis_index_groups``.
``shard_map`` ``jax.shard_map`` on a named mesh ``("x", "y"[, "z"])``; ``ppermute`` along one
             mesh axis; row profiles by ``psum`` over a sub-set of the mesh axes.
``sharded``  the state is a global ``jax.Array`` with ``NamedSharding`` on an ``Auto`` mesh;
             the step is jit-compiled on the global view of all blocks at once
             (``BlockedComm``) and XLA inserts the communication: one collective-permute
             per halo slab, nothing else (``tests/test_sharded_hlo.py``).
=========== ================================================================================

Each engine jit-compiles a chunk of ``n`` steps (``lax.fori_loop`` over exchanges), keeps the
state on its devices between chunks, and is asked for diagnostics only between chunks.

``place -> advance -> gather`` compose with ``jax.grad``, ``jax.vmap`` and ``jax.jit``: given
traced values, ``place`` and ``gather`` are JAX operations (a sharding constraint, or the
reshape/transpose of ``pmap``'s block layout and its inverse) and ``gather`` returns a
``jax.Array``; given concrete values, ``gather`` returns host NumPy arrays. ``advance`` never
consumes its input unless asked (``donate=True``, which the driver uses to halve the memory
of a run).
A halo of width ``w`` lets the per-block engines take ``w // radius`` steps per exchange.
Changing the engine, the mesh, the halo width, the grid shape or ``n`` recompiles.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from simpar.errors import ConfigError
from simpar.parallel import blocks
from simpar.parallel.blocks import ENGINES, check_live, gather_blocks, to_host
from simpar.parallel.grid_block import GridModel, Params, State, advance_block, observe_block
from simpar.parallel.halo import (
    BlockedComm,
    LocalComm,
    PmapComm,
    ShardMapComm,
    from_blocks,
    pad,
    to_blocks,
)
from simpar.parallel.topology import DeviceGrid, make_device_grid

__all__ = ["ENGINES", "Engine", "GridModel", "advance_block", "make_engine", "observe_block"]


def _traced(state) -> bool:
    """True when any leaf is a tracer (inside ``jax.grad``, ``vmap``, ``jit``, ...)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(state))


def _array(u):
    """``jax.Array``s (and tracers) as they are; anything else as a NumPy array."""
    return u if isinstance(u, jax.Array) else np.asarray(u)


# --------------------------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------------------------
class Engine:
    """Runs a grid model on a set of devices.

    Args:
      model: the grid model.
      domain_shape: global cells per spatial axis, e.g. ``(256, 256)``.
      grid: the device grid (``(1,)*d`` for ``single``).
      halo: halo width ``w >= model.radius``.
      devices: the devices to use (``grid.size`` of them).
    """

    name = "base"

    def __init__(self, model: GridModel, domain_shape, grid: DeviceGrid, halo: int, devices):
        self.model = model
        self.domain_shape = tuple(int(n) for n in domain_shape)
        self.grid = grid
        self.halo = int(halo)
        self.devices = list(devices)
        self._advance = {}
        self._observe = None

    # State placement -------------------------------------------------------------------------
    def place(self, state: dict) -> State:
        """Put a whole-domain state on the engine's devices in its layout.

        Args:
          state: field name -> array ``(*lead, N_0, ..., N_{d-1})`` (NumPy, ``jax.Array`` or a
            tracer under ``jax.grad``/``vmap``/``jit``; traced values stay traced).

        Returns:
          The engine's layout: whole-domain arrays (``single``), globally sharded arrays
          (``shard_map``, ``sharded``) or stacked blocks ``(n_dev, *lead, n_0, ...)``
          (``pmap``). The input is never modified or consumed.
        """
        raise NotImplementedError

    def gather(self, state: State) -> dict:
        """The whole-domain state from the engine's layout (inverse of :meth:`place`).

        Concrete arrays come back as host NumPy arrays (on every process of a multi-process
        run); traced arrays (under ``jax.grad``/``vmap``/``jit``) as traced ``jax.Array``s,
        so that a loss on the gathered fields can be differentiated.
        """
        if _traced(state):
            return dict(state)
        check_live(state, f"{self.name} engine gather")
        return {f: to_host(u) for f, u in state.items()}

    # Running ---------------------------------------------------------------------------------
    def advance(self, state: State, params: Params, n: int, *, donate: bool = False) -> State:
        """Advance ``n`` steps on the devices (compiled once per distinct ``n`` and ``donate``).

        Args:
          state: the placed state (from :meth:`place` or a previous ``advance``).
          params: model parameters (array leaves; differentiable).
          n: number of steps (static: a new ``n`` compiles a new chunk program).
          donate: let the result reuse ``state``'s buffers. ``state`` is then deleted and must
            not be used again: :meth:`advance`, :meth:`observe` and :meth:`gather` then raise
            ``blocks.DonatedStateError`` (JAX itself has crashed the interpreter on a reused
            donated buffer under ``pmap``/``shard_map``/``sharded``). Default ``False``:
            ``state`` stays valid.

        Raises:
          DonatedStateError: ``state`` was donated to an earlier call.
        """
        check_live(state, f"{self.name} engine advance")
        key = (int(n), bool(donate))
        if key not in self._advance:
            self._advance[key] = self._compile_advance(int(n), donate=bool(donate))
        return self._advance[key](state, params)

    def observe(self, state, params: Params) -> dict[str, np.ndarray]:
        """Diagnostics as host NumPy values (scalars and 1-D profiles)."""
        check_live(state, f"{self.name} engine observe")
        if self._observe is None:
            self._observe = self._compile_observe()
        return {k: to_host(v) for k, v in self._observe(state, params).items()}

    def _compile_advance(self, n: int, donate: bool = False):
        raise NotImplementedError

    def _whole_domain_advance(self, n: int):
        """``advance_block`` on a block that is the whole domain (``single``)."""
        comm = LocalComm(self.model.ndim)
        return functools.partial(advance_block, n=n, model=self.model, comm=comm, w=self.halo)

    def _whole_domain_observe(self):
        """``observe_block`` on a block that is the whole domain (the global view)."""
        return functools.partial(
            observe_block,
            model=self.model,
            comm=LocalComm(self.model.ndim),
            global_shape=self.domain_shape,
        )

    def _compile_observe(self):
        raise NotImplementedError

    def lowered_advance(self, state, params, n: int):
        """The lowered chunk program (tests read its compiled HLO)."""
        return self._compile_advance(n).lower(state, params)


class SingleEngine(Engine):
    """One device; boundary conditions fill the halo."""

    name = "single"

    def place(self, state):
        check_live(state, f"{self.name} engine place")
        return {f: blocks.place(u, self.devices[0]) for f, u in state.items()}

    def _compile_advance(self, n, donate=False):
        return jax.jit(self._whole_domain_advance(n), donate_argnums=0 if donate else ())

    def _compile_observe(self):
        return jax.jit(self._whole_domain_observe())


class ShardedEngine(Engine):
    """Global ``jax.Array`` with ``NamedSharding``; XLA partitions a jit-compiled global step.

    The step is ``advance_block``, the per-block program of the other engines, applied once to
    the global view of all blocks: each field is reshaped to ``(*grid.shape, *lead, n_0, ...)``
    (no data moves: device ``i`` holds block ``i``) and the halo is exchanged by ``BlockedComm``,
    a roll of the boundary slabs along a grid axis, which XLA compiles into collective-permutes
    of those slabs; the code has no explicit collective. Padding the global field itself (``N + 2w`` cells do not divide over the
    devices) made XLA re-lay out whole fields every step.
    """

    name = "sharded"

    def __init__(self, *args):
        super().__init__(*args)
        self.mesh = blocks.make_mesh(self.grid.shape, self.grid.axis_names, self.devices)

    def sharding(self, ndim: int) -> NamedSharding:
        """``NamedSharding`` of a global field with ``ndim`` axes: spatial axes split over the
        mesh, leading component axes whole."""
        lead = (None,) * (ndim - self.model.ndim)
        return blocks.sharding(self.mesh, *lead, *self.grid.axis_names)

    def _block_sharding(self, ndim: int) -> NamedSharding:
        rest = (None,) * (ndim - self.grid.ndim)
        return blocks.sharding(self.mesh, *self.grid.axis_names, *rest)

    def place(self, state):
        # tracers: a sharding constraint; device arrays: a copy in the layout; host data:
        # each process materialises only the shards its own devices hold
        check_live(state, f"{self.name} engine place")
        return {f: blocks.place(u, self.sharding(np.ndim(u))) for f, u in state.items()}

    def _compile_advance(self, n, donate=False):
        g, d = self.grid.shape, self.model.ndim
        pin = lax.with_sharding_constraint
        comm = BlockedComm(self.grid)

        def step(state, params):
            blocks = {}
            for k, v in state.items():
                b = to_blocks(v, g, d)
                blocks[k] = pin(b, self._block_sharding(b.ndim))
            out = advance_block(blocks, params, n, model=self.model, comm=comm, w=self.halo)
            # keep the result laid out like the input (no silent resharding between chunks)
            return {k: pin(from_blocks(v, g, d), self.sharding(v.ndim - d)) for k, v in out.items()}

        return jax.jit(step, donate_argnums=0 if donate else ())

    def _compile_observe(self):
        """Field sums and profiles in the global view; the model's halo-reading sums
        (``local_sums``, e.g. the wave energy's Laplacian) on the blocks, padded like a step."""
        model = self.model
        fields = functools.partial(
            observe_block,
            model=dataclasses.replace(model, local_sums=None),
            comm=LocalComm(model.ndim),
            global_shape=self.domain_shape,
        )
        if model.local_sums is None:
            return jax.jit(fields)
        comm = BlockedComm(self.grid)
        g, d = self.grid.shape, model.ndim

        def run(state, params):
            out = fields(state, params)
            padded = {}
            for f, u in state.items():
                b = lax.with_sharding_constraint(
                    to_blocks(u, g, d), self._block_sharding(u.ndim + d)
                )
                padded[f] = pad(b, model.radius, model.bcs[f], comm)
            out.update(model.local_sums(padded, params))
            return out

        return jax.jit(run)


class ShardMapEngine(ShardedEngine):
    """The per-block step under ``jax.shard_map`` with ``ppermute`` along mesh axes."""

    name = "shard_map"

    def _specs(self, state_like):
        return {f: self.sharding(np.ndim(u)).spec for f, u in state_like.items()}

    params_spec = P()  # parameters are replicated (ensembles: split by member)

    def _per_block(self, fn):
        """The per-block function as ``shard_map`` calls it (ensembles strip a member axis)."""
        return fn

    def _observe_specs(self, state, params):
        shapes = jax.eval_shape(self._whole_domain_observe(), state, params)
        last = self.grid.axis_names[-1]
        return {k: (P(last) if v.ndim == 1 else P()) for k, v in shapes.items()}

    def _compile_advance(self, n, donate=False):
        comm = ShardMapComm(self.grid)
        f = functools.partial(advance_block, n=n, model=self.model, comm=comm, w=self.halo)
        f = self._per_block(f)

        def step(state, params):
            specs = self._specs(state)
            return blocks.shard_map(f, self.mesh, (specs, self.params_spec), specs)(state, params)

        return jax.jit(step, donate_argnums=0 if donate else ())

    def _compile_observe(self):
        comm = ShardMapComm(self.grid)
        obs = functools.partial(
            observe_block, model=self.model, comm=comm, global_shape=self.domain_shape
        )
        obs = self._per_block(obs)

        def run(state, params):
            return blocks.shard_map(
                obs,
                self.mesh,
                (self._specs(state), self.params_spec),
                self._observe_specs(state, params),
            )(state, params)

        return jax.jit(run)


class PmapEngine(Engine):
    """One flat ``pmap`` axis over the device grid; blocks stacked on a leading device axis."""

    name = "pmap"

    def _blocks(self, u: np.ndarray) -> np.ndarray:
        """Global ``(*lead, N_0, ..., N_{d-1})`` -> ``(n_dev, *lead, n_0, ..., n_{d-1})``."""
        b = to_blocks(u, self.grid.shape, self.model.ndim)
        return b.reshape(self.grid.size, *b.shape[self.grid.ndim :])

    def _unblocks(self, b: np.ndarray) -> np.ndarray:
        return from_blocks(
            b.reshape(*self.grid.shape, *b.shape[1:]), self.grid.shape, self.model.ndim
        )

    def place(self, state):
        if _traced(state):
            # the pmapped chunk distributes the stacked blocks itself
            return {f: self._blocks(u) for f, u in state.items()}
        check_live(state, f"{self.name} engine place")
        # block i on device i; in a multi-process run each process places its own blocks
        return {
            f: blocks.put_blocks(self._blocks(_array(u)), self.devices) for f, u in state.items()
        }

    def gather(self, state):
        if _traced(state):
            return {f: self._unblocks(u) for f, u in state.items()}
        check_live(state, f"{self.name} engine gather")
        return {f: self._unblocks(gather_blocks(u)) for f, u in state.items()}

    def _compile_advance(self, n, donate=False):
        comm = PmapComm(self.grid, blocks.PMAP_AXIS)
        f = functools.partial(advance_block, n=n, model=self.model, comm=comm, w=self.halo)
        return blocks.pmap(f, self.devices, in_axes=(0, None), donate=donate)

    def _compile_observe(self):
        comm = PmapComm(self.grid, blocks.PMAP_AXIS)
        obs = blocks.pmap(
            functools.partial(
                observe_block, model=self.model, comm=comm, global_shape=self.domain_shape
            ),
            self.devices,
            in_axes=(0, None),
        )
        # the devices at coordinate 0 of every axis but the last hold one profile segment each
        column = [
            self.grid.index((0,) * (self.grid.ndim - 1) + (j,)) for j in range(self.grid.shape[-1])
        ]

        def run(state, params):
            out = {k: gather_blocks(v) for k, v in obs(state, params).items()}
            return {
                k: (np.concatenate([v[i] for i in column]) if v.ndim == 2 else v[0])
                for k, v in out.items()
            }

        return run


_ENGINE_CLASSES = {c.name: c for c in (SingleEngine, PmapEngine, ShardMapEngine, ShardedEngine)}


def make_engine(
    name: str,
    model: GridModel,
    domain_shape: Sequence[int],
    mesh: Sequence[int] | None = None,
    halo: int | None = None,
    devices=None,
) -> Engine:
    """Build an engine for ``model`` on a ``domain_shape`` grid.

    Args:
      name: one of ``ENGINES``.
      model: the grid model.
      domain_shape: global cells per spatial axis.
      mesh: device-grid shape (default: all given devices along x); ``single`` runs on one
        device and ignores it, as ``simpar run --engine single --mesh 2x4`` does, so one
        mesh serves a loop over every engine.
      halo: halo width (default ``model.radius``).
      devices: devices to use (default ``jax.devices()``, the first ``prod(mesh)``).

    Raises:
      ConfigError: unknown engine, too few devices, or a mesh that does not tile the domain.
    """
    blocks.check_engine(name)
    available = list(devices) if devices is not None else jax.devices()
    mesh = blocks.default_mesh(name, mesh, len(available))
    if halo is None:
        # 4 steps per exchange by default: one halo fill then four fused stencil passes ran
        # 2x faster than a fill per step (experiments/bench_heat.py); capped by the block size
        sizes = [
            n // m
            for n, m in zip(domain_shape, tuple(mesh) + (1,) * len(domain_shape), strict=False)
        ]
        halo = max(model.radius, min(4 * model.radius, min(sizes)) // model.radius * model.radius)
    halo = int(halo)
    if halo < model.radius:
        raise ConfigError(
            "parallel.halo",
            f"halo width {halo} is below the stencil radius {model.radius} of model {model.name}",
        )
    blocks.require_one_process(name)
    grid = make_device_grid(mesh, domain_shape, model.periodic, halo)
    blocks.require_devices(grid.shape, len(available))
    return _ENGINE_CLASSES[name](model, domain_shape, grid, halo, available[: grid.size])
