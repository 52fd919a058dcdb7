"""All-pairs N-body forces on a device ring, and the four N-body engines.

The ring algorithm (pmap and shard_map engines): particles are split into ``n_dev`` equal
blocks, one per device. Each device keeps its own block as *targets* and sends a copy of
it (positions and masses packed as one ``(n, 4)`` array) around the ring with
``lax.ppermute``; after ``n_dev - 1`` shifts every target block has met every source
block, and the forces are the sum of the per-block kernel
``simpar.particles.nbody.accelerations``. The shift of the next block is issued before
the current block's forces are computed, so the transfer can overlap with compute.

Summation order: ``single`` sums over all sources in one reduction; the ring adds the
``n_dev`` partial block sums in ring order starting with the device's own block. The
results therefore agree to round-off, not bitwise (tests use a tolerance relative to
the largest acceleration).

Engines (``ENGINES``):
- ``single``: one device, the all-pairs kernel under ``jax.jit``.
- ``pmap``: ``jax.pmap`` over a flat axis; arrays laid out ``(n_dev, N / n_dev, ...)``.
- ``shard_map``: the same per-block function under ``jax.shard_map`` on a 1-D mesh
  (``Explicit`` axis); global ``(N, ...)`` arrays sharded along the particle axis.
- ``sharded``: global arrays with ``NamedSharding`` on an ``Auto`` 1-D mesh and the
  unchanged single-device step under ``jax.jit``; XLA partitions the all-pairs kernel.

All engines run many leapfrog steps per dispatch (``lax.fori_loop`` inside the
pmap/shard_map/jit); the number of steps is a traced argument, so one compilation
serves every chunk length. State stays on the devices between chunks when the
``NBodyEngine`` methods are used directly.

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
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from simpar.errors import ConfigError
from simpar.parallel.distributed import gather_blocks, put_blocks, put_global, to_host
from simpar.particles.nbody import (
    NBodyParams,
    NBodyState,
    Observables,
    accelerations,
    block_observables,
    leapfrog_step,
    potentials,
)

ENGINES = ("single", "pmap", "shard_map", "sharded")
AXIS = "dev"


# --------------------------------------------------------------------------- ring


def ring_sum(
    fn: Callable[[Any, jax.Array], Any],
    targets: Any,
    sources: jax.Array,
    axis_name: str,
    n_dev: int,
) -> Any:
    """``sum_k fn(targets, sources of block k)`` over all ``n_dev`` blocks of the ring.

    Must be called inside ``pmap``/``shard_map`` over ``axis_name``. Uses ``n_dev - 1``
    ``ppermute`` shifts (device ``i`` sends to ``i + 1 mod n_dev``); the sum starts
    with the local block and then adds the blocks of devices ``i-1, i-2, ...``.

    Args:
      fn: per-block kernel ``(targets, sources_block) -> pytree of arrays``.
      targets: the local targets (passed to ``fn`` unchanged).
      sources: (n, k) array, the local source block that travels around the ring.
      axis_name: the mapped axis.
      n_dev: size of that axis (static).

    Returns:
      The summed pytree, shaped like ``fn``'s output.
    """
    total = fn(targets, sources)
    if n_dev == 1:
        return total
    perm = [(i, (i + 1) % n_dev) for i in range(n_dev)]
    src = lax.ppermute(sources, axis_name, perm)

    def body(_, carry):
        src, total = carry
        # The next shift does not depend on this block's compute: they can overlap.
        nxt = lax.ppermute(src, axis_name, perm)
        total = jax.tree.map(jnp.add, total, fn(targets, src))
        return nxt, total

    src, total = lax.fori_loop(0, n_dev - 2, body, (src, total))
    return jax.tree.map(jnp.add, total, fn(targets, src))


def _pack(pos: jax.Array, mass: jax.Array) -> jax.Array:
    return jnp.concatenate([pos, mass[:, None]], axis=1)


def ring_accelerations(
    pos: jax.Array,
    mass: jax.Array,
    G: jax.Array,
    eps: jax.Array,
    axis_name: str,
    n_dev: int,
    target_block: int | None = None,
) -> jax.Array:
    """Accelerations of the local block due to all blocks (inside pmap/shard_map).

    Args:
      pos: (n, 3) local positions; mass: (n,) local masses; G, eps: () scalars.
      axis_name, n_dev: the ring axis and its size (static).
      target_block: kernel tiling (see ``nbody.accelerations``), static.

    Returns:
      (n, 3) accelerations.
    """

    def kernel(t, s):
        return accelerations(t, s[:, :3], s[:, 3], G, eps, target_block=target_block)

    return ring_sum(kernel, pos, _pack(pos, mass), axis_name, n_dev)


def ring_potentials(
    pos: jax.Array,
    mass: jax.Array,
    G: jax.Array,
    eps: jax.Array,
    axis_name: str,
    n_dev: int,
    target_block: int | None = None,
) -> jax.Array:
    """Potential at the local block's particles due to all blocks; (n,)."""

    def kernel(t, s):
        return potentials(t, s[:, :3], s[:, 3], G, eps, target_block=target_block)

    return ring_sum(kernel, pos, _pack(pos, mass), axis_name, n_dev)


# -------------------------------------------------------------- per-block programs


def _block_init(pos, vel, mass, params: NBodyParams, axis_name, n_dev, tb) -> NBodyState:
    acc = ring_accelerations(pos, mass, params.G, params.eps, axis_name, n_dev, tb)
    return NBodyState(pos=pos, vel=vel, acc=acc, mass=mass)


def _block_observables(state: NBodyState, params: NBodyParams, axis_name, n_dev, tb):
    phi = ring_potentials(state.pos, state.mass, params.G, params.eps, axis_name, n_dev, tb)
    obs = block_observables(state.pos, state.vel, state.mass, phi)
    return lax.psum(obs, axis_name)


def _block_run(state: NBodyState, params: NBodyParams, n_steps, axis_name, n_dev, tb):
    def accel_fn(pos, mass):
        return ring_accelerations(pos, mass, params.G, params.eps, axis_name, n_dev, tb)

    state = lax.fori_loop(0, n_steps, lambda _, s: leapfrog_step(s, params.dt, accel_fn), state)
    return state, _block_observables(state, params, axis_name, n_dev, tb)


# -------------------------------------------------------- whole-system programs


def _global_init(pos, vel, mass, params: NBodyParams, tb) -> NBodyState:
    acc = accelerations(pos, pos, mass, params.G, params.eps, target_block=tb)
    return NBodyState(pos=pos, vel=vel, acc=acc, mass=mass)


def _global_observables(state: NBodyState, params: NBodyParams, tb) -> Observables:
    phi = potentials(state.pos, state.pos, state.mass, params.G, params.eps, target_block=tb)
    return block_observables(state.pos, state.vel, state.mass, phi)


def _global_run(state: NBodyState, params: NBodyParams, n_steps, tb):
    def accel_fn(pos, mass):
        return accelerations(pos, pos, mass, params.G, params.eps, target_block=tb)

    state = lax.fori_loop(0, n_steps, lambda _, s: leapfrog_step(s, params.dt, accel_fn), state)
    return state, _global_observables(state, params, tb)


# ------------------------------------------------------------------------ engines


class NBodyEngine(NamedTuple):
    """Compiled N-body programs for one engine and device count.

    ``init``/``run``/``observables`` take and return *device state* in the engine's
    layout (``(n_dev, N / n_dev, ...)`` for pmap, global ``(N, ...)`` arrays otherwise);
    use ``fetch`` to get a whole-system ``NBodyState`` of NumPy arrays.

    Attributes:
      name: engine name; n_devices: ring size (1 for ``single``).
      init: ``(pos (N,3), vel (N,3), mass (N,), params) -> device state`` with the
        accelerations computed by this engine.
      run: ``(device state, params, n_steps) -> (device state, Observables)``: n_steps
        leapfrog steps in one dispatch (n_steps is traced: no recompilation per value).
      observables: ``(device state, params) -> Observables`` (replicated, whole system).
      fetch: ``device state -> NBodyState`` of NumPy (N, ...) arrays.
      place: ``NBodyState`` of whole-system (N, ...) arrays -> device state, unchanged
        (accelerations included: a restart continues bit for bit).
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
    if engine not in ENGINES:
        raise ConfigError("parallel.engine", f"{engine!r} is not one of {', '.join(ENGINES)}")
    available = len(jax.devices())
    if n_devices < 1 or n_devices > available:
        raise ConfigError(
            "parallel.devices", f"{n_devices} devices requested, JAX sees {available}"
        )
    if jax.process_count() > 1:
        if engine == "single":
            raise ConfigError(
                "--engine",
                f"engine 'single' runs in one process; this run has {jax.process_count()} "
                "(use pmap, shard_map or sharded)",
            )
        idle = sorted(
            {d.process_index for d in jax.devices()}
            - {d.process_index for d in jax.devices()[:n_devices]}
        )
        if idle:
            raise ConfigError(
                "parallel.devices",
                f"a ring of {n_devices} devices (the first {n_devices} of "
                f"{available}, listed by process) leaves process(es) {idle} without a "
                f"device; across {jax.process_count()} processes the ring must include a "
                f"device of each: use all {available} (the default) or a count that reaches "
                "the last process",
            )
    if engine == "single" and n_devices != 1:
        raise ConfigError("parallel.devices", f"engine 'single' runs on 1 device, got {n_devices}")
    if n % n_devices:
        raise ConfigError(
            "parallel.devices",
            f"N = {n} particles cannot be split evenly over {n_devices} devices "
            f"(N must be a multiple of the device count; N = {n - n % n_devices} or "
            f"{n - n % n_devices + n_devices} would do)",
        )


def _fetch_global(state: NBodyState) -> NBodyState:
    return NBodyState(*(to_host(a) for a in state))


def _cast(params: NBodyParams, dtype) -> NBodyParams:
    return NBodyParams(*(jnp.asarray(p, dtype) for p in params))


def default_target_block(engine: str) -> int | None:
    """Kernel tiling for ``engine`` on the default backend: 64 targets at a time on CPU
    (cache-sized pair arrays, ~3x faster), whole blocks elsewhere (GPUs want one big
    parallel kernel). The ``sharded`` engine keeps the untiled kernel so that XLA can
    partition it (a sequential loop over a sharded axis would not be)."""
    if engine == "sharded" or jax.default_backend() != "cpu":
        return None
    return 64


def make_engine(
    engine: str, n_devices: int = 1, target_block: int | None | str = "auto"
) -> NBodyEngine:
    """Build (and cache) the programs of one engine on the first ``n_devices`` devices.

    Args:
      engine: one of ``ENGINES``.
      n_devices: ring size; must be 1 for ``single``.
      target_block: kernel tiling (``nbody.accelerations``); "auto" picks
        ``default_target_block(engine)``. Changing it recompiles.

    Raises:
      ConfigError: unknown engine or too many devices.
    """
    check_layout(n_devices, engine, n_devices)
    if target_block == "auto":
        target_block = default_target_block(engine)
    return _make_engine(engine, n_devices, target_block)


@functools.cache
def _make_engine(engine: str, n_devices: int, tb: int | None) -> NBodyEngine:
    devices = jax.devices()[:n_devices]

    if engine == "single":
        dev = devices[0]
        init = jax.jit(functools.partial(_global_init, tb=tb))
        run = jax.jit(functools.partial(_global_run, tb=tb))
        obs = jax.jit(functools.partial(_global_observables, tb=tb))

        def init_fn(pos, vel, mass, params):
            pos, vel, mass = (jax.device_put(jnp.asarray(a), dev) for a in (pos, vel, mass))
            return init(pos, vel, mass, _cast(params, pos.dtype))

        return NBodyEngine(
            engine,
            1,
            init_fn,
            lambda s, p, n: run(s, _cast(p, s.pos.dtype), n),
            lambda s, p: obs(s, _cast(p, s.pos.dtype)),
            _fetch_global,
            lambda st: NBodyState(*(jax.device_put(jnp.asarray(a), dev) for a in st)),
        )

    if engine == "pmap":
        block_init = jax.pmap(
            functools.partial(_block_init, axis_name=AXIS, n_dev=n_devices, tb=tb),
            axis_name=AXIS,
            in_axes=(0, 0, 0, None),
            devices=devices,
        )
        block_run = jax.pmap(
            functools.partial(_block_run, axis_name=AXIS, n_dev=n_devices, tb=tb),
            axis_name=AXIS,
            in_axes=(0, None, None),
            devices=devices,
        )
        block_obs = jax.pmap(
            functools.partial(_block_observables, axis_name=AXIS, n_dev=n_devices, tb=tb),
            axis_name=AXIS,
            in_axes=(0, None),
            devices=devices,
        )

        def split(a):  # whole-system host array -> this process's blocks on the devices
            a = np.asarray(a)
            return put_blocks(a.reshape((n_devices, a.shape[0] // n_devices) + a.shape[1:]),
                              devices)  # fmt: skip

        def first(obs):  # psum results are replicated over the axis
            return jax.tree.map(lambda x: x[0], obs)

        def init_fn(pos, vel, mass, params):
            check_layout(len(mass), engine, n_devices)
            pos, vel, mass = (split(a) for a in (pos, vel, mass))
            return block_init(pos, vel, mass, _cast(params, pos.dtype))

        def run_fn(state, params, n_steps):
            state, obs = block_run(state, _cast(params, state.pos.dtype), n_steps)
            return state, first(obs)

        def fetch(state):  # every process's blocks, in ring order (a collective)
            return NBodyState(*(gather_blocks(a).reshape((-1,) + a.shape[2:]) for a in state))

        return NBodyEngine(
            engine,
            n_devices,
            init_fn,
            run_fn,
            lambda s, p: first(block_obs(s, _cast(p, s.pos.dtype))),
            fetch,
            lambda st: NBodyState(*(split(a) for a in st)),
        )

    # shard_map and sharded: global arrays sharded along the particle axis.
    axis_type = AxisType.Explicit if engine == "shard_map" else AxisType.Auto
    mesh = jax.make_mesh((n_devices,), (AXIS,), axis_types=(axis_type,), devices=devices)
    part = NamedSharding(mesh, P(AXIS))
    repl = NamedSharding(mesh, P())

    def put(pos, vel, mass, params):
        check_layout(len(mass), engine, n_devices)
        pos, vel, mass = (put_global(a, part) for a in (pos, vel, mass))
        return pos, vel, mass, params_on_mesh(params, pos.dtype)

    if engine == "shard_map":
        state_spec = NBodyState(P(AXIS), P(AXIS), P(AXIS), P(AXIS))
        init = jax.jit(
            jax.shard_map(
                functools.partial(_block_init, axis_name=AXIS, n_dev=n_devices, tb=tb),
                mesh=mesh,
                in_specs=(P(AXIS), P(AXIS), P(AXIS), P()),
                out_specs=state_spec,
            )
        )
        run = jax.jit(
            jax.shard_map(
                functools.partial(_block_run, axis_name=AXIS, n_dev=n_devices, tb=tb),
                mesh=mesh,
                in_specs=(state_spec, P(), P()),
                out_specs=(state_spec, P()),
            )
        )
        obs = jax.jit(
            jax.shard_map(
                functools.partial(_block_observables, axis_name=AXIS, n_dev=n_devices, tb=tb),
                mesh=mesh,
                in_specs=(state_spec, P()),
                out_specs=P(),
            )
        )
    else:  # sharded: the unchanged whole-system programs, partitioned by XLA
        state_sh = NBodyState(part, part, part, part)
        init = jax.jit(functools.partial(_global_init, tb=tb), out_shardings=state_sh)
        run = jax.jit(functools.partial(_global_run, tb=tb), out_shardings=(state_sh, repl))
        obs = jax.jit(functools.partial(_global_observables, tb=tb), out_shardings=repl)

    def params_on_mesh(params, dtype):  # replicated on every device of every process
        return NBodyParams(*(put_global(np.asarray(p, dtype), repl) for p in params))

    def host_obs(o):  # replicated results (may span processes) -> NumPy
        return Observables(*(to_host(x) for x in o))

    def run_fn(state, params, n_steps):
        n_steps = put_global(np.asarray(n_steps, np.int32), repl)
        state, o = run(state, params_on_mesh(params, state.pos.dtype), n_steps)
        return state, host_obs(o)

    return NBodyEngine(
        engine,
        n_devices,
        lambda *a: init(*put(*a)),
        run_fn,
        lambda s, p: host_obs(obs(s, params_on_mesh(p, s.pos.dtype))),
        _fetch_global,
        lambda st: NBodyState(*(put_global(a, part) for a in st)),
    )


def nbody_run(
    state: NBodyState,
    params: NBodyParams,
    n_steps: int,
    engine: str = "single",
    n_devices: int = 1,
) -> tuple[NBodyState, Observables]:
    """Run ``n_steps`` leapfrog steps of a whole system on one engine, in one dispatch.

    The accelerations are recomputed by the engine from ``state.pos`` first (one extra
    force evaluation; ``state.acc`` is ignored). For chunked runs that keep the state on
    the devices, use ``make_engine(engine, n_devices)`` directly.

    Args:
      state: whole-system state, arrays (N, 3) / (N,) of one floating dtype.
      params: time step, G and softening (cast to the state's dtype).
      n_steps: number of steps (>= 0); 0 returns the engine's forces at ``state.pos``.
      engine: one of ``ENGINES``.
      n_devices: ring size (1 for ``single``); must divide N.

    Returns:
      (final state as NumPy arrays, observables of the final state as NumPy values).

    Raises:
      ConfigError: unknown engine, too many devices, or N not divisible by n_devices.
    """
    check_layout(len(state.mass), engine, n_devices)
    eng = make_engine(engine, n_devices)
    dstate = eng.init(state.pos, state.vel, state.mass, params)
    dstate, obs = eng.run(dstate, params, n_steps)
    return eng.fetch(dstate), Observables(*(np.asarray(o) for o in obs))
