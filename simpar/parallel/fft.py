"""Distributed FFTs of a field split over the device grid: local FFTs and all-to-all transposes.

A field of global shape ``(*lead, N_0, ..., N_{d-1})`` (``d`` = 1 to 3 spatial axes, leading
component/batch axes never split) is laid out as the grid engines lay it out: spatial axis
``a`` split into ``mesh[a]`` blocks (a mesh with fewer entries than ``d`` is padded with 1s).
The forward transform runs local 1-D FFTs along the axes a block holds whole and, in between,
``Comm.all_to_all`` transposes along one mesh axis at a time (each moves one local block per
device): a *slab* decomposition on a 1-D mesh ``(n,)``, a *pencil* decomposition on a 2-D mesh
``(a, b)`` of a 3-D grid.

**Fourier-space layout.** The forward transform does not transpose back: its output is split
differently from its input, and the inverse takes that layout. ``FFTPlan.fourier_split[a]``
lists the mesh axes that split Fourier axis ``a``, major first; ``FFTPlan.real_split`` is the
input layout. For the common cases:

========================== ============================= =====================================
grid / mesh                real space (input)            Fourier space (output)
========================== ============================= =====================================
2-D or 3-D on ``(n,)``     axis 0 split over mesh x      axis 1 split over mesh x (slab)
3-D on ``(a, b)``          axes 0, 1 over x, y           axis 1 over x, axis 2 over y (pencil)
2-D on ``(a, b)``          axes 0, 1 over x, y           axis 1 over ``(y, x)`` (y major)
3-D on ``(a, b, c)``       axes 0, 1, 2 over x, y, z     axis 1 over ``(z, x)``, axis 2 over y
========================== ============================= =====================================

A mesh that splits every spatial axis (2-D on ``(a, b)``, 3-D on ``(a, b, c)``) is supported,
not refused: the first transform needs a whole axis, so it costs one transpose more (3 instead
of 2 on 2-D, 4 instead of 3 on 3-D); every transpose still moves one local block. The solvers
never need the layout spelled out: ``SpectralOps.freq(a)`` gives the integer frequencies of the
block a device holds, so a Fourier-space multiplier is computed where the data already sit.

**Real transforms** (``real=True``: ``rfftn``/``irfftn``) halve the last axis first, to
``H = N_{d-1} // 2 + 1``. When the Fourier layout splits that axis over ``M`` devices, ``H``
rarely divides, so the half axis is zero-padded to ``Hp``, the next multiple of ``M``
(``FFTPlan.fourier_shape``); the forward output is zero there and the inverse ignores those
entries. ``jnp.fft.rfftn(u)`` equals the gathered output's ``[..., :H]``.

Engines: ``pmap`` and ``shard_map`` call :func:`block_ops` (per-block functions over a
``PmapComm`` / ``ShardMapComm``); ``single`` and ``sharded`` call :func:`global_ops` (global
arrays; the sharded one wraps the per-block transform in a ``shard_map`` so that only the
transposes move: a plain ``jnp.fft.fftn`` of a sharded array all-gathers it on every device).
On one device every path equals ``jnp.fft`` to round-off (``tests/test_fft.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from simpar.errors import ConfigError
from simpar.parallel import blocks, mapping
from simpar.parallel.blocks import PMAP_AXIS  # noqa: F401  (re-exported: tests and scripts name it)
from simpar.parallel.comm import LocalComm, ShardMapComm
from simpar.parallel.topology import AXIS_NAMES, DeviceGrid


@dataclass(frozen=True)
class FFTPlan:
    """The static recipe of one distributed transform (changing any field recompiles).

    Attributes:
      shape: global real-space grid ``(N_0, ..., N_{d-1})``, cells.
      mesh: devices along each spatial axis, padded with 1s to ``d`` entries.
      real: ``True`` for ``rfftn``/``irfftn`` (real input, half last axis).
      steps: forward program, in order: ``("fft", a)`` transforms spatial axis ``a``;
        ``("a2a", g, t, s)`` transposes along mesh axis ``g``, splitting spatial axis ``t``
        and joining spatial axis ``s``. The inverse runs it backwards.
      real_split: per spatial axis, the mesh axes splitting it in real space (major first).
      fourier_split: the same in Fourier space (the forward output / inverse input).
      fourier_shape: global Fourier shape; equals ``shape`` except the padded half axis
        ``Hp`` when ``real``.
    """

    shape: tuple[int, ...]
    mesh: tuple[int, ...]
    real: bool
    steps: tuple[tuple, ...]
    real_split: tuple[tuple[int, ...], ...]
    fourier_split: tuple[tuple[int, ...], ...]
    fourier_shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        """Number of spatial axes ``d``."""
        return len(self.shape)

    @property
    def half(self) -> int:
        """Unpadded length of the last Fourier axis: ``N // 2 + 1`` if ``real`` else ``N``."""
        return self.shape[-1] // 2 + 1 if self.real else self.shape[-1]

    @property
    def n_transposes(self) -> int:
        """All-to-all transposes per forward (or inverse) transform."""
        return sum(s[0] == "a2a" for s in self.steps)

    def block_shape(self, fourier: bool) -> tuple[int, ...]:
        """Spatial shape of one device's block in real (``False``) or Fourier space."""
        shape, split = (
            (self.fourier_shape, self.fourier_split) if fourier else (self.shape, self.real_split)
        )
        return tuple(
            n // math.prod(self.mesh[g] for g in s) for n, s in zip(shape, split, strict=True)
        )

    def spec(self, fourier: bool, nlead: int = 0) -> P:
        """``PartitionSpec`` of the global field in real or Fourier layout (mesh ``x, y, z``)."""
        split = self.fourier_split if fourier else self.real_split
        entries = []
        for s in split:
            names = tuple(AXIS_NAMES[g] for g in s)
            entries.append(None if not names else names[0] if len(names) == 1 else names)
        return P(*(None,) * nlead, *entries)


def _fmt(shape: Sequence[int]) -> str:
    return "x".join(str(n) for n in shape)


def make_plan(shape: Sequence[int], mesh: Sequence[int] = (1,), real: bool = False) -> FFTPlan:
    """Plan the transform of a ``shape`` grid split over ``mesh`` (see the module docstring).

    Greedy: transform a whole axis while one is left; else make the not-yet-transformed axis
    with the fewest splits whole by moving its mesh axes, minor first, onto an axis already
    transformed (the one with the fewest splits, not the half axis of a real transform when
    another will do) or, before any is, onto another axis.

    Args:
      shape: global grid ``(N_0, ..., N_{d-1})``, ``1 <= d <= 3``.
      mesh: devices per spatial axis (``(8,)``, ``(2, 4)``, ``(2, 2, 2)``; padded with 1s).
      real: plan ``rfftn``/``irfftn`` instead of ``fftn``/``ifftn``.

    Raises:
      ConfigError: on ``--mesh`` when the mesh has more axes than the grid, does not divide
        it, or a transpose would cut an axis into unequal pieces (the message names the axis
        and the sizes that work).
    """
    shape = tuple(int(n) for n in shape)
    d = len(shape)
    if not 1 <= d <= 3 or any(n < 1 for n in shape):
        raise ConfigError("grid.shape", f"FFT needs 1 to 3 positive sizes, got {shape}")
    mesh = tuple(int(m) for m in mesh)
    if len(mesh) > d or any(m < 1 for m in mesh):
        raise ConfigError(
            "--mesh", f"mesh {_fmt(mesh)} needs 1 to {d} positive entries for a {d}-D FFT"
        )
    mesh = mesh + (1,) * (d - len(mesh))
    split = [[a] if mesh[a] > 1 else [] for a in range(d)]
    real_split = tuple(tuple(s) for s in split)
    if sum(m > 1 for m in mesh) and d == 1:
        raise ConfigError("--mesh", "a 1-D FFT cannot be split over devices; use one device")
    steps, done = [], []
    last = d - 1
    while len(done) < d:
        todo = [a for a in range(d) if a not in done]
        if real and not done:
            target = last  # rfft must see real data: the half axis goes first
        elif any(not split[a] for a in todo):
            target = max(a for a in todo if not split[a])
        else:
            target = min(todo, key=lambda a: (len(split[a]), -a))
        while split[target]:
            g = split[target][-1]
            pool = [a for a in done] or [a for a in todo if a != target]
            dst = min(pool, key=lambda a: (real and a == last, len(split[a]), a))
            steps.append(("a2a", g, dst, target))
            split[target].pop()
            split[dst].append(g)
        steps.append(("fft", target))
        done.append(target)
    fourier_split = tuple(tuple(s) for s in split)
    fshape = list(shape)
    if real:
        m = math.prod(mesh[g] for g in fourier_split[last])
        fshape[last] = -(-(shape[last] // 2 + 1) // m) * m
    # replay the program and check that every cut is into equal pieces
    lengths, cur = list(shape), [list(s) for s in real_split]
    for a in range(d):
        _check_cut(shape, mesh, a, lengths[a], mesh[a], "is split")
    for st in steps:
        if st[0] == "fft":
            lengths[st[1]] = fshape[st[1]]
            continue
        _, g, t, s = st
        cur[s].pop()
        cur[t].append(g)
        _check_cut(shape, mesh, t, lengths[t], math.prod(mesh[k] for k in cur[t]), "transposes")
    return FFTPlan(shape, mesh, bool(real), tuple(steps), real_split, fourier_split, tuple(fshape))


def _check_cut(shape, mesh, axis, length, parts, what):
    if length % parts:
        raise ConfigError(
            "--mesh",
            f"the FFT of grid {_fmt(shape)} on mesh {_fmt(mesh)} {what} axis "
            f"{AXIS_NAMES[axis]} ({length} entries) into {parts} pieces, which does not "
            f"divide; choose grid sizes divisible by {parts} or another mesh",
        )


def forward_block(x: jax.Array, plan: FFTPlan, comm) -> jax.Array:
    """Forward transform of one device's block (``fftn``, or ``rfftn`` when ``plan.real``).

    Args:
      x: block ``(*lead, *plan.block_shape(False))``; real (``plan.real``) or complex.
      plan: from :func:`make_plan`.
      comm: ``LocalComm`` (one device), ``PmapComm`` or ``ShardMapComm`` on the plan's mesh.

    Returns:
      Complex block ``(*lead, *plan.block_shape(True))`` in the Fourier layout.
    """
    d = plan.ndim
    nl = x.ndim - d
    for st in plan.steps:
        if st[0] == "a2a":
            _, g, t, s = st
            x = comm.all_to_all(x, g, nl + t, nl + s)
        elif plan.real and st[1] == d - 1:
            x = jnp.fft.rfft(x, axis=-1)
            extra = plan.fourier_shape[-1] - x.shape[-1]
            if extra:
                x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, extra)])
        else:
            x = jnp.fft.fft(x, axis=nl + st[1])
    return x


def inverse_block(k: jax.Array, plan: FFTPlan, comm) -> jax.Array:
    """Inverse of :func:`forward_block` (``ifftn``, or ``irfftn`` when ``plan.real``).

    Args:
      k: complex block ``(*lead, *plan.block_shape(True))`` in the Fourier layout.

    Returns:
      ``(*lead, *plan.block_shape(False))`` in the real-space layout; real when ``plan.real``
      (padding entries of the half axis are ignored).
    """
    d = plan.ndim
    nl = k.ndim - d
    for st in reversed(plan.steps):
        if st[0] == "a2a":
            _, g, t, s = st
            k = comm.all_to_all(k, g, nl + s, nl + t)
        elif plan.real and st[1] == d - 1:
            k = jnp.fft.irfft(k[..., : plan.half], n=plan.shape[-1], axis=-1)
        else:
            k = jnp.fft.ifft(k, axis=nl + st[1])
    return k


def _signed(i, n: int, half_axis: bool):
    """Integer frequency of index ``i`` on an ``n``-point axis (``numpy.fft.fftfreq * n``)."""
    return i if half_axis else jnp.where(i < (n + 1) // 2, i, i - n)


def freq_block(plan: FFTPlan, comm, axis: int) -> jax.Array:
    """Integer frequencies of the Fourier block a device holds along spatial ``axis``.

    Returns:
      int32, shape ``(1, ..., n_a, ..., 1)`` (``d`` axes, ``n_a`` the block's length on
      ``axis``): ``m`` with wavenumber ``k = 2 pi m / L_a``; ``0 .. Hp-1`` on the half axis of
      a real transform, else ``0, 1, ..., -1`` as ``numpy.fft.fftfreq(N) * N``.
    """
    d = plan.ndim
    n = plan.block_shape(True)[axis]
    pos = 0
    for g in plan.fourier_split[axis]:
        pos = pos * plan.mesh[g] + comm.coord(g)
    i = pos * n + lax.iota(jnp.int32, n)
    m = _signed(i, plan.shape[axis], plan.real and axis == d - 1)
    return m.reshape([n if a == axis else 1 for a in range(d)]).astype(jnp.int32)


@dataclass(frozen=True)
class SpectralOps:
    """The transforms a solver calls, for one engine (the protocol ``simpar.grid.poisson`` uses).

    Attributes:
      forward: real-space field or block -> Fourier field or block (layout in ``plan``).
      inverse: its inverse.
      freq: ``freq(axis)`` -> int32 integer frequencies of the (local) Fourier data along
        ``axis``, broadcastable over the trailing ``d`` axes.
      plan: the ``FFTPlan``; ``plan.shape`` is the global grid, ``plan.real`` the kind.
    """

    forward: Callable[[jax.Array], jax.Array]
    inverse: Callable[[jax.Array], jax.Array]
    freq: Callable[[int], jax.Array]
    plan: FFTPlan

    @property
    def shape(self) -> tuple[int, ...]:
        """Global real-space grid ``(N_0, ..., N_{d-1})``."""
        return self.plan.shape

    @property
    def real(self) -> bool:
        """Whether ``forward`` is ``rfftn`` (real input)."""
        return self.plan.real


def grid_comm(plan: FFTPlan, engine: str):
    """The ``Comm`` a per-block transform uses under ``engine`` (``pmap`` axis ``"dev"``): the
    comm of the engine's ``simpar.parallel.mapping.Mapping`` over ``plan.mesh``."""
    k = mapping.kind(engine)
    if not (k.per_block or (k.one_device and math.prod(plan.mesh) == 1)):
        raise ConfigError("--engine", f"per-block FFT runs under pmap or shard_map, not {engine!r}")
    if k.one_device:
        return LocalComm(plan.ndim)
    return mapping.Mapping(engine, mapping.device_grid(plan.mesh)).comm


def block_ops(plan: FFTPlan, engine: str) -> SpectralOps:
    """Per-block transforms for code that runs inside ``pmap`` (axis ``"dev"``) or
    ``shard_map`` (mesh axes ``x, y, z``), e.g. a grid model's ``advance_block``."""
    comm = grid_comm(plan, engine)
    return SpectralOps(
        lambda x: forward_block(x, plan, comm),
        lambda k: inverse_block(k, plan, comm),
        lambda a: freq_block(plan, comm, a),
        plan,
    )


def global_ops(plan: FFTPlan, mesh: Mesh | None = None) -> SpectralOps:
    """Global-view transforms for ``single`` (``mesh=None``) and ``sharded``.

    With a mesh, ``forward`` is a ``shard_map`` of :func:`forward_block` from
    ``plan.spec(False)`` to ``plan.spec(True)``: called under ``jax.jit`` on an array with the
    real-layout ``NamedSharding`` it compiles to the plan's all-to-alls and nothing else.
    ``freq`` gives global frequency vectors (XLA slices them where they are used).
    """
    if mesh is None:  # one device: jnp.fft itself (bitwise equal to it)
        if math.prod(plan.mesh) != 1:
            raise ConfigError("--mesh", f"mesh {_fmt(plan.mesh)} needs a device mesh")
        axes = tuple(range(-plan.ndim, 0))
        if plan.real:
            fwd = lambda x: jnp.fft.rfftn(x, axes=axes)  # noqa: E731
            inv = lambda k: jnp.fft.irfftn(k, s=plan.shape, axes=axes)  # noqa: E731
        else:
            fwd = lambda x: jnp.fft.fftn(x, axes=axes)  # noqa: E731
            inv = lambda k: jnp.fft.ifftn(k, axes=axes)  # noqa: E731
        return SpectralOps(fwd, inv, lambda a: global_freq(plan, a), plan)
    comm = ShardMapComm(DeviceGrid(plan.mesh, (True,) * plan.ndim))

    def forward(x):
        nl = x.ndim - plan.ndim
        f = blocks.shard_map(
            lambda b: forward_block(b, plan, comm), mesh, plan.spec(False, nl), plan.spec(True, nl)
        )
        return f(x)

    def inverse(k):
        nl = k.ndim - plan.ndim
        f = blocks.shard_map(
            lambda b: inverse_block(b, plan, comm), mesh, plan.spec(True, nl), plan.spec(False, nl)
        )
        return f(k)

    def freq(axis):
        # laid out like the Fourier data along ``axis``: the multipliers built from it are then
        # computed where the data sit (unconstrained, XLA all-gathered pieces of them)
        entries = [None] * plan.ndim
        entries[axis] = plan.spec(True)[axis]
        sharding = blocks.sharding(mesh, *entries)
        return lax.with_sharding_constraint(global_freq(plan, axis), sharding)

    return SpectralOps(forward, inverse, freq, plan)


def global_freq(plan: FFTPlan, axis: int) -> jax.Array:
    """:func:`freq_block` of the whole Fourier field: int32, ``(1, ..., fourier_shape[axis],
    ..., 1)``."""
    d = plan.ndim
    n = plan.fourier_shape[axis]
    m = _signed(lax.iota(jnp.int32, n), plan.shape[axis], plan.real and axis == d - 1)
    return m.reshape([n if a == axis else 1 for a in range(d)])


def make_ops(engine: str, shape: Sequence[int], mesh: Sequence[int] = (1,), real: bool = False):
    """``(plan, ops)`` for ``engine``: :func:`block_ops` for ``pmap``/``shard_map``,
    :func:`global_ops` for ``single``/``sharded`` (the sharded mesh from :func:`device_mesh`)."""
    k = mapping.kind(engine)
    plan = make_plan(shape, (1,) if k.one_device else mesh, real)
    if k.per_block:
        return plan, block_ops(plan, engine)
    if k.partitioned:
        return plan, global_ops(plan, device_mesh(plan.mesh))
    return plan, global_ops(plan)


# -- meshes and per-block programs for tests and scripts (through simpar.parallel.mapping) ----


def device_mesh(mesh: Sequence[int], devices=None) -> Mesh:
    """An ``AxisType.Auto`` mesh named ``x, y, z`` over the first ``prod(mesh)`` devices
    (built by :func:`simpar.parallel.blocks.make_mesh`).

    Raises:
      ConfigError: on ``--mesh`` when there are fewer devices than ``prod(mesh)``."""
    devices = list(jax.devices() if devices is None else devices)
    blocks.require_devices(mesh, len(devices))
    return blocks.make_mesh(mesh, AXIS_NAMES[: len(mesh)], devices)


def blockwise(fn, plan: FFTPlan, engine: str, fourier_in: bool, fourier_out: bool, nlead=0):
    """Run a per-block ``fn(block) -> block`` on every device, for tests and scripts.

    ``pmap``: a ``jax.pmap`` over stacked blocks ``(n_dev, *lead, *block)`` (see
    :func:`split_blocks`); ``shard_map``: a jitted ``shard_map`` over global arrays in the
    layouts named by ``fourier_in`` / ``fourier_out`` (``simpar.parallel.mapping``).
    """
    if not mapping.kind(engine).per_block:
        raise ConfigError("--engine", f"blockwise runs pmap or shard_map, not {engine!r}")
    m = mapping.Mapping(engine, mapping.device_grid(plan.mesh))
    return m.map(
        fn, (mapping.pencils(plan, fourier_in, nlead),), mapping.pencils(plan, fourier_out, nlead)
    )


def split_blocks(u, plan: FFTPlan, fourier: bool):
    """Global ``(*lead, *shape)`` -> stacked blocks ``(n_dev, *lead, *block)`` in the layout
    (device order = C order over ``plan.mesh``, the flat ``pmap`` axis). NumPy or JAX arrays."""
    d = plan.ndim
    split = plan.fourier_split if fourier else plan.real_split
    blocks = plan.block_shape(fourier)
    xp = jnp if isinstance(u, jax.Array) else np
    out = []
    for i in range(math.prod(plan.mesh)):
        c = np.unravel_index(i, plan.mesh)
        idx = [slice(None)] * (u.ndim - d)
        for a in range(d):
            pos = 0
            for g in split[a]:
                pos = pos * plan.mesh[g] + int(c[g])
            idx.append(slice(pos * blocks[a], (pos + 1) * blocks[a]))
        out.append(u[tuple(idx)])
    return xp.stack(out)


def join_blocks(b, plan: FFTPlan, fourier: bool):
    """Inverse of :func:`split_blocks`: ``(n_dev, *lead, *block)`` -> ``(*lead, *shape)``."""
    d = plan.ndim
    split = plan.fourier_split if fourier else plan.real_split
    blocks = plan.block_shape(fourier)
    full = plan.fourier_shape if fourier else plan.shape
    b = np.asarray(b)
    out = np.zeros(b.shape[1 : b.ndim - d] + tuple(full), b.dtype)
    for i in range(b.shape[0]):
        c = np.unravel_index(i, plan.mesh)
        idx = [slice(None)] * (b.ndim - 1 - d)
        for a in range(d):
            pos = 0
            for g in split[a]:
                pos = pos * plan.mesh[g] + int(c[g])
            idx.append(slice(pos * blocks[a], (pos + 1) * blocks[a]))
        out[tuple(idx)] = b[i]
    return out


__all__ = [
    "FFTPlan",
    "SpectralOps",
    "block_ops",
    "blockwise",
    "device_mesh",
    "forward_block",
    "freq_block",
    "global_freq",
    "global_ops",
    "grid_comm",
    "inverse_block",
    "join_blocks",
    "make_ops",
    "make_plan",
    "split_blocks",
]
