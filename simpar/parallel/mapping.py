"""One mapping under every engine: engine + device grid + devices, and what each value is.

Every family (grid models, ensembles, the N-body ring, spectral models, particle-mesh and the
decomposed MD) is a thin user of :class:`Mapping`. A family supplies only

- *layouts*: how each input and output of a per-block program splits over the devices, and
- *per-block programs*: pure functions of one block that talk to their neighbours through
  :attr:`Mapping.comm` (``simpar.parallel.comm``).

The mapping does the rest: it builds the mesh, places host arrays on the devices
(:meth:`Mapping.place`), gathers them back as global NumPy arrays (:meth:`Mapping.gather`) and
maps a per-block program over the devices (:meth:`Mapping.map`):

=============  =========================================  ====================================
engine         the program                                placed values
=============  =========================================  ====================================
``single``     ``jax.jit`` of the program on one device   whole arrays on ``devices[0]``
``pmap``       ``jax.pmap`` over one flat axis ``"dev"``  blocks stacked ``(n_dev, ...)``
``shard_map``  ``jax.shard_map`` on a mesh, jitted    global arrays, ``NamedSharding``
``sharded``    ``jax.jit`` with ``out_shardings``; XLA    global arrays, ``NamedSharding``
               partitions the global view
=============  =========================================  ====================================

The layout vocabulary (``simpar.parallel.layouts``): :data:`REPLICATED`, :class:`Blocks`
(:func:`grid_blocks`: grid blocks, the program pads its halo; :func:`pencils`: an FFT plan's
real or Fourier layout), :data:`PARTICLES` (particle slots, split along axis 0) and
:data:`SLOTS` (one entry per device). Ensemble members on device groups:
``Mapping(..., members=m)`` gives every value a leading member axis; member ``k`` runs on its
own group of ``grid.size`` devices (``pmap``: the ``k``-th group of consecutive devices;
``shard_map``/``sharded``: a mesh axis ``"member"``; ``single``: ``jax.vmap``); within an
ensemble :data:`REPLICATED` means one value per member.

This module is the only one that compares engine names (besides the command line's option
parsing); other modules ask an :class:`EngineKind` (``kind(engine).per_block`` ...) or a
:class:`Mapping` (``tests/test_layers.py`` counts the comparisons).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from simpar.errors import ConfigError
from simpar.parallel import blocks
from simpar.parallel.comm import BlockedComm, GroupedPmapComm, LocalComm, PmapComm, ShardMapComm
from simpar.parallel.halo import from_blocks, to_blocks
from simpar.parallel.layouts import (
    PARTICLES,
    REPLICATED,
    SLOTS,
    Blocks,
    Layout,
    Particles,
    Replicated,
    Slots,
    each,
    each2,
    grid_blocks,
    norm,
    particle_count,
    pencils,
    slot_view,
    stack,
    unstack,
)
from simpar.parallel.topology import DeviceGrid

MEMBER_AXIS = "member"


# --------------------------------------------------------------------------------------------
# Engines: names and what each one is
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineKind:
    """What an engine is, as the code that uses it needs to know.

    Attributes:
      name: the engine name.
      one_device: runs on one device (``single``).
      per_block: runs a per-block program with explicit collectives (``pmap``, ``shard_map``).
      stacked: placed values are blocks stacked on a leading device axis (``pmap``).
      partitioned: XLA partitions a global-view program over a mesh (``sharded``).
    """

    name: str
    one_device: bool = False
    per_block: bool = False
    stacked: bool = False
    partitioned: bool = False

    @property
    def has_mesh(self) -> bool:
        """A named ``jax.sharding.Mesh`` holds the values (``shard_map``, ``sharded``)."""
        return not (self.one_device or self.stacked)


KINDS = {
    "single": EngineKind("single", one_device=True),
    "pmap": EngineKind("pmap", per_block=True, stacked=True),
    "shard_map": EngineKind("shard_map", per_block=True),
    "sharded": EngineKind("sharded", partitioned=True),
}
ENGINES = tuple(KINDS)
PER_BLOCK = tuple(n for n, k in KINDS.items() if k.per_block)
"""The engines that run a per-block program with explicit collectives (the others run the
global view: one device, or XLA partitioning a jit-compiled step)."""
_LOCAL = EngineKind("local", one_device=True)  # one device through LocalComm (tests, benches)


def check_engine(name: str, key: str = "--engine", allowed: Sequence[str] = ENGINES) -> str:
    """``name`` if it is one of ``allowed``, else a ``ConfigError`` on ``key`` listing them."""
    if name not in allowed:
        raise ConfigError(key, f"unknown engine {name!r}; choose one of {', '.join(allowed)}")
    return name


def kind(name: str, key: str = "--engine") -> EngineKind:
    """The :class:`EngineKind` of ``name`` (``"local"``: one device, for tests and benches).

    Raises:
      ConfigError: on ``key`` for an unknown engine.
    """
    if name == "local":
        return _LOCAL
    return KINDS[check_engine(name, key)]


def default_mesh(
    engine: str, mesh: Sequence[int] | None, n_devices: int, members: int = 1
) -> tuple[int, ...]:
    """The device grid a run uses.

    Args:
      engine: one of ``ENGINES``.
      mesh: the requested device-grid shape (``--mesh`` / ``parallel.mesh``), or None.
      n_devices: devices JAX sees (``len(jax.devices())``, every process).
      members: ensemble members sharing the devices (the mesh is one member's).

    Returns:
      ``(1,)`` for ``single`` whatever the mesh (one command line serves a loop over every
      engine); the requested mesh; else every device along the first axis
      (``(n_devices // members,)``).
    """
    if kind(engine).one_device:
        return (1,)
    if mesh is not None:
        return tuple(int(m) for m in mesh)
    return (max(n_devices // max(members, 1), 1),)


def require_one_process(engine: str, key: str = "--engine") -> None:
    """``ConfigError`` when ``engine`` is ``single`` in a multi-process run."""
    if kind(engine).one_device and jax.process_count() > 1:
        raise ConfigError(
            key,
            f"engine 'single' runs in one process; this run has {jax.process_count()} "
            "(use pmap, shard_map or sharded)",
        )


# --------------------------------------------------------------------------------------------
# The mapping
# --------------------------------------------------------------------------------------------
class Mapping:
    """Engine + device grid + devices: places, gathers and maps per-block programs.

    Args:
      engine: one of ``ENGINES`` (or ``"local"``: one device, as ``single``).
      grid: the device grid (``DeviceGrid``: devices per mesh axis and which axes wrap);
        ignored (``(1,) * ndim``) on one device.
      devices: the devices, C order over the grid (default ``jax.devices()``); the first
        ``members * grid.size`` are used.
      members: ensemble members (``None``: no ensemble), each on its own group of devices.

    Attributes:
      engine, kind (:class:`EngineKind`), grid, members, devices (those used), mesh (a ``Mesh``
      for ``shard_map``/``sharded``, else ``None``), comm (the ``Comm`` a per-block program
      uses), blocked_comm (``sharded``: the ``BlockedComm`` of the blocked global view).
    """

    def __init__(self, engine: str, grid: DeviceGrid, devices=None, members: int | None = None):
        self.kind = kind(engine)
        self.engine = engine
        self.grid = grid
        self.members = None if members is None else int(members)
        m = self.members or 1
        available = list(jax.devices() if devices is None else devices)
        n = 1 if self.kind.one_device else m * grid.size
        self.devices = available[:n]
        self.mesh = None
        names = grid.axis_names
        if self.kind.has_mesh:
            shape = grid.shape if self.members is None else (m, *grid.shape)
            names = names if self.members is None else (MEMBER_AXIS, *names)
            self.mesh = blocks.make_mesh(shape, names, self.devices)
        if self.kind.stacked:
            self.comm = (
                PmapComm(grid, blocks.PMAP_AXIS)
                if self.members is None
                else GroupedPmapComm(grid, m, blocks.PMAP_AXIS)
            )
        elif self.kind.per_block:
            self.comm = ShardMapComm(grid)
        else:
            self.comm = LocalComm(grid.ndim)
        self.blocked_comm = BlockedComm(grid) if self.kind.partitioned else None

    # -- shardings --------------------------------------------------------------------------------
    def _names(self, split) -> tuple:
        out = []
        for s in split:
            names = tuple(self.grid.axis_names[g] for g in s)
            out.append(None if not names else names[0] if len(names) == 1 else names)
        return tuple(out)

    def _nlead(self, layout: Blocks, ndim: int) -> int:
        """Leading axes of a global value of rank ``ndim`` (member axis excluded)."""
        if layout.nlead is not None:
            return layout.nlead
        if ndim is None:
            raise ValueError(
                "Blocks(nlead=None) needs the value's rank: give out_layouts as a "
                "function of the abstract results"
            )
        return ndim - len(layout.split) - (self.members is not None)

    def spec(self, layout, ndim: int, n: int | None = None) -> P:
        """``PartitionSpec`` of a global value of rank ``ndim`` in ``layout`` (mesh engines).

        ``n``: the length of a :data:`PARTICLES` axis (``sharded`` replicates it when the
        devices do not divide it)."""
        layout = norm(layout)
        member = () if self.members is None else (MEMBER_AXIS,)
        if isinstance(layout, Replicated):
            return P(*member)
        if isinstance(layout, Blocks):
            nl = self._nlead(layout, ndim)
            return P(*member, *(None,) * nl, *self._names(layout.split))
        if isinstance(layout, Particles) and n is not None and n % self.grid.size:
            return P(*member)
        return P(*member, self.grid.axis_names)  # Particles, Slots: axis 0 over every axis

    def sharding(self, layout, ndim: int, n: int | None = None):
        """Where a global value of rank ``ndim`` in ``layout`` lives: a ``NamedSharding`` on
        the mesh engines, the one device otherwise (``pmap`` has none: its values are
        stacks)."""
        if self.mesh is None:
            return jax.sharding.make_single_device_sharding(self.devices[0])
        return blocks.sharding(self.mesh, *self.spec(layout, ndim, n))

    # -- host <-> devices -------------------------------------------------------------------------
    def stack(self, x, layout):
        """A global value -> the ``pmap`` stack ``(n_dev, ...)`` (NumPy or JAX, traced too)."""
        return stack(x, norm(layout), self.grid.shape, self.members)

    def unstack(self, b, layout):
        """Inverse of :meth:`stack` (host stacks of every process's blocks)."""
        return unstack(b, norm(layout), self.grid.shape, self.members)

    def place(self, x, layout):
        """A global value -> the devices in ``layout``.

        Args:
          x: the global value (host, ``jax.Array`` or a tracer; a traced value stays traced).
          layout: a :class:`Layout` (``None``: :data:`REPLICATED`).

        Returns:
          ``pmap``: the stack ``(n_dev, ...)`` (replicated values as they are); else a global
          ``jax.Array`` (``NamedSharding`` on the mesh engines). In a multi-process run each
          process places only its own devices' blocks (every process passes the whole value).
        """
        layout = norm(layout)
        if self.kind.stacked:
            if isinstance(layout, Replicated):  # pmap takes it as it is (members: per call)
                return x
            x = x if isinstance(x, jax.Array) else np.asarray(x)
            b = self.stack(x, layout)
            if isinstance(x, jax.core.Tracer):  # the pmapped program distributes it
                return b
            return blocks.put_blocks(b, self.devices)
        if self.mesh is None:
            return blocks.place(x, self.devices[0])  # one device (pmap: stacked, above)
        n = np.shape(x)[0] if isinstance(layout, Particles) else None
        return blocks.place(x, self.sharding(layout, np.ndim(x), n))

    def gather(self, x, layout):
        """The global value of a placed value or mapped result as host NumPy (a collective in
        multi-process runs); a traced value stays a traced global value."""
        layout = norm(layout)
        if isinstance(x, jax.core.Tracer):
            return self.unstack(x, layout) if self.kind.stacked else x
        if not self.kind.stacked:
            return blocks.to_host(x)
        if isinstance(layout, Replicated) and self.members is None:
            return np.asarray(blocks.to_host(x))
        # under pmap each process holds its own devices' blocks: every process's first
        return self.unstack(blocks.gather_blocks(x), layout)

    # -- mapped programs ------------------------------------------------------------------------
    def map(
        self,
        fn: Callable,
        in_layouts: Sequence,
        out_layouts,
        donate: bool = False,
        blocked: bool = False,
    ) -> Callable:
        """``fn`` (a per-block program over :attr:`comm`) on every device.

        Args:
          fn: ``fn(*args) -> result``. ``pmap``/``shard_map``: it sees one block of each
            distributed argument; ``single``/``sharded``: whole values (``blocked``: see below).
          in_layouts: one layout (or a pytree prefix of layouts) per argument.
          out_layouts: the same for the result, or a function of the abstract result of one
            block (``jax.ShapeDtypeStruct`` pytree) giving them (e.g. by rank).
          donate: the first argument's buffers are consumed.
          blocked: ``sharded`` only: :class:`Blocks` arguments reach ``fn`` in the blocked
            global view ``(*grid.shape, *lead, *block)`` (one block per device) and ``fn`` uses
            :attr:`blocked_comm`; XLA turns its rolls into collective-permutes.

        Returns:
          A function of the placed arguments giving placed results.
        """
        in_layouts = tuple(in_layouts)
        donate_argnums = (0,) if donate else ()
        k = self.kind
        if k.stacked:
            return self._map_pmap(fn, in_layouts, out_layouts, donate)
        if k.per_block:
            return self._map_shard_map(fn, in_layouts, out_layouts, donate_argnums)
        if self.members is not None:
            fn = jax.vmap(fn)
        if k.one_device:
            fn = slot_view(fn, in_layouts)
            return jax.jit(fn, donate_argnums=donate_argnums)
        if blocked:
            return self._map_blocked(fn, in_layouts, out_layouts, donate_argnums)
        if callable(out_layouts) and not isinstance(out_layouts, Layout):

            def run(*args):
                outs = jax.eval_shape(fn, *args)
                return jax.lax.with_sharding_constraint(
                    fn(*args), self._out_shardings(out_layouts(self._block_avals(outs)), outs)
                )

            return jax.jit(run, donate_argnums=donate_argnums)
        # PARTICLES results: where XLA puts them (their length may not divide the devices)
        out_shardings = each(
            out_layouts,
            lambda ls: (
                None if isinstance(ls, Particles) and not ls.even else self.sharding(ls, None)
            ),
        )
        return jax.jit(fn, out_shardings=out_shardings, donate_argnums=donate_argnums)

    def _out_shardings(self, layouts, outs):
        return each2(layouts, outs, lambda ls, v: self.sharding(ls, v.ndim))

    def _map_pmap(self, fn, in_layouts, out_layouts, donate):
        def axis(ls):
            return None if isinstance(ls, Replicated) and self.members is None else 0

        in_axes = tuple(each(ls, axis) for ls in in_layouts)

        def prep(args):
            if self.members is None:
                return args
            return tuple(
                each2(ls, a, lambda l_, v: self.stack(v, l_) if isinstance(l_, Replicated) else v)
                for ls, a in zip(in_layouts, args, strict=True)
            )

        def first(lay, out):
            # replicated results come back stacked (out_axes=None is refused across processes)
            # and are read from this process's first device
            if self.members is not None:
                return out
            return each2(lay, out, lambda l_, v: v[0] if isinstance(l_, Replicated) else v)

        fixed = not callable(out_layouts) or isinstance(out_layouts, Layout)
        cache = {}

        def run(*args):
            args = prep(args)
            key = jax.tree.structure(args)
            if key not in cache:
                lay = out_layouts
                if not fixed:
                    probe = blocks.pmap(fn, self.devices, in_axes=in_axes)
                    outs = jax.eval_shape(probe, *args)
                    outs = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape[1:], v.dtype), outs)
                    lay = out_layouts(outs)
                pm = blocks.pmap(fn, self.devices, in_axes=in_axes, donate=donate)
                cache[key] = (pm, lay)
            pm, lay = cache[key]
            return first(lay, pm(*args))

        return run

    def _map_shard_map(self, fn, in_layouts, out_layouts, donate_argnums):
        if self.members is not None:
            inner = fn

            def fn(*args):  # one member's block: strip and restore the member axis
                out = inner(*jax.tree.map(lambda a: a[0], args))
                return jax.tree.map(lambda a: a[None], out)

        fn = slot_view(fn, in_layouts)

        def specs_in(args):
            return tuple(
                each2(ls, a, lambda l_, v: self.spec(l_, np.ndim(v), particle_count(l_, v)))
                for ls, a in zip(in_layouts, args, strict=True)
            )

        def run(*args):
            ins = specs_in(args)
            if callable(out_layouts) and not isinstance(out_layouts, Layout):
                probe = blocks.shard_map(fn, self.mesh, ins, P(), check_vma=False)
                outs = jax.eval_shape(probe, *args)
                outs = self._block_avals(outs)
                lay = out_layouts(outs)
                outs_spec = each2(lay, outs, lambda l_, v: self.spec(l_, v.ndim))
            else:
                outs_spec = each(out_layouts, lambda l_: self.spec(l_, None))
            # check_vma off: values reduced over every device (psum, pmax) meet per-device
            # values in lax.cond / while_loop carries; they are equal on every device by design
            return blocks.shard_map(fn, self.mesh, ins, outs_spec, check_vma=False)(*args)

        jitted = jax.jit(run, donate_argnums=donate_argnums)
        if callable(out_layouts) and not isinstance(out_layouts, Layout):
            return jitted

        def declared(layout, v):
            # XLA gives a zero-size result (an empty send list) a replicated sharding; fed back
            # it would recompile the program: lay it out as declared (no bytes move). Not via
            # jit's out_shardings: under jax.grad the cotangents would have to match them.
            if isinstance(v, jax.core.Tracer) or not isinstance(v, jax.Array) or v.size:
                return v
            want = self.sharding(layout, v.ndim)
            return v if v.sharding == want else jax.device_put(v, want)

        def call(*args):
            return each2(out_layouts, jitted(*args), declared)

        call.lower = jitted.lower
        return call

    def _block_avals(self, outs):
        """Abstract results of one block (members: without the member axis)."""
        if self.members is None:
            return outs
        return jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape[1:], v.dtype), outs)

    def _map_blocked(self, fn, in_layouts, out_layouts, donate_argnums):
        g = self.grid

        def view(ls, v):
            if not isinstance(ls, Blocks):
                return v
            d = len(ls.split)
            b = to_blocks(v, g.shape, d)
            spec = P(*g.axis_names, *(None,) * (b.ndim - g.ndim))
            return lax.with_sharding_constraint(b, blocks.sharding(self.mesh, *spec))

        def run(*args):
            args = tuple(each2(ls, a, view) for ls, a in zip(in_layouts, args, strict=True))
            out = fn(*args)
            lay = out_layouts
            if callable(lay) and not isinstance(lay, Layout):
                lay = lay(
                    jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape[g.ndim :], v.dtype), out)
                )

            def back(ls, v):
                if not isinstance(ls, Blocks):
                    return lax.with_sharding_constraint(v, self.sharding(ls, v.ndim))
                u = from_blocks(v, g.shape, len(ls.split))
                return lax.with_sharding_constraint(u, self.sharding(ls, u.ndim))

            # keep the result laid out like the input (no silent resharding between chunks)
            return each2(lay, out, back)

        return jax.jit(run, donate_argnums=donate_argnums)


def device_grid(mesh: Sequence[int], periodic: bool = True) -> DeviceGrid:
    """A ``DeviceGrid`` of ``mesh`` whose axes all wrap (spectral grids, rings)."""
    mesh = tuple(int(m) for m in mesh)
    return DeviceGrid(mesh, (bool(periodic),) * len(mesh))


__all__ = [
    "ENGINES",
    "KINDS",
    "PARTICLES",
    "PER_BLOCK",
    "REPLICATED",
    "SLOTS",
    "Blocks",
    "EngineKind",
    "Layout",
    "Mapping",
    "Particles",
    "Replicated",
    "Slots",
    "check_engine",
    "default_mesh",
    "device_grid",
    "grid_blocks",
    "kind",
    "pencils",
    "require_one_process",
]
