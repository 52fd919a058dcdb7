"""Per-block spectral programs on every engine: one place that maps them over the device grid.

A spectral model (``simpar.grid.spectral_ns``) is written once against a set of transforms
``ops`` (``simpar.parallel.fft.SpectralOps``) and, for global sums, a ``comm``. This module
picks both for an engine and maps a program built from them over the devices through
``simpar.parallel.mapping`` (its layouts: the plan's pencils, real or Fourier); it imports no
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

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np

from simpar.errors import ConfigError
from simpar.parallel import blocks, fft, mapping


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
        k = mapping.kind(engine)
        self.engine = engine
        mesh = (1,) if k.one_device else tuple(int(m) for m in mesh)
        try:
            self.plan = plan = fft.make_plan(shape, mesh, real)
            if not k.one_device:
                blocks.require_devices(plan.mesh, len(jax.devices()), key)
        except ConfigError as err:
            if err.key != "--mesh":
                raise
            raise ConfigError(key, err.message) from None
        self.mapping = mapping.Mapping(engine, mapping.device_grid(plan.mesh))
        self.devices = self.mapping.devices
        self.mesh = self.mapping.mesh
        if k.per_block:
            self.comm = self.mapping.comm
            self.ops = fft.SpectralOps(
                lambda x: fft.forward_block(x, plan, self.comm),
                lambda y: fft.inverse_block(y, plan, self.comm),
                lambda a: fft.freq_block(plan, self.comm, a),
                plan,
            )
        else:  # one device: jnp.fft; sharded: the global view, transposes by shard_map
            self.ops, self.comm = fft.global_ops(plan, self.mesh), None

    def layout(self, layout: Layout | None) -> mapping.Layout:
        """The mapping's layout of a :class:`Layout` (``None``: replicated)."""
        if layout is None:
            return mapping.REPLICATED
        return mapping.pencils(self.plan, layout.fourier, layout.nlead)

    def _layouts(self, layouts):
        if layouts is None or isinstance(layouts, Layout):
            return self.layout(layouts)
        return tuple(self._layouts(ls) for ls in layouts)

    # -- placement ------------------------------------------------------------------------------
    def place(self, x: np.ndarray, layout: Layout):
        """A global host array ``(*lead, *shape)`` (or the Fourier shape) -> the devices.

        Returns:
          ``pmap``: stacked blocks ``(n_dev, *lead, *block)``; else a global ``jax.Array``
          (``NamedSharding`` in the layout for ``shard_map``/``sharded``).
        """
        return self.mapping.place(np.asarray(x), self.layout(layout))

    def gather(self, x, layout: Layout | None) -> np.ndarray:
        """The whole value of a placed array or mapped result as NumPy (a collective in
        multi-process runs). ``None``: a replicated result (one copy)."""
        return np.asarray(self.mapping.gather(x, self.layout(layout)))

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
        ins = tuple(self.layout(ls) for ls in in_layouts)
        return self.mapping.map(fn, ins, self._layouts(out_layouts), donate=donate)


__all__ = ["FOURIER", "REAL", "Layout", "SpectralEngine"]
