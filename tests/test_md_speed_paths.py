"""The MD speed paths: what the compiled ``sharded`` LJ chunk moves, and the compilation cache.

The ``sharded`` chunk (``md.run_chunk`` on particle arrays split over 8 CPU devices, see
conftest.py) is read from its compiled HLO after SPMD partitioning
(``simpar.parallel.hlo``). Each device needs every position once per step (the all-gather of
float[N, 3]); anything beyond twice that is the partitioner moving neighbour lists or force
blocks (issue 17 item 9: the row-blocked CPU kernel under ``lax.map`` made it 6.2 MB per
device and step at 4,000 atoms, against 96 KB).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.parallel.hlo import collectives
from simpar.parallel.particles import shard_particles
from simpar.particles import lattice, md, potentials, space


def _sharded_sim(cells: int, n_dev: int):
    r, box = lattice.cubic_lattice("fcc", 0.8442, (cells,) * 3, jnp.float64)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(1), r.shape[0], 1.44, dtype=jnp.float64)
    spc = space.periodic(box, jnp.float64)
    pot = potentials.lennard_jones(cutoff=2.5, dtype=jnp.float64)
    n = r.shape[0]
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3,
                             placement=lambda t: shard_particles(t, n_dev, n))  # fmt: skip
    return sim, n


def test_sharded_chunk_moves_at_most_twice_all_positions():
    """4,000 atoms (more than the CPU kernel's 1,024-row block) on 8 devices: the collectives
    of the time step (the while loop's body, the rebuild conditional inside it) and of the
    chunk's end move at most twice all positions per device, and no int32 neighbour list."""
    assert len(jax.devices()) == 8
    sim, n = _sharded_sim(10, 8)
    assert n == 4000
    block = md.row_block(sim.state.position)
    assert block is None
    txt = (
        md.run_chunk.lower(
            "nve",
            sim.spec,
            sim.space,
            sim.pot,
            sim.params,
            sim.state,
            sim.nbrs,
            jnp.int32(10),
            block=block,
        )  # fmt: skip
        .compile()
        .as_text()
    )
    found = collectives(txt)
    positions = n * 3 * 8  # bytes of all positions (float64)
    # per computation: the loop body runs once per step; the rebuild branch once per build
    per_comp: dict[str, int] = {}
    for c in found:
        per_comp[c.computation] = per_comp.get(c.computation, 0) + c.nbytes
    for comp, nbytes in per_comp.items():
        assert nbytes <= 2 * positions, (comp, nbytes, positions, found)
    assert not any(dt == "s32" and len(dims) == 2 for c in found for dt, dims in c.shapes)
    # what the blocked kernel moved: int32 neighbour blocks and force blocks
    blocked = (
        md.run_chunk.lower(
            "nve",
            sim.spec,
            sim.space,
            sim.pot,
            sim.params,
            sim.state,
            sim.nbrs,
            jnp.int32(10),
            block=-1,
        )  # fmt: skip
        .compile()
        .as_text()
    )
    assert sum(c.nbytes for c in collectives(blocked)) > sum(per_comp.values())


def test_row_block_of_unsharded_state_is_the_default():
    assert md.row_block(jnp.zeros((4, 3))) == -1
    assert md.row_block(np.zeros((4, 3))) == -1


@pytest.mark.parametrize("block", [None, -1])
def test_sharded_forces_equal_single_bitwise(block):
    """The one-pass kernel of ``sharded`` and the blocked one of ``single`` give the same
    forces bit for bit (FMA off, conftest.py) after a chunk of 20 steps on 4 devices."""
    sim, n = _sharded_sim(7, 4)  # 1,372 atoms: two 1,024-row blocks on one device
    r, box = lattice.cubic_lattice("fcc", 0.8442, (7,) * 3, jnp.float64)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(1), r.shape[0], 1.44, dtype=jnp.float64)
    one = md.make_simulation(space.periodic(box, jnp.float64),
                             potentials.lennard_jones(cutoff=2.5, dtype=jnp.float64), r, v,
                             dt=0.005, skin=0.3)  # fmt: skip
    one.advance(20)
    s, nb = md.run_chunk("nve", sim.spec, sim.space, sim.pot, sim.params, sim.state, sim.nbrs,
                         jnp.int32(20), block=block)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(s.position), np.asarray(one.state.position))
    np.testing.assert_array_equal(np.asarray(s.force), np.asarray(one.state.force))
    assert int(nb.n_builds) == one.builds
