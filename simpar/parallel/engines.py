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

from simpar.errors import ConfigError
from simpar.parallel import blocks, mapping
from simpar.parallel.blocks import check_live, to_host
from simpar.parallel.comm import LocalComm
from simpar.parallel.grid_block import GridModel, Params, State, advance_block, observe_block
from simpar.parallel.halo import pad, to_blocks
from simpar.parallel.mapping import ENGINES, REPLICATED, Blocks, Mapping, grid_blocks
from simpar.parallel.topology import DeviceGrid, make_device_grid

__all__ = ["ENGINES", "Engine", "GridModel", "advance_block", "make_engine", "observe_block"]


def _traced(state) -> bool:
    """True when any leaf is a tracer (inside ``jax.grad``, ``vmap``, ``jit``, ...)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(state))


def _fmt(shape) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"


class Engine:
    """Runs a grid model on a set of devices: a thin user of ``simpar.parallel.mapping``.

    The fields are laid out as grid blocks (``mapping.grid_blocks``); the chunk program is
    ``advance_block`` (the per-block program, with the mapping's ``comm``; ``sharded`` runs it on
    the blocked global view with ``BlockedComm``), the diagnostics ``observe_block``.

    Args:
      name: the engine (``ENGINES``).
      model: the grid model.
      domain_shape: global cells per spatial axis, e.g. ``(256, 256)``.
      grid: the device grid (``(1,)*d`` for ``single``).
      halo: halo width ``w >= model.radius``.
      devices: the devices to use (``grid.size`` of them, ``members x`` for an ensemble).
      members: ensemble members (``None``: no ensemble; ``simpar.parallel.ensemble``).

    Attributes:
      name, model, domain_shape, grid, halo, devices, mapping, mesh (``shard_map``/``sharded``),
      members (ensembles only).
    """

    def __init__(
        self,
        name: str,
        model: GridModel,
        domain_shape,
        grid: DeviceGrid,
        halo: int,
        devices,
        members: int | None = None,
    ):
        self.name = name
        self.model = model
        self.domain_shape = tuple(int(n) for n in domain_shape)
        self.grid = grid
        self.halo = int(halo)
        self.mapping = Mapping(name, grid, devices, members)
        self.devices = self.mapping.devices
        self.mesh = self.mapping.mesh
        if members is not None:
            self.members = int(members)
        self._field = grid_blocks(model.ndim)
        self._advance = {}
        self._observe = None
        self._obs_layouts = {}

    def sharding(self, ndim: int):
        """Where a global field with ``ndim`` axes lives (``NamedSharding`` on the mesh
        engines): spatial axes split over the mesh, leading axes whole. Nothing is allocated."""
        return self.mapping.sharding(self._field, ndim)

    # State placement -------------------------------------------------------------------------
    def check_state(self, state: dict) -> None:
        """``ValueError`` unless ``state`` has the model's fields with the domain's shape.

        One line per problem: a wrong or missing name lists the expected names; a field whose
        spatial axes are the domain's reversed says to transpose it (netCDF files store
        ``(time, y, x)``, the engines take ``(x, y)``); another shape names the expected one; a
        non-numeric dtype is refused.
        """
        expected = sorted(self.model.bcs)
        if not isinstance(state, dict) or sorted(state) != expected:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(
                f"{self.name} engine place: model {self.model.name} has fields {expected}, "
                f"got {got}"
            )
        d, shape = self.model.ndim, self.domain_shape
        members = getattr(self, "members", None)
        for f, u in state.items():
            s = tuple(np.shape(u))
            spatial = s[len(s) - d :] if len(s) >= d else s
            lead = "(members, ...) " if members is not None else ""
            want = ((members,) if members is not None else ()) + shape
            if spatial != shape:
                if spatial == shape[::-1] and shape != shape[::-1]:
                    raise ValueError(
                        f"{self.name} engine place: field {f!r} has shape {_fmt(s)}, the "
                        f"transpose of the domain {_fmt(shape)}; transpose: files store "
                        "(time, y, x), the engines take (x, y) (e.g. u.T or np.swapaxes)"
                    )
                raise ValueError(
                    f"{self.name} engine place: field {f!r} has shape {_fmt(s)}; expected "
                    f"{lead}(..., {', '.join(map(str, shape))}), e.g. {_fmt(want)}"
                )
            if members is not None and (len(s) == d or s[0] != members):
                raise ValueError(
                    f"{self.name} engine place: field {f!r} has shape {_fmt(s)}; an ensemble "
                    f"of {members} members expects {_fmt(want)} (members first)"
                )
            dt = np.dtype(u.dtype if hasattr(u, "dtype") else np.asarray(u).dtype)
            if dt.kind not in "biufc":
                raise ValueError(
                    f"{self.name} engine place: field {f!r} has dtype {dt}; expected a numeric "
                    "array (float fields, int/bool masks)"
                )

    def place(self, state: dict) -> State:
        """Put a whole-domain state on the engine's devices in its layout.

        Args:
          state: field name -> array ``(*lead, N_0, ..., N_{d-1})`` (NumPy, ``jax.Array`` or a
            tracer under ``jax.grad``/``vmap``/``jit``; traced values stay traced); the names,
            spatial shape and dtypes are checked (:meth:`check_state`).

        Returns:
          The engine's layout: whole-domain arrays (``single``), globally sharded arrays
          (``shard_map``, ``sharded``) or stacked blocks ``(n_dev, *lead, n_0, ...)``
          (``pmap``). The input is never modified or consumed.

        Raises:
          ValueError: wrong field names, shapes or dtypes.
        """
        if not _traced(state):
            check_live(state, f"{self.name} engine place")
        self.check_state(state)
        return {f: self.mapping.place(u, self._field) for f, u in state.items()}

    def gather(self, state: State) -> dict:
        """The whole-domain state from the engine's layout (inverse of :meth:`place`).

        Concrete arrays come back as host NumPy arrays (on every process of a multi-process
        run); traced arrays (under ``jax.grad``/``vmap``/``jit``) as traced ``jax.Array``s,
        so that a loss on the gathered fields can be differentiated.
        """
        if not _traced(state):
            check_live(state, f"{self.name} engine gather")
        return {f: self.mapping.gather(u, self._field) for f, u in state.items()}

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
          ConfigError: on ``model.radius`` when the model's ``update`` does not crop its
            padded input by ``radius`` cells per side (checked before anything is compiled).
        """
        check_live(state, f"{self.name} engine advance")
        key = (int(n), bool(donate))
        if key not in self._advance:
            self.check_update(state, params)
            self._advance[key] = self._compile_advance(int(n), donate=bool(donate))
        return self._advance[key](state, params)

    def check_update(self, state: State, params: Params) -> None:
        """``ConfigError`` naming ``radius``, ``crop`` and the expected block shape unless
        ``model.update`` maps a block padded by ``radius`` to the block (abstractly, nothing
        runs)."""
        m, d, r = self.model, self.model.ndim, self.model.radius
        skip = 1 if (self.mapping.kind.stacked or getattr(self, "members", None)) else 0
        shape = tuple(n + 2 * r for n in self.domain_shape)

        def padded(u):
            lead = tuple(np.shape(u))[skip : np.ndim(u) - d]
            return jax.ShapeDtypeStruct(lead + shape, u.dtype)

        def one(p):
            s = np.shape(p)[1:] if getattr(self, "members", None) else np.shape(p)
            return jax.ShapeDtypeStruct(s, jax.numpy.result_type(p))

        try:
            out = jax.eval_shape(
                m.update, {f: padded(u) for f, u in state.items()}, jax.tree.map(one, params)
            )
        except Exception:  # noqa: BLE001 (the compiled step reports its own errors)
            return
        for f in state:
            got = tuple(out[f].shape[-d:]) if f in out else None
            if got != self.domain_shape:
                raise ConfigError(
                    "model.radius",
                    f"model {m.name}: update returned field {f!r} with spatial shape {got} "
                    f"from a block padded to {_fmt(shape)}; with radius = {r} it must return "
                    f"the block {_fmt(self.domain_shape)} (crop(u, radius, ndim): the crop must "
                    "match radius)",
                )

    def observe(self, state, params: Params) -> dict[str, np.ndarray]:
        """Diagnostics as host NumPy values (scalars and 1-D profiles)."""
        check_live(state, f"{self.name} engine observe")
        if self._observe is None:
            self._observe = self._compile_observe()
        out = self._observe(state, params)
        return {
            k: to_host(self.mapping.gather(v, self._obs_layouts.get(k, REPLICATED)))
            for k, v in out.items()
        }

    def _blocked(self) -> bool:
        """``sharded`` without members: the per-block step on the blocked global view."""
        return self.mapping.kind.partitioned and self.mapping.members is None

    def _compile_advance(self, n: int, donate: bool = False):
        m = self.mapping
        comm = m.blocked_comm if self._blocked() else m.comm
        f = functools.partial(advance_block, n=n, model=self.model, comm=comm, w=self.halo)
        field = self._field
        return m.map(
            f,
            (field, REPLICATED),
            lambda out: {k: field for k in out},
            donate=donate,
            blocked=self._blocked(),
        )

    def _observe_layouts(self, out) -> dict:
        """Scalars replicated, profiles split along the last mesh axis."""
        prof = Blocks(((self.grid.ndim - 1,),), 0)
        lay = {k: (prof if v.ndim == 1 else REPLICATED) for k, v in out.items()}
        self._obs_layouts = lay
        return lay

    def _compile_observe(self):
        m = self.mapping
        if self._blocked():
            return self._blocked_observe()
        obs = functools.partial(
            observe_block, model=self.model, comm=m.comm, global_shape=self.domain_shape
        )
        return m.map(obs, (self._field, REPLICATED), self._observe_layouts)

    def _blocked_observe(self):
        """Field sums and profiles in the global view; the model's halo-reading sums
        (``local_sums``, e.g. the wave energy's Laplacian) on the blocks, padded like a step."""
        model, m = self.model, self.mapping
        fields = functools.partial(
            observe_block,
            model=dataclasses.replace(model, local_sums=None),
            comm=LocalComm(model.ndim),
            global_shape=self.domain_shape,
        )
        if model.local_sums is None:
            return jax.jit(fields)
        g, d = self.grid.shape, model.ndim

        def run(state, params):
            out = fields(state, params)
            padded = {}
            for f, u in state.items():
                b = to_blocks(u, g, d)
                spec = (*self.grid.axis_names, *(None,) * (b.ndim - len(g)))
                b = lax.with_sharding_constraint(b, blocks.sharding(self.mesh, *spec))
                padded[f] = pad(b, model.radius, model.bcs[f], m.blocked_comm)
            out.update(model.local_sums(padded, params))
            return out

        return jax.jit(run)

    def lowered_advance(self, state, params, n: int):
        """The lowered chunk program (tests read its compiled HLO)."""
        return self._compile_advance(n).lower(state, params)


def default_halo(model: GridModel, domain_shape: Sequence[int], mesh: Sequence[int]) -> int:
    """4 steps per exchange by default: one halo fill then four fused stencil passes ran 2x
    faster than a fill per step (experiments/bench_heat.py); capped by the block size."""
    sizes = [
        n // m for n, m in zip(domain_shape, tuple(mesh) + (1,) * len(domain_shape), strict=False)
    ]
    return max(model.radius, min(4 * model.radius, min(sizes)) // model.radius * model.radius)


def engine_grid(name, model, domain_shape, mesh, halo, available, members: int = 1):
    """``(mesh, halo, grid)`` of a grid engine, checked (``make_engine``, ensembles)."""
    mapping.check_engine(name)
    mesh = mapping.default_mesh(name, mesh, len(available), members)
    halo = default_halo(model, domain_shape, mesh) if halo is None else int(halo)
    if halo < model.radius:
        raise ConfigError(
            "parallel.halo",
            f"halo width {halo} is below the stencil radius {model.radius} of model {model.name}",
        )
    mapping.require_one_process(name)
    grid = make_device_grid(mesh, domain_shape, model.periodic, halo)
    return halo, grid


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
    available = list(devices) if devices is not None else jax.devices()
    halo, grid = engine_grid(name, model, domain_shape, mesh, halo, available)
    blocks.require_devices(grid.shape, len(available))
    return Engine(name, model, domain_shape, grid, halo, available[: grid.size])
