"""Meshes, mapped-program wrappers and host <-> device transfers: the primitives under the mapping.

The primitives under ``simpar.parallel.mapping`` (which alone knows the engine names and the
rule that turns a requested engine and mesh into a device grid): the "N devices requested" checks,
the ``Mesh``/``NamedSharding`` of the ``shard_map`` and ``sharded`` engines, the ``pmap`` and
``shard_map`` wrappers of a per-block function, and the transfers between the host and the
devices (one process or several). Grid engines (``engines``), ensembles (``ensemble``), the
N-body ring (``ring``) and particle sharding (``particles``) are thin users of it.

Layouts the transfers know:

- *stacked blocks* (``pmap``): ``(n_dev, ...)``, block ``i`` on ``devices[i]``
  (:func:`put_blocks`, :func:`gather_blocks`);
- *global arrays* (``shard_map``, ``sharded``): one ``jax.Array`` with a ``NamedSharding``
  that may span processes (:func:`put_global`, :func:`place`, :func:`to_host`).

Meshes have ``AxisType.Auto`` axes (unchanged global-view code is partitioned by XLA; with
``Explicit`` axes ``jnp.roll`` on a sharded axis fails at trace time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from simpar.errors import ConfigError


def require_devices(
    mesh: Sequence[int], n_devices: int, key: str = "--mesh", members: int = 1
) -> None:
    """``ConfigError`` on ``key`` when ``members x prod(mesh)`` exceeds the ``n_devices``.

    Args:
      mesh: one member's device grid.
      n_devices: devices JAX sees (every process).
      key: the option named in the message (``--mesh``; ``ensemble.members`` for ensembles).
      members: ensemble members, each on its own ``prod(mesh)`` devices.
    """
    need = math.prod(mesh) * members
    if need <= n_devices:
        return
    shape = "x".join(map(str, mesh))
    if members > 1:
        raise ConfigError(
            key,
            f"{members} members x mesh {shape} need {need} devices but only {n_devices} are "
            f"available (fewer members, a smaller mesh, or on CPU --devices {need})",
        )
    raise ConfigError(
        key,
        f"mesh {shape} needs {need} devices but only {n_devices} are available "
        f"(on CPU, pass --devices {need})",
    )


def require_count(n_devices: int, key: str = "parallel.devices") -> None:
    """``ConfigError`` on ``key`` unless ``1 <= n_devices <= len(jax.devices())``."""
    available = len(jax.devices())
    if n_devices < 1 or n_devices > available:
        raise ConfigError(key, f"{n_devices} devices requested, JAX sees {available}")


def require_every_process(n_devices: int, what: str, key: str = "parallel.devices") -> None:
    """``ConfigError`` when the first ``n_devices`` devices miss a process of the run.

    Args:
      n_devices: devices used, the first of ``jax.devices()`` (listed by process).
      what: the device set in words, e.g. ``"a ring of 4 devices"``.
      key: the option named in the message.
    """
    available = jax.devices()
    idle = sorted(
        {d.process_index for d in available} - {d.process_index for d in available[:n_devices]}
    )
    if idle:
        raise ConfigError(
            key,
            f"{what} (the first {n_devices} of {len(available)}, listed by process) leaves "
            f"process(es) {idle} without a device; across {jax.process_count()} processes the "
            f"devices must include one of each: use all {len(available)} (the default) or a "
            "count that reaches the last process",
        )


# --------------------------------------------------------------------------------------------
# Meshes, shardings and the mapped programs
# --------------------------------------------------------------------------------------------
PMAP_AXIS = "dev"  # the one flat axis of every pmap program


def make_mesh(shape: Sequence[int], names: Sequence[str], devices) -> Mesh:
    """A ``Mesh`` of ``devices`` (C order, ``prod(shape)`` of them) with ``Auto`` axes.

    Args:
      shape: devices along each mesh axis, e.g. ``(2, 4)``.
      names: one name per axis, e.g. ``("x", "y")``.
      devices: the devices, in the order of the flat block index.
    """
    shape = tuple(int(n) for n in shape)
    return Mesh(
        np.asarray(list(devices)[: math.prod(shape)], dtype=object).reshape(shape),
        tuple(names),
        axis_types=(AxisType.Auto,) * len(shape),
    )


def sharding(mesh: Mesh, *spec) -> NamedSharding:
    """``NamedSharding(mesh, PartitionSpec(*spec))``; no ``spec``: replicated."""
    return NamedSharding(mesh, P(*spec))


def pmap(
    fn: Callable,
    devices,
    in_axes=0,
    out_axes=0,
    donate: bool = False,
    axis_name: str = PMAP_AXIS,
) -> Callable:
    """``fn`` (a per-block program) mapped over stacked blocks, block ``i`` on ``devices[i]``.

    Args:
      fn: the per-block function; its collectives name ``axis_name``.
      devices: the devices of the flat axis.
      in_axes, out_axes: as ``jax.pmap`` (``None``: replicated).
      donate: donate the first argument's buffers to the result.
      axis_name: the mapped axis.
    """
    return jax.pmap(
        fn,
        axis_name=axis_name,
        in_axes=in_axes,
        out_axes=out_axes,
        devices=list(devices),
        donate_argnums=0 if donate else (),
    )


def shard_map(fn: Callable, mesh: Mesh, in_specs, out_specs, check_vma: bool = True) -> Callable:
    """``fn`` (a per-block program) under ``jax.shard_map`` on ``mesh`` (to be jit-compiled).

    ``in_specs``/``out_specs`` are pytrees (prefixes) of ``PartitionSpec``; collectives in
    ``fn`` name the mesh axes. ``check_vma=False`` where a value reduced over every mesh axis
    meets per-device values (``lax.cond``/``while_loop``, or sums over a size-1 axis).
    """
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)


# --------------------------------------------------------------------------------------------
# Host <-> devices (one process or several)
# --------------------------------------------------------------------------------------------
def to_host(x) -> np.ndarray:
    """The whole value of a (possibly multi-process) array as NumPy, on every process.

    Arrays whose shards all live in this process are copied directly; others are gathered with
    ``multihost_utils.process_allgather`` (a collective: every process must call it, in the same
    order).
    """
    if getattr(x, "is_fully_addressable", True) or getattr(x, "is_fully_replicated", False):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def stack(x, n_blocks: int) -> np.ndarray:
    """Host ``(N, ...)`` -> ``(n_blocks, N // n_blocks, ...)`` (``N`` a multiple of it)."""
    x = np.asarray(x)
    return x.reshape((n_blocks, x.shape[0] // n_blocks) + x.shape[1:])


def put_blocks(blocks, devices):
    """Host blocks ``(len(devices), ...)`` -> a ``pmap`` array, block ``i`` on ``devices[i]``;
    a pytree of them -> the same pytree of ``pmap`` arrays, placed by one program.

    In a multi-process run each process places only the blocks of its own devices (every
    process passes the whole host array; the others' blocks are dropped here). An identity
    ``pmap`` does the placement (``device_put_sharded`` is deprecated), over the axis name of
    :func:`pmap`: the arrays' mesh then equals that of a program's results, and a program
    called first on placed blocks and then on its own results compiles once. A pytree goes
    through one identity program (one compilation, not one per shape and dtype: a
    decomposed MD state and its lists, 22 arrays, 0.55 -> 0.12 s CPU).
    """
    devices = list(devices)
    leaves, tree = jax.tree.flatten(blocks)
    leaves = [np.asarray(b) for b in leaves]
    mine = [i for i, d in enumerate(devices) if d.process_index == jax.process_index()]
    if len(mine) < len(devices):
        leaves = [b[mine] for b in leaves]
    out = jax.pmap(lambda *xs: xs, axis_name=PMAP_AXIS, devices=devices)(*leaves)
    return jax.tree.unflatten(tree, out)


def put_global(x, where: NamedSharding):
    """A host array -> a global ``jax.Array`` with sharding ``where`` (may span processes).

    Each process materialises only the shards its own devices hold
    (``jax.make_array_from_callback``); every process must pass the same whole value.
    """
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, where, lambda idx: x[idx])


def place(x, where):
    """Any array -> the layout ``where`` (a ``NamedSharding`` or one device).

    On one device: ``jax.device_put``. For a ``NamedSharding``: a tracer gets a sharding
    constraint (which, unlike ``device_put``, keeps a vmapped batch axis whole), a
    ``jax.Array`` a copy in the layout, host data :func:`put_global` (each process
    materialises only its own shards).
    """
    if not isinstance(where, NamedSharding):  # one device
        return jax.device_put(x if isinstance(x, jax.Array) else np.asarray(x), where)
    if isinstance(x, jax.core.Tracer):
        return lax.with_sharding_constraint(x, where)
    if isinstance(x, jax.Array):
        return jax.device_put(x, where)
    return put_global(x, where)


def gather_blocks(x) -> np.ndarray:
    """A ``pmap`` result ``(n_local_devices, ...)`` -> all processes' blocks ``(n_devices, ...)``.

    Under ``pmap`` each process holds the blocks of its own devices; they are concatenated in
    process order, which is the order of ``jax.devices()`` (a collective, like :func:`to_host`).
    """
    if jax.process_count() == 1 or not getattr(x, "is_fully_addressable", True):
        return to_host(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


class DonatedStateError(RuntimeError):
    """A state whose buffers were donated (``advance(..., donate=True)``) was used again."""


def check_live(tree, where: str) -> None:
    """Raise :class:`DonatedStateError` if a leaf of ``tree`` is a deleted (donated) array.

    Reusing a donated buffer raises a JAX error on one device but has killed the interpreter
    (segmentation fault) under ``pmap``, ``shard_map`` and ``sharded``; this check turns every
    case into a Python error before JAX sees the array.

    Args:
      tree: a pytree of arrays (a placed state).
      where: the call in words, for the message (e.g. ``"Engine.advance"``).
    """
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer):
            if leaf.is_deleted():
                raise DonatedStateError(
                    f"{where}: the state's buffers were deleted, most likely donated by an "
                    "earlier advance(..., donate=True), which consumes its input state; keep "
                    "using the state that call returned, or call advance with donate=False "
                    "to reuse a state"
                )
