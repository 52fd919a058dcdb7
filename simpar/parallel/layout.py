"""The sharding tour: which device holds which block of the state, for an engine and a mesh.

``describe(engine)`` returns text for ``simpar run ... --show-layout`` and
``simpar info --mesh AxB``: one line per device (its grid coordinates and the cells it holds)
and, for 1-D and 2-D domains, the picture that ``jax.debug.visualize_array_sharding`` draws
(needs the ``rich`` package, in the ``layout`` extra; without it the table alone is printed).

For ``shard_map`` and ``sharded`` the picture is that of a field as the engine places it. A
``pmap`` state is a stack of blocks on one flat device axis; device ``i`` holds the block at
grid coordinates ``DeviceGrid.coords(i)`` (C order), so its picture is drawn from a
``NamedSharding`` over the same devices laid out on the device grid: the same device per
block as the flat axis (``tests/test_workflows.py`` checks it against placed blocks).
"""

from __future__ import annotations

import contextlib
import io

import jax

from simpar.axes import AXIS_NAMES
from simpar.parallel import blocks as _blocks


def blocks(engine) -> list[dict]:
    """Per device: ``{"device", "index", "member", "coords", "cells"}`` with ``cells`` one
    ``(start, stop)`` cell range per spatial axis (x, y[, z]); ``member`` is the ensemble
    member (0 without an ensemble; members hold consecutive groups of devices)."""
    grid, shape = engine.grid, engine.domain_shape
    size = [n // m for n, m in zip(shape, grid.shape, strict=True)]
    out = []
    for i, dev in enumerate(engine.devices):
        member, j = divmod(i, grid.size)
        c = grid.coords(j)
        cells = [(k * b, (k + 1) * b) for k, b in zip(c, size, strict=True)]
        out.append({"device": str(dev), "index": i, "member": member, "coords": c, "cells": cells})
    return out


def _picture(engine) -> str:
    """``jax.debug.visualize_array_sharding`` of one field (1-D/2-D domains), as text."""
    try:
        import rich  # noqa: F401
    except ImportError:
        return "(install rich, e.g. pip install 'simpar[layout]', for a picture)\n"
    shape = engine.domain_shape
    if engine.mapping.kind.stacked:
        # the flat pmap axis mapped back to the grid: device i at grid.coords(i)
        mesh = _blocks.make_mesh(engine.grid.shape, engine.grid.axis_names, engine.devices)
        sharding = _blocks.sharding(mesh, *mesh.axis_names)
    else:  # where the engine places a field, from the mapping: nothing is allocated
        sharding = engine.sharding(len(shape))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        jax.debug.visualize_sharding(shape, sharding, use_color=False)
    return buf.getvalue()


def describe(engine) -> str:
    """Text: the engine, mesh and block size, one line per device, and a picture in 1-D/2-D.

    In the picture rows are blocks along x (array axis 0) and columns blocks along y.
    """
    grid, shape = engine.grid, engine.domain_shape
    names = AXIS_NAMES[: len(shape)]
    size = [n // m for n, m in zip(shape, grid.shape, strict=True)]
    lines = [
        f"engine {engine.name}: grid {'x'.join(map(str, shape))} cells on device mesh "
        f"{'x'.join(map(str, grid.shape))} ({', '.join(names)}), blocks of "
        f"{'x'.join(map(str, size))} cells, halo {engine.halo}"
    ]
    members = getattr(engine, "members", None)
    if members is not None:
        lines.append(
            f"ensemble of {members} members, each on its own {grid.size} device(s)"
            + (" (vmapped on one device)" if engine.mapping.kind.one_device else "")
        )
    stacked = engine.mapping.kind.stacked
    if stacked and members is None:
        lines.append("pmap flat index i holds the block at grid coordinates coords(i), C order")
    elif stacked:
        lines.append(
            f"pmap flat index i holds member i // {grid.size}'s block at grid coordinates "
            f"coords(i % {grid.size}), C order"
        )
    for b in blocks(engine):
        cells = ", ".join(f"{n} {a}:{z}" for n, (a, z) in zip(names, b["cells"], strict=True))
        who = f"member {b['member']}  " if members is not None else ""
        lines.append(f"  {b['device']:>8}  index {b['index']}  {who}coords {b['coords']}  {cells}")
    text = "\n".join(lines) + "\n"
    if len(shape) <= 2 and members is None:
        text += "rows: blocks along x; columns: blocks along y\n" + _picture(engine)
    return text
