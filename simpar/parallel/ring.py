"""All-pairs sums on a device ring, and the four engines of an all-pairs particle model.

The ring algorithm (``pmap`` and ``shard_map`` engines): particles are split into ``n_dev``
equal blocks, one per device. Each device keeps its own block as *targets* and sends a copy
of its *sources* (e.g. positions and masses, packed as one ``(n, k)`` array) around the ring
(``Comm.ring_shift``); after ``n_dev - 1`` shifts every target block has met every source
block, and a pair kernel's result is the sum over the source blocks. The shift of the next
block is issued before the current block's kernel runs, so the transfer can overlap with
compute.

Summation order: ``single`` and ``sharded`` sum over all sources in one kernel call; the ring
adds the ``n_dev`` partial block sums in ring order starting with the device's own block. The
results therefore agree to round-off, not bitwise.

This module knows no physics: a model hands in its per-block programs (:class:`RingKernels`),
written once against a :class:`Ring` (sum a pair kernel over every source block, sum a value
over the blocks), and :func:`make_ring_engine` maps them over the devices with
``simpar.parallel.mapping`` (particle arrays in the ``PARTICLES`` layout):

- ``single``: one device, the programs under ``jax.jit`` (the ring is the one block).
- ``pmap``: ``blocks.pmap`` over a flat axis; arrays laid out ``(n_dev, N / n_dev, ...)``.
- ``shard_map``: ``blocks.shard_map`` on a 1-D mesh; global ``(N, ...)`` arrays sharded along
  the particle axis.
- ``sharded``: global arrays with ``NamedSharding`` on an ``Auto`` 1-D mesh and the
  single-device programs under ``jax.jit``; XLA partitions the all-pairs kernel.

N must be divisible by the number of devices (else ``ConfigError``); no padding is done.

More than one process (``simpar.parallel.distributed``): the ring is the first ``n_dev``
devices of ``jax.devices()`` (listed by process), so ``--devices 4`` on two processes gives a
ring of 8 whose shifts 3 -> 4 and 7 -> 0 cross between the processes. Every process builds
the whole initial state on the host and places only its own devices' blocks; ``fetch``
gathers the blocks on every process (a collective). The programs are the one-process ones, so
a two-process run equals a one-process run on the same engine and ring bit for bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from simpar.errors import ConfigError
from simpar.parallel import blocks, mapping
from simpar.parallel.comm import Comm
from simpar.parallel.mapping import ENGINES, REPLICATED, Mapping, Particles
from simpar.parallel.topology import DeviceGrid

__all__ = [
    "ENGINES",
    "Ring",
    "RingEngine",
    "RingKernels",
    "check_layout",
    "make_ring_engine",
    "ring_sum",
]


def ring_sum(fn: Callable[[Any, jax.Array], Any], targets: Any, sources: jax.Array, comm: Comm):
    """``sum_k fn(targets, sources of block k)`` over every block of the ring.

    Must be called inside the program that ``comm`` serves (``pmap`` for ``PmapComm``,
    ``shard_map`` for ``ShardMapComm``). Uses ``n_dev - 1`` ``comm.ring_shift`` (device ``i``
    sends to ``i + 1 mod n_dev``); the sum starts with the local block and then adds the blocks
    of devices ``i-1, i-2, ...``.

    Args:
      fn: per-block kernel ``(targets, sources_block) -> pytree of arrays``.
      targets: the local targets (passed to ``fn`` unchanged).
      sources: (n, k) array, the local source block that travels around the ring.
      comm: the ring's devices (``comm.size`` of them, static).

    Returns:
      The summed pytree, shaped like ``fn``'s output.
    """
    n_dev = comm.size
    total = fn(targets, sources)
    if n_dev == 1:
        return total
    src = comm.ring_shift(sources)

    def body(_, carry):
        src, total = carry
        # The next shift does not depend on this block's compute: they can overlap.
        nxt = comm.ring_shift(src)
        total = jax.tree.map(jnp.add, total, fn(targets, src))
        return nxt, total

    src, total = lax.fori_loop(0, n_dev - 2, body, (src, total))
    return jax.tree.map(jnp.add, total, fn(targets, src))


class Ring:
    """What a block's all-pairs programs ask of the engine.

    Args:
      comm: the ring's ``Comm`` (``PmapComm``/``ShardMapComm`` on a periodic 1-D device grid),
        or ``None`` when the block is the whole system (``single``, ``sharded``).
    """

    def __init__(self, comm: Comm | None = None):
        self.comm = comm

    def over_sources(self, fn: Callable, targets, *sources: jax.Array):
        """``fn(targets, *sources)`` summed over every source block.

        Args:
          fn: pair kernel ``(targets, *source arrays of one block) -> pytree``.
          targets: the local targets.
          *sources: this block's source arrays, each ``(n,)`` or ``(n, k)``; on a ring they
            travel packed as one ``(n, sum k)`` array.

        Returns:
          ``fn``'s pytree, summed over the blocks (whole system: one call of ``fn``).
        """
        if self.comm is None:
            return fn(targets, *sources)
        cols = [s[:, None] if s.ndim == 1 else s for s in sources]
        edges = np.cumsum([0] + [c.shape[1] for c in cols])

        def unpacked(t, packed):
            parts = [
                packed[:, a] if s.ndim == 1 else packed[:, a:b]
                for s, a, b in zip(sources, edges[:-1], edges[1:], strict=True)
            ]
            return fn(t, *parts)

        return ring_sum(unpacked, targets, jnp.concatenate(cols, axis=1), self.comm)

    def total(self, x):
        """``x`` summed over the blocks (a pytree; the whole system: ``x``)."""
        return x if self.comm is None else self.comm.psum(x)


class RingKernels(NamedTuple):
    """A model's per-block programs; each takes a keyword ``ring`` (:class:`Ring`).

    Attributes:
      init: ``(pos, vel, mass, params, *, ring) -> state``: arrays ``(n, ...)`` of the block,
        ``params`` replicated; the state is a pytree of ``(n, ...)`` arrays whose first leaf
        has the model's float dtype.
      run: ``(state, params, n_steps, *, ring) -> (state, observables)``: ``n_steps`` (a traced
        int) steps, then whole-system observables (``ring.total``).
      observe: ``(state, params, *, ring) -> observables`` (whole system, replicated).
    """

    init: Callable
    run: Callable
    observe: Callable


class RingEngine(NamedTuple):
    """Compiled programs of one engine and device count.

    ``init``/``run``/``observables`` take and return *device state* in the engine's layout
    (``(n_dev, N / n_dev, ...)`` for pmap, global ``(N, ...)`` arrays otherwise); ``fetch``
    gives the whole-system state as NumPy arrays.

    Attributes:
      name: engine name; n_devices: ring size (1 for ``single``).
      init: ``(pos (N,3), vel (N,3), mass (N,), params) -> device state``.
      run: ``(device state, params, n_steps) -> (device state, observables)``: n_steps steps
        in one dispatch (n_steps is traced: no recompilation per value).
      observables: ``(device state, params) -> observables`` (replicated, whole system).
      fetch: ``device state -> state`` of NumPy (N, ...) arrays.
      place: state of whole-system (N, ...) arrays -> device state, unchanged (a restart
        continues bit for bit).
    """

    name: str
    n_devices: int
    init: Callable
    run: Callable
    observables: Callable
    fetch: Callable
    place: Callable


def check_layout(n: int, engine: str, n_devices: int) -> None:
    """Raise ``ConfigError`` unless ``n`` particles can run on ``engine`` x ``n_devices``."""
    one_device = mapping.kind(engine, "parallel.engine").one_device
    blocks.require_count(n_devices, "parallel.devices")
    if jax.process_count() > 1:
        mapping.require_one_process(engine)
        blocks.require_every_process(n_devices, f"a ring of {n_devices} devices")
    if one_device and n_devices != 1:
        raise ConfigError("parallel.devices", f"engine 'single' runs on 1 device, got {n_devices}")
    if n % n_devices:
        raise ConfigError(
            "parallel.devices",
            f"N = {n} particles cannot be split evenly over {n_devices} devices "
            f"(N must be a multiple of the device count; N = {n - n % n_devices} or "
            f"{n - n % n_devices + n_devices} would do)",
        )


def make_ring_engine(engine: str, n_devices: int, kernels: RingKernels) -> RingEngine:
    """Map a model's per-block programs over the first ``n_devices`` devices.

    Args:
      engine: one of ``ENGINES``.
      n_devices: ring size; must be 1 for ``single``.
      kernels: the model's per-block programs (cache the result per model: every call
        compiles anew).

    Returns:
      The engine's programs, taking and giving device state in its layout.

    Raises:
      ConfigError: unknown engine, too many devices, or a device set that misses a process.
    """
    check_layout(n_devices, engine, n_devices)
    m = Mapping(engine, DeviceGrid((n_devices,), (True,)), jax.devices()[:n_devices])
    ring = Ring(m.comm if m.kind.per_block else None)  # one block: the whole system

    PARTICLES = Particles(even=True)  # N is a multiple of the ring (check_layout)

    def mapped(fn, ins, outs):
        return m.map(functools.partial(fn, ring=ring), ins, outs)

    init = mapped(kernels.init, (PARTICLES,) * 3 + (REPLICATED,), PARTICLES)
    run = mapped(kernels.run, (PARTICLES, REPLICATED, REPLICATED), (PARTICLES, REPLICATED))
    observe = mapped(kernels.observe, (PARTICLES, REPLICATED), REPLICATED)

    def dtype(state):
        return jax.tree.leaves(state)[0].dtype

    def put(a):
        return m.place(np.asarray(a), PARTICLES)

    def replicated(params, dtype):  # on every device of every process
        return jax.tree.map(lambda p: m.place(np.asarray(p, dtype), REPLICATED), params)

    def result(obs):  # the programs' replicated observables (may span processes)
        return jax.tree.map(lambda o: m.gather(o, REPLICATED), obs)

    def init_fn(pos, vel, mass, params):
        check_layout(len(mass), engine, n_devices)
        pos, vel, mass = (put(a) for a in (pos, vel, mass))
        return init(pos, vel, mass, replicated(params, pos.dtype))

    def run_fn(state, params, n_steps):
        count = m.place(np.asarray(n_steps, np.int32), REPLICATED)
        state, obs = run(state, replicated(params, dtype(state)), count)
        return state, result(obs)

    return RingEngine(
        engine,
        n_devices,
        init_fn,
        run_fn,
        lambda s, p: result(observe(s, replicated(p, dtype(s)))),
        lambda s: jax.tree.map(lambda a: m.gather(a, PARTICLES), s),
        lambda s: jax.tree.map(put, s),
    )
