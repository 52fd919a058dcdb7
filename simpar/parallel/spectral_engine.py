"""Per-block spectral programs on every engine: one place that maps them over the device grid.

A spectral model (``simpar.grid.spectral_ns``) is written once against a set of transforms
``ops`` (``simpar.parallel.fft.SpectralOps``) and, for global sums, a ``comm``. This module
picks both for an engine and maps a program built from them over the devices; it imports no
model (the program is passed in):

=============  ======================================  ==========================================
engine         ``ops`` / ``comm``                      the mapped program
=============  ======================================  ==========================================
``single``     ``jnp.fft`` on one device / ``None``    ``jax.jit(fn)``
``pmap``       per-block transforms / ``PmapComm``     ``blocks.pmap`` over stacked blocks
``shard_map``  per-block transforms / ``ShardMapComm`` ``jax.jit(blocks.shard_map(fn, ...))``
``sharded``    global view, transposes by a            ``jax.jit(fn)`` on ``NamedSharding`` arrays,
               ``shard_map`` inside / ``None``         outputs laid out as declared
=============  ======================================  ==========================================

Arguments and results are declared with a :class:`Layout` (the real-space or the Fourier
layout of the plan, with ``nlead`` leading axes that are never split) or ``None`` (replicated:
parameters, step counts, globally reduced diagnostics). Device placement, meshes, shardings
and the ``pmap``/``shard_map`` wrappers all come from ``simpar.parallel.blocks``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np

from simpar.errors import ConfigError
from simpar.parallel import blocks, fft
from simpar.parallel.blocks import PMAP_AXIS


class Layout(NamedTuple):
    """Where a distributed argument or result lives.

    Attributes:
      fourier: ``False``: the real-space layout of the plan (``FFTPlan.real_split``);
        ``True``: the Fourier layout (``FFTPlan.fourier_split``, padded half axis).
      nlead: leading (component) axes in front of the spatial ones, never split.
    """

    fourier: bool
    nlead: int = 0


REAL = Layout(False)
FOURIER = Layout(True)


def _each(layouts, fn):
    """``fn`` of one layout (a :class:`Layout` or ``None``), or of each in a tuple of them."""
    if layouts is None or isinstance(layouts, Layout):
        return fn(layouts)
    return tuple(fn(o) for o in layouts)


class SpectralEngine:
    """Transforms and mapped programs of one spectral grid on one engine.

    Args:
      engine: ``"single"``, ``"pmap"``, ``"shard_map"`` or ``"sharded"``.
      shape: global grid ``(N_0, ..., N_{d-1})``, cells (changing it recompiles).
      mesh: devices per spatial axis (``(8,)``, ``(2, 4)``; ignored for ``single``).
      real: real-to-complex transforms (``rfftn``).
      key: the option or config key named when the mesh does not fit (``--mesh``).

    Attributes:
      engine, plan (``fft.FFTPlan``; ``plan.mesh`` is the device grid, padded with 1s),
      ops (``fft.SpectralOps`` the program must use), comm (``None`` for global arrays, else
      the per-block ``Comm`` with ``psum``/``pmax``), devices (the devices used, C order).

    Raises:
      ConfigError: on ``key`` when the mesh does not divide the grid or its transposes, or
        asks for more devices than there are.

    Example (the chunk program of ``simpar.drive.spectral``)::

        eng = SpectralEngine("pmap", (64, 64), (2, 4))
        to_state = eng.map(lambda w: S.to_state(w, eng.ops), (REAL,), FOURIER)
        chunk = eng.map(lambda w, p, n: S.advance(w, p, eng.ops, n), (FOURIER, None, None),
                        FOURIER, donate=True)
        w_hat = chunk(to_state(eng.place(w0, REAL)), params, jnp.asarray(100))
        w = eng.gather(eng.map(lambda w: S.to_physical(w, eng.ops), (FOURIER,), REAL)(w_hat),
                       REAL)  # host (64, 64)
    """

    def __init__(
        self,
        engine: str,
        shape: Sequence[int],
        mesh: Sequence[int] = (1,),
        real: bool = True,
        key: str = "--mesh",
    ):
        blocks.check_engine(engine)
        self.engine = engine
        mesh = (1,) if engine == "single" else tuple(int(m) for m in mesh)
        try:
            self.plan = plan = fft.make_plan(shape, mesh, real)
            n = math.prod(plan.mesh)
            if engine != "single":
                blocks.require_devices(plan.mesh, len(jax.devices()), key)
        except ConfigError as err:
            if err.key != "--mesh":
                raise
            raise ConfigError(key, err.message) from None
        self.devices = list(jax.devices())[:n]
        self.mesh = None
        if engine in blocks.PER_BLOCK:
            self.ops = fft.block_ops(plan, engine)
            self.comm = fft.grid_comm(plan, engine)
            if engine == "shard_map":
                self.mesh = fft.device_mesh(plan.mesh, self.devices)
        elif engine == "sharded":
            self.mesh = fft.device_mesh(plan.mesh, self.devices)
            self.ops, self.comm = fft.global_ops(plan, self.mesh), None
        else:
            self.ops, self.comm = fft.global_ops(plan), None

    # -- placement ------------------------------------------------------------------------------
    def _sharding(self, layout: Layout | None):
        if layout is None:
            return blocks.sharding(self.mesh)
        return blocks.sharding(self.mesh, *self.plan.spec(layout.fourier, layout.nlead))

    def place(self, x: np.ndarray, layout: Layout):
        """A global host array ``(*lead, *shape)`` (or the Fourier shape) -> the devices.

        Returns:
          ``pmap``: stacked blocks ``(n_dev, *lead, *block)``; else a global ``jax.Array``
          (``NamedSharding`` in the layout for ``shard_map``/``sharded``).
        """
        x = np.asarray(x)
        if self.engine == "pmap":
            return blocks.put_blocks(fft.split_blocks(x, self.plan, layout.fourier), self.devices)
        if self.engine == "single":
            return jax.device_put(x, self.devices[0])
        return blocks.put_global(x, self._sharding(layout))

    def gather(self, x, layout: Layout | None) -> np.ndarray:
        """The whole value of a placed array or mapped result as NumPy (a collective in
        multi-process runs). ``None``: a replicated result (one copy)."""
        if layout is None:
            return np.asarray(blocks.to_host(x))
        if self.engine == "pmap":
            return fft.join_blocks(blocks.gather_blocks(x), self.plan, layout.fourier)
        return blocks.to_host(x)

    # -- mapped programs --------------------------------------------------------------------------
    def map(
        self,
        fn: Callable,
        in_layouts: Sequence[Layout | None],
        out_layouts,
        donate: bool = False,
    ) -> Callable:
        """``fn`` (built from ``self.ops`` and ``self.comm``) on every device.

        Args:
          fn: ``fn(*args) -> result``; under ``pmap``/``shard_map`` it sees one block per
            distributed argument, under ``single``/``sharded`` global arrays.
          in_layouts: one :class:`Layout` or ``None`` (replicated) per argument.
          out_layouts: the same for the result: one entry, or a tuple matching a tuple result
            (a prefix of the result pytree, e.g. ``None`` for a dict of reduced values).
          donate: the first argument's buffers are consumed (the caller must not use it again).

        Returns:
          A function of the placed arguments (``place``; replicated ones as arrays).
        """
        in_layouts = tuple(in_layouts)
        donate_argnums = (0,) if donate else ()
        if self.engine == "pmap":
            axes = lambda ls: None if ls is None else 0  # noqa: E731
            out_axes = _each(out_layouts, axes)
            return blocks.pmap(
                fn,
                self.devices,
                in_axes=tuple(axes(ls) for ls in in_layouts),
                out_axes=out_axes,
                donate=donate,
                axis_name=PMAP_AXIS,
            )
        if self.engine == "shard_map":

            def spec(ls):
                if ls is None:
                    return blocks.sharding(self.mesh).spec
                return self.plan.spec(ls.fourier, ls.nlead)

            out_specs = _each(out_layouts, spec)
            # reduced (replicated) values meet per-block ones: the varying-axes check is off
            mapped = blocks.shard_map(
                fn, self.mesh, tuple(spec(ls) for ls in in_layouts), out_specs, check_vma=False
            )
            return jax.jit(mapped, donate_argnums=donate_argnums)
        if self.engine == "sharded":
            out_shardings = _each(out_layouts, self._sharding)
            return jax.jit(fn, out_shardings=out_shardings, donate_argnums=donate_argnums)
        return jax.jit(fn, donate_argnums=donate_argnums)


__all__ = ["FOURIER", "REAL", "Layout", "SpectralEngine"]
