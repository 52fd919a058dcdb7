"""The MD speed paths: what the compiled ``sharded`` LJ chunk moves, and the compilation cache
of command-line runs (``simpar.cli.compile_cache_dir``).

The ``sharded`` chunk (``md.run_chunk`` on particle arrays split over 8 CPU devices, see
conftest.py) is read from its compiled HLO after SPMD partitioning
(``simpar.parallel.hlo``). Each device needs every position once per step (the all-gather of
float[N, 3]); anything beyond twice that is the partitioner moving neighbour lists or force
blocks (issue 17 item 9: the row-blocked CPU kernel under ``lax.map`` made it 6.2 MB per
device and step at 4,000 atoms, against 96 KB).
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.parallel import blocks
from simpar.parallel.hlo import collectives
from simpar.parallel.particles import replicated, shard_particles
from simpar.particles import lattice, md, potentials, space


def _chunk_hlo(sim, block) -> str:
    """The compiled HLO text of a 10-step NVE chunk of ``sim`` with force ``block``."""
    lowered = md.run_chunk.lower("nve", sim.spec, sim.space, sim.pot, sim.params, sim.state,
                                 sim.nbrs, jnp.int32(10), block=block)  # fmt: skip
    return lowered.compile().as_text()


def _mesh_placement(mesh_shape: tuple[int, ...], n: int):
    """Placement of particle arrays split over every axis of a ``mesh_shape`` device mesh
    (``(8,)`` is ``shard_particles``'s; ``(2, 4)`` splits the particle axis over both)."""
    if len(mesh_shape) == 1:
        return lambda t: shard_particles(t, mesh_shape[0], n)
    from jax.sharding import NamedSharding, PartitionSpec

    names = tuple(f"m{k}" for k in range(len(mesh_shape)))
    mesh = blocks.make_mesh(mesh_shape, names, jax.devices())  # Auto axes, as the engines'

    def put(x):
        if not isinstance(x, jax.Array | np.ndarray):
            return x
        split = x.ndim >= 1 and x.shape[0] == n
        spec = PartitionSpec(names, *([None] * (x.ndim - 1))) if split else PartitionSpec()
        return jax.device_put(x, NamedSharding(mesh, spec))

    return lambda t: jax.tree.map(put, t)


def _sharded_sim(cells: int, n_dev: int | tuple[int, ...]):
    mesh_shape = (n_dev,) if isinstance(n_dev, int) else n_dev
    r, box = lattice.cubic_lattice("fcc", 0.8442, (cells,) * 3, jnp.float64)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(1), r.shape[0], 1.44, dtype=jnp.float64)
    spc = space.periodic(box, jnp.float64)
    pot = potentials.lennard_jones(cutoff=2.5, dtype=jnp.float64)
    n = r.shape[0]
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3,
                             placement=_mesh_placement(mesh_shape, n))  # fmt: skip
    return sim, n


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(8,), (2, 4)])
def test_sharded_chunk_moves_at_most_twice_all_positions(mesh):
    """4,000 atoms (more than the CPU kernel's row block) on 8 devices, the particle axis split
    over a 1-D mesh (8,) and over both axes of (2, 4): the collectives of the time step (the
    while loop's body), of the rebuild conditional inside it (once per build) and of the
    chunk's end each move at most twice all positions per device, and neither the int32
    neighbour list (issue 29 item 5: s32[4000, 96], 1.54 MB per step) nor the velocities move.
    The positions are all-gathered once per step, for the forces and for the rebuild branch,
    which then bins and sorts them whole (``md._rebuild_list``): it moves no float array (it
    all-reduced the cell-sorted positions with their z images, f64[3N, 3], 4.2x all positions
    per build), only the cells' int32 bookkeeping (1.2x)."""
    assert len(jax.devices()) == 8
    sim, n = _sharded_sim(10, mesh)
    assert n == 4000
    block = md.row_block(sim.state.position)
    assert block is None
    txt = _chunk_hlo(sim, block)
    found = collectives(txt)
    positions = n * 3 * 8  # bytes of all positions (float64)
    # per computation: the loop body runs once per step; the rebuild branch once per build
    per_comp: dict[str, int] = {}
    for c in found:
        per_comp[c.computation] = per_comp.get(c.computation, 0) + c.nbytes
    assert len(per_comp) >= 3, per_comp  # the step, the rebuild branch, the chunk's end
    assert max(per_comp.values()) <= 2 * positions, (per_comp, positions, found)
    assert not any(dt == "s32" and len(dims) == 2 for c in found for dt, dims in c.shapes)
    # one whole float[N, 3] array moves: the step's all-gather of the positions
    whole = [c for c in found for _, dims in c.shapes if dims == (n, 3)]
    assert [c.op for c in whole] == ["all-gather"], found
    ints = {c.computation for c in found if any(dt == "s32" and dims for dt, dims in c.shapes)}
    assert len(ints) == 1 and whole[0].computation not in ints, found  # the rebuild branch
    rebuild = ints.pop()
    assert not any(dt[0] == "f" for c in found if c.computation == rebuild for dt, _ in c.shapes)
    if mesh == (8,):  # what the blocked kernel moved: int32 neighbour blocks and force blocks
        blocked = _chunk_hlo(sim, -1)
        assert sum(c.nbytes for c in collectives(blocked)) > sum(per_comp.values())


def test_collectives_attributed_to_headers_with_index_comments():
    """A computation whose parameters are a long tuple has ``/*index=5*/`` comments in its
    header (a while body, a conditional branch): its collectives are attributed to it."""
    txt = (
        "%body (p: (s32[], f64[4,3], /*index=5*/f64[])) -> (s32[], /*index=5*/f64[]) {\n"
        "  %a = f64[8,3]{1,0} all-gather(%x), dimensions={0}\n}\n"
        "ENTRY %main.1 (x: f64[4,3]) -> f64[] {\n"
        "  %b = s32[2]{0} all-reduce(%y), to_apply=%add\n}\n"
    )
    found = collectives(txt)
    assert [(c.op, c.computation, c.nbytes) for c in found] == [
        ("all-gather", "body", 8 * 3 * 8),
        ("all-reduce", "main.1", 2 * 4),
    ]


def test_replicated_is_the_identity_unless_split_over_an_auto_mesh():
    """``replicated`` returns its argument itself on one device, in ``shard_map`` bodies and
    on host arrays, and constrains a split array to one all-gather (the value unchanged)."""
    from jax.sharding import NamedSharding, PartitionSpec

    x = np.arange(24.0).reshape(8, 3)
    assert replicated(x) is x
    seen = []

    def probe(a):
        seen.append(replicated(a) is a)
        return a * 2.0

    np.testing.assert_array_equal(np.asarray(jax.jit(probe)(jnp.asarray(x))), 2 * x)
    mesh = blocks.make_mesh((8,), ("p",), jax.devices())
    split = jax.device_put(x, NamedSharding(mesh, PartitionSpec("p")))
    body = jax.shard_map(probe, mesh=mesh, in_specs=PartitionSpec("p"),
                         out_specs=PartitionSpec("p"))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(jax.jit(body)(split)), 2 * x)
    assert seen == [True, True]

    def whole(a):  # the sum of every row, on each device's rows: needs all of ``a``
        return a + jnp.sum(replicated(a), axis=0)

    got = jax.jit(whole)(split)
    np.testing.assert_array_equal(np.asarray(got), x + x.sum(axis=0))
    moved = collectives(jax.jit(whole).lower(split).compile().as_text())
    assert [(c.op, c.shapes) for c in moved] == [("all-gather", (("f64", (8, 3)),))]


def test_row_block_of_unsharded_state_is_the_default():
    assert md.row_block(jnp.zeros((4, 3))) == -1
    assert md.row_block(np.zeros((4, 3))) == -1


@pytest.mark.slow
@pytest.mark.parametrize("block", [None, -1])
def test_sharded_forces_equal_single_bitwise(block):
    """The one-pass kernel of ``sharded`` and the blocked one of ``single`` give the same
    forces bit for bit (FMA off, conftest.py) after a chunk of 20 steps on 4 devices."""
    sim, n = _sharded_sim(7, 4)  # 1,372 atoms: several row blocks on one device
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


def test_compile_cache_dir_policy(tmp_path):
    """Where ``simpar run`` keeps compiled programs, and the two ways to turn it off."""
    from simpar.cli import compile_cache_dir

    home = {"HOME": str(tmp_path)}
    assert compile_cache_dir(environ=home) == os.path.join(str(tmp_path), ".cache", "simpar", "jax")
    xdg = {**home, "XDG_CACHE_HOME": str(tmp_path / "x")}
    assert compile_cache_dir(environ=xdg) == str(tmp_path / "x" / "simpar" / "jax")
    own = {**xdg, "SIMPAR_COMPILE_CACHE_DIR": str(tmp_path / "c")}
    assert compile_cache_dir(environ=own) == str(tmp_path / "c")
    assert compile_cache_dir(True, environ=own) is None
    assert compile_cache_dir(environ={**own, "SIMPAR_NO_COMPILE_CACHE": "1"}) is None
    assert compile_cache_dir(environ={**own, "SIMPAR_NO_COMPILE_CACHE": "0"}) == str(tmp_path / "c")


def _cli(tmp_path, env, *extra):
    cfg = tmp_path / "t.toml"
    cfg.write_text(
        'name = "t"\n[model]\nname = "lj"\n'
        '[system]\nlattice = "fcc"\ndensity = 0.8442\ncells = [4, 4, 4]\ntemperature = 1.44\n'
        'seed = 1\ndtype = "float64"\n[time]\ndt = 0.005\nsteps = 4\n'
        f'[output]\nevery = 2\npath = "{tmp_path / "o.h5md"}"\n'
    )
    cmd = [sys.executable, "-m", "simpar", "run", str(cfg), "--overwrite", "--quiet", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_run_fills_the_compile_cache_unless_told_not_to(tmp_path):
    """A command-line run writes compiled programs under ``$XDG_CACHE_HOME/simpar/jax``;
    ``--no-compile-cache`` and ``SIMPAR_NO_COMPILE_CACHE=1`` write nothing."""
    env = {k: v for k, v in os.environ.items() if k != "SIMPAR_NO_COMPILE_CACHE"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    env.pop("SIMPAR_COMPILE_CACHE_DIR", None)
    cache = tmp_path / "xdg" / "simpar" / "jax"
    res = _cli(tmp_path, env, "--no-compile-cache")
    assert res.returncode == 0, res.stderr
    assert not cache.exists()
    res = _cli(tmp_path, {**env, "SIMPAR_NO_COMPILE_CACHE": "1"})
    assert res.returncode == 0, res.stderr
    assert not cache.exists()
    res = _cli(tmp_path, env)
    assert res.returncode == 0, res.stderr
    assert cache.is_dir() and any(cache.iterdir())


def _melt(**kw):
    r, box = lattice.cubic_lattice("fcc", 0.8442, (5,) * 3, jnp.float64)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(3), r.shape[0], 3.0, dtype=jnp.float64)
    pot = potentials.lennard_jones(cutoff=2.5, dtype=jnp.float64)
    return md.make_simulation(space.periodic(box, jnp.float64), pot, r, v, dt=0.005, **kw)


@pytest.mark.slow
def test_neighbor_policy_every_check():
    """LAMMPS's ``every N check no`` rebuilds exactly after steps N, 2N, ...; ``every N check
    yes`` only there and only when needed; the defaults are the exact policy."""
    exact = _melt(skin=0.3)
    b0 = exact.builds
    exact.advance(40)
    n_exact = exact.builds - b0
    assert n_exact >= 3  # a melting lattice at T = 3: the policies differ
    ruled = _melt(skin=0.3, every=20, check=False)
    ruled.advance(13)
    assert ruled.builds == b0  # no rebuild before step 20
    ruled.advance(27)
    assert ruled.builds - b0 == 2  # after steps 20 and 40
    lazy = _melt(skin=0.3, every=10, check=True)
    lazy.advance(40)
    assert 1 <= lazy.builds - b0 <= min(4, n_exact)
    same = _melt(skin=0.3, every=1, check=True)
    same.advance(40)
    np.testing.assert_array_equal(np.asarray(same.state.position),
                                  np.asarray(exact.state.position))  # fmt: skip
    always = _melt(skin=0.3, every=1, check=False)
    always.advance(5)
    assert always.builds - b0 == 5
    for bad in ({"every": 0}, {"every": 2.5}, {"check": "no"}):
        with pytest.raises(ValueError, match="every|check"):
            _melt(skin=0.3, **bad)
