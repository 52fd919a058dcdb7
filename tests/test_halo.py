"""Halo exchange of width 1-3 on 2-D and 3-D blocks, faces + edges + corners.

Each device pads its block by exchange (ppermute) and the physical boundary condition; the
result must equal the matching window of the whole domain padded on one device. Bitwise.
"""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.parallel.blocks import make_mesh
from simpar.parallel.halo import LocalComm, PmapComm, ShardMapComm, pad
from simpar.parallel.mapping import Mapping, grid_blocks
from simpar.parallel.topology import DeviceGrid

PER, DIR, NEU = Periodic(), Dirichlet(0.25), Neumann()

CASES = [
    ((8,), ((PER, PER), (PER, PER))),
    ((2, 4), ((DIR, NEU), (PER, PER))),
    ((4, 2), ((PER, PER), (NEU, Dirichlet(-1.0)))),
    ((1, 8), ((DIR, DIR), (NEU, NEU))),
    ((2, 2, 2), ((PER, PER), (DIR, NEU), (NEU, Dirichlet(2.0)))),
    ((2, 2, 2), ((PER, PER), (PER, PER), (PER, PER))),
]


def _windows(global_padded, grid_shape, block, w):
    """The padded window of each device, in flat device order."""
    out = []
    for idx in np.ndindex(*grid_shape):
        sl = tuple(slice(i * n, i * n + n + 2 * w) for i, n in zip(idx, block, strict=True))
        out.append(global_padded[(Ellipsis,) + sl])
    return np.stack(out)


@pytest.mark.slow
@pytest.mark.parametrize("w", [1, 2, 3])
@pytest.mark.parametrize("mesh,bcs", CASES)
def test_pmap_and_shard_map_halo_equals_global_padding(mesh, bcs, w):
    d = len(bcs)
    mesh = mesh + (1,) * (d - len(mesh))
    shape = (24, 24, 8)[:d]
    rng = np.random.default_rng(1)
    u = rng.standard_normal((3,) + shape)  # a leading component axis is never split
    grid = DeviceGrid(mesh, tuple(b[0].periodic for b in bcs))
    block = tuple(n // m for n, m in zip(shape, mesh, strict=True))
    ref = np.asarray(pad(jax.numpy.asarray(u), w, bcs, LocalComm(d)))
    expected = _windows(ref, mesh, block, w)
    # pmap: blocks stacked on a flat device axis
    blocks = Mapping("pmap", grid).stack(u, grid_blocks(d))
    got = jax.pmap(functools.partial(pad, w=w, bcs=bcs, comm=PmapComm(grid)), axis_name="dev")(
        blocks
    )
    np.testing.assert_array_equal(np.asarray(got), expected)
    # shard_map: padded blocks come back concatenated along the mesh axes
    m = make_mesh(grid.shape, grid.axis_names, jax.devices()[: grid.size])
    spec = P(None, *grid.axis_names)
    f = jax.shard_map(
        functools.partial(pad, w=w, bcs=bcs, comm=ShardMapComm(grid)),
        mesh=m,
        in_specs=spec,
        out_specs=spec,
    )
    got = np.asarray(jax.jit(f)(u))
    pb = tuple(n + 2 * w for n in block)
    for k, idx in enumerate(np.ndindex(*mesh)):
        sl = tuple(slice(i * n, (i + 1) * n) for i, n in zip(idx, pb, strict=True))
        np.testing.assert_array_equal(got[(Ellipsis,) + sl], expected[k])


def test_dirichlet_and_neumann_fills():
    u = jax.numpy.asarray(np.arange(1.0, 7.0).reshape(6, 1) * np.ones((6, 2)))
    p = np.asarray(pad(u, 2, ((Dirichlet(10.0), Neumann()), (PER, PER)), LocalComm(2)))
    # Dirichlet 10 at the lower wall: ghost = 2*10 - mirror (cells 1, 2 -> 18, 19)
    np.testing.assert_array_equal(p[:2, 2], [18.0, 19.0])
    # Neumann at the upper wall: mirror image (6, 5)
    np.testing.assert_array_equal(p[-2:, 2], [6.0, 5.0])
