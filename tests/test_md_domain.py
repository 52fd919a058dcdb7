"""Lennard-Jones MD decomposed in space (``simpar.particles.decomposed_sim``) on pmap and shard_map.

Every decomposed run is compared with the ``single`` engine (``md.Simulation``): neighbour
rows are summed in atom-id order on both and both run the one MD step (``step.md_step``), so
with FMA off (conftest) positions, velocities and forces agree bitwise (asserted exactly);
energies and pressure are sums over devices (another order): 1e-10 relative. One system serves the one-hop meshes: fcc 14x7x4 cells (1,568 atoms, box
23.5 x 11.8 x 6.7) has sub-boxes of at least cutoff + skin = 2.8 on (2, 4), (4, 2) and
(2, 2, 2); ``lj_melt.toml``'s 4,000 atoms on (8,) and a 256-atom box on (7,) need ghosts
from two and three devices away. Compiled programs are shared between tests with the same
layout.
Budget: about 2 minutes on 2 CPU cores, mostly compilation.
"""

from __future__ import annotations

import math
import subprocess
import sys

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.config import dumps
from simpar.errors import ConfigError, SimulationError
from simpar.parallel.hlo import collectives
from simpar.particles import decomposed_sim as domain
from simpar.particles import lattice, md, potentials, space
from simpar.run import run_config

CELLS = (14, 7, 4)
STEPS, CHUNK = 200, 100
KEYS = ("temperature", "potential_energy", "kinetic_energy", "total_energy", "pressure")


def lj(cells=CELLS, temperature=1.44, seed=1):
    r, box = lattice.cubic_lattice("fcc", 0.8442, cells)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(seed), r.shape[0], temperature)
    return r, v, space.periodic(box), potentials.lennard_jones(cutoff=2.5)


@pytest.fixture(scope="module")
def reference():
    """The single-engine trajectory: (positions, velocities, thermo) after each chunk."""
    r, v, spc, pot = lj()
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3)
    frames = [(np.asarray(sim.state.position), np.asarray(sim.state.velocity), sim.thermo())]
    for _ in range(STEPS // CHUNK):
        sim.advance(CHUNK)
        frames.append((np.asarray(sim.state.position), np.asarray(sim.state.velocity),
                       sim.thermo()))  # fmt: skip
    return frames, int(sim.nbrs.n_builds)


def assert_same(g, th, frame):
    pos, vel, ref_th = frame
    np.testing.assert_array_equal(g["position"], pos)
    np.testing.assert_array_equal(g["velocity"], vel)
    for k in KEYS:
        assert th[k] == pytest.approx(ref_th[k], rel=1e-10, abs=1e-12), k


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_host_set_up_is_the_device_formula_bitwise(dtype):
    """The set-up's host arithmetic (``ghosts.owners``, ``decomposed_sim._wrap_host``: NumPy,
    no program compiled) gives the bits of the device formulas (``ghosts.owner``,
    ``space.wrap``), also at sub-box and box edges and outside the box."""
    from simpar.parallel import ghosts

    box = np.asarray([16.796, 8.4, 5.0], dtype)
    rng = np.random.default_rng(3)
    r = (rng.random((500, 3)) * 3.0 - 1.0).astype(dtype) * box
    edges = np.stack(np.meshgrid(*[np.arange(-4, 9) * (b / 4) for b in box]), -1)
    r = np.concatenate([r, edges.reshape(-1, 3).astype(dtype)])
    spc = space.periodic(box, dtype)
    wrapped = domain._wrap_host(spc, r)
    np.testing.assert_array_equal(wrapped, np.asarray(space.wrap(spc, jnp.asarray(r))))
    dev = jnp.asarray(box)
    want = [np.asarray(ghosts.owner(jnp.asarray(wrapped)[:, a], dev[a], n))
            for a, n in enumerate((2, 4, 1))]  # fmt: skip
    got = ghosts.owners((2, 4, 1), box, wrapped)
    np.testing.assert_array_equal(got, np.ravel_multi_index(want, (2, 4, 1)))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "mesh"),
    [("shard_map", (2, 4)), ("pmap", (2, 2, 2)), ("shard_map", (4, 2))],
    ids=str,
)
def test_decomposed_run_equals_single(reference, engine, mesh):
    frames, builds = reference
    r, v, spc, pot = lj()
    sim = domain.make_domain_simulation(engine, mesh, spc, pot, r, v, dt=0.005, skin=0.3)
    assert sim.counts().sum() == r.shape[0] and sim.counts().min() > 0
    assert_same(sim.global_state(), sim.thermo(), frames[0])
    for k in range(STEPS // CHUNK):
        sim.advance(CHUNK)
        assert_same(sim.global_state(), sim.thermo(), frames[k + 1])
    assert sim.builds == builds  # the same exact rebuild policy, decided over all devices
    assert sim.step == STEPS and sim.error == 0 and sim.hops == (1, 1, 1)


_POLICY_REFS: dict = {}


def _policy_reference(every, check):
    """The single-engine run of ``lj()`` under a neighbour policy: positions, velocities and
    thermo after ``STEPS`` steps, and its build count (shared by the mesh cases)."""
    if (every, check) not in _POLICY_REFS:
        r, v, spc, pot = lj()
        sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3, every=every, check=check)
        sim.advance(STEPS)
        frame = (np.asarray(sim.state.position), np.asarray(sim.state.velocity), sim.thermo())
        _POLICY_REFS[every, check] = frame, int(sim.nbrs.n_builds)
    return _POLICY_REFS[every, check]


@pytest.mark.parametrize(
    ("every", "check", "engine", "mesh"),
    [
        pytest.param(20, False, "shard_map", (2,), marks=pytest.mark.slow),
        pytest.param(2, True, "pmap", (2,), marks=pytest.mark.slow),
        pytest.param(20, False, "pmap", (2, 2, 2), marks=pytest.mark.slow),
        pytest.param(2, True, "shard_map", (2, 2, 2), marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_neighbour_policy_equals_single(every, check, engine, mesh):
    """LAMMPS's ``every 20 check no`` (in.lj as shipped: a build every 20 steps, whatever the
    atoms did) and ``every 2 check yes`` (the skin/2 check every other step) on the
    decomposed engines follow ``single`` under the same policy bitwise and build at the
    same steps: 1 + 200 / 20 builds, and under ``check`` fewer than ``STEPS / every``."""
    frame, builds = _policy_reference(every, check)
    r, v, spc, pot = lj()
    sim = domain.make_domain_simulation(engine, mesh, spc, pot, r, v, dt=0.005, skin=0.3,
                                        every=every, check=check)  # fmt: skip
    sim.advance(STEPS)
    assert_same(sim.global_state(), sim.thermo(), frame)
    assert sim.builds == builds
    if check:
        assert 1 < builds < 1 + STEPS // every
    else:
        assert builds == 1 + STEPS // every
    assert sim.error == 0 and sim.step == STEPS


@pytest.mark.slow
def test_policy_that_loses_atoms_names_itself():
    """256 atoms melting from T = 3 on 7 slabs of 0.96 sigma with a build every 250 steps:
    an atom crosses a whole slab between two builds, which migration (one sub-box per axis)
    cannot repair; the error names the policy keys to change. Bad values are refused."""
    r, v, spc, pot = lj(cells=(4, 4, 4), temperature=3.0, seed=87287)
    sim = domain.make_domain_simulation("shard_map", (7,), spc, pot, r, v, dt=0.005, skin=0.3,
                                        every=250, check=False)  # fmt: skip
    with pytest.raises(SimulationError, match=r"lost atoms.*neighbors\.every = 250, "
                                              r"neighbors\.check = false.*smaller neighbors"):  # fmt: skip
        sim.advance(500)
    for bad in ({"every": 0}, {"every": 2.0}, {"check": "no"}):
        with pytest.raises(ValueError, match="every must be|check must be"):
            domain.make_domain_simulation("local", (1,), spc, pot, r, v, dt=0.005, **bad)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "mesh", "cells", "steps", "hops"),
    [("pmap", (8,), (10, 10, 10), 100, (2, 1, 1)), ("shard_map", (7,), (4, 4, 4), 300, (3, 1, 1))],
    ids=str,
)
def test_thin_sub_boxes_get_ghosts_in_several_hops(engine, mesh, cells, steps, hops):
    """Sub-boxes thinner than cutoff + skin: ``lj_melt.toml`` (4,000 atoms, box 16.8) on 8
    slabs of 2.1 sigma, and 256 atoms (box 6.7) on 7 slabs of 0.96 sigma, where the ghost
    slabs wrap around the box and a device receives images of its own atoms. Both follow
    ``single`` bitwise, melting from T = 3 (atoms cross the thin slabs often)."""
    r, v, spc, pot = lj(cells=cells, temperature=3.0, seed=87287)
    ref = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3)
    sim = domain.make_domain_simulation(engine, mesh, spc, pot, r, v, dt=0.005, skin=0.3)
    assert sim.spec.hops == hops
    ref.advance(steps)
    sim.advance(steps)
    assert sim.builds == int(ref.nbrs.n_builds) > 10
    np.testing.assert_array_equal(sim.global_state()["position"], np.asarray(ref.state.position))
    th, ref_th = sim.thermo(), ref.thermo()
    for k in KEYS:
        assert th[k] == pytest.approx(ref_th[k], rel=1e-10, abs=1e-12), k


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(8,), (2, 4), (4, 2), (2, 2, 2)], ids=str)
def test_compiled_chunk_moves_only_ghosts_and_migrating_atoms(mesh):
    """The compiled shard_map chunk (``lj_melt.toml``'s 4,000 atoms; (8,) with two hops):
    its only collectives are collective-permutes, none larger than one ghost stage's or one
    migration's packet (two, one per direction, along an axis of 2 devices, where both
    neighbours are the same device and both directions travel in one exchange), and
    all-reduces of the few scalars and capacity counts; no all-gather of positions (what
    the ``sharded`` engine does)."""
    r, v, spc, pot = lj(cells=(10, 10, 10), temperature=3.0)
    sim = domain.make_domain_simulation("shard_map", mesh, spc, pot, r, v, dt=0.005, skin=0.3)
    spec = sim.spec
    text = (
        sim._fn("chunk")
        .lower(sim.state, sim.lists, spc, pot, sim.params, jnp.int32(10), False)
        .compile()
        .as_text()
    )
    found = collectives(text)
    assert {c.op for c in found} == {"collective-permute", "all-reduce"}
    # per device: a ghost stage sends wrapped + image positions and the ids (7 columns),
    # migration 10 columns and the ids
    pair = 2 if 2 in spec.shape3 else 1  # both directions in one exchange
    packet = pair * max(7 * max(spec.send), 11 * spec.migrate)
    # the coordinates of a packet: fewer than every position of the system
    assert pair * max(6 * max(spec.send), 10 * spec.migrate) < 3 * r.shape[0]
    permutes = 0
    for c in found:
        for _dtype, dims in c.shapes:
            n = math.prod(dims)
            if c.op == "all-reduce":
                # the needs of every capacity and the far flag, reduced together
                assert n <= len(spec.capacities()) + 1, (dims, c.computation)
            else:
                permutes += 1
                assert n <= packet, (dims, packet, c.computation)
    # borders (1 array), forward (1 per step, 1 for a first build) and migration (1) per
    # stage or split axis and direction;
    # one exchange for both directions of a hop along an axis of 2 devices
    exchanges = sum(1 if spec.shape3[a] == 2 else 2
                    for a, _, d in spec.stages if d < 0 and spec.ghost_axes[a])  # fmt: skip
    assert permutes >= 3 * exchanges


@pytest.mark.slow
def test_pileup_regrows_and_never_loses_an_atom():
    """A hot gas (density 0.2) flowing onto the middle of the first of 8 slabs: atoms cross
    the faces many times and pile into one device; the owned and migration capacities start
    too small and overflow again as the pile grows. Counts and ids are checked at every
    frame (``global_state`` raises "lost atoms" on a mismatch), energy is conserved (shifted
    LJ), and the run equals the single engine's."""
    r, box = lattice.cubic_lattice("fcc", 0.2, (10, 4, 4))  # 640 atoms, box 27.1 x 10.9^2
    spc, pot = space.periodic(box), potentials.lennard_jones(cutoff=2.5, shift=True)
    v = np.array(lattice.maxwell_boltzmann(jax.random.PRNGKey(1), r.shape[0], 1.0))
    x0 = float(box[0]) / 16  # middle of the first slab
    v[:, 0] -= 6.0 * np.sin(2 * np.pi * (np.asarray(r)[:, 0] - x0) / float(box[0]))
    kw = dict(dt=0.002, skin=0.3)
    sim = domain.make_domain_simulation("shard_map", (8,), spc, pot, r, v, capacity_factor=2.0,
                                        capacities={"capacity": 88, "migrate": 8}, **kw)  # fmt: skip
    ref = md.make_simulation(spc, pot, r, v, **kw)
    e0 = sim.thermo()["total_energy"]
    assert e0 == pytest.approx(ref.thermo()["total_energy"], rel=1e-12)
    n = r.shape[0]
    most = []
    for _ in range(5):
        sim.advance(60)
        ref.advance(60)
        g = sim.global_state()  # raises SimulationError("lost atoms") on a count/id mismatch
        assert g["position"].shape == (n, 3)
        most.append(int(sim.counts().max()))
        np.testing.assert_array_equal(g["position"], np.asarray(ref.state.position))
        assert sim.error == 0
        assert sim.thermo()["total_energy"] == pytest.approx(e0, abs=2e-3)
    assert max(most) > 2.0 * n / 8, most  # piled up: over twice the mean on one device
    assert sim.regrows >= 2 and sim.spec.capacity > 2 * 88 and sim.spec.migrate > 8
    assert sim.builds > 20  # atoms crossed the faces many times


@pytest.mark.slow
def test_langevin_reproducible_and_equal_to_single():
    r, v, spc, pot = lj(temperature=0.8)
    kw = dict(dt=0.005, skin=0.3, ensemble="langevin", kt=1.5, gamma=2.0)

    def run(seed, mesh):
        sim = domain.make_domain_simulation("pmap", mesh, spc, pot, r, v,
                                            key=jax.random.PRNGKey(seed), **kw)  # fmt: skip
        sim.advance(100)
        return sim.global_state()["position"]

    a, b, c = run(7, (2, 2, 2)), run(7, (2, 2, 2)), run(8, (2, 2, 2))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3
    ref = md.make_simulation(spc, pot, r, v, key=jax.random.PRNGKey(7), **kw)
    ref.advance(100)
    # the noise is drawn for every atom and picked by id: the single engine's stream
    np.testing.assert_array_equal(a, np.asarray(ref.state.position))


@pytest.mark.slow
def test_thin_sub_box_refused():
    r, v, spc, pot = lj(cells=(4, 4, 4))  # box 6.7: 8 slabs of 0.84 < 2.8 / 3
    with pytest.raises(
        ConfigError, match=r"mesh 8 cuts the box .* smallest allowed sub-box 0\.934"
    ):
        domain.make_domain_simulation("pmap", (8,), spc, pot, r, v, dt=0.005)
    # through the CLI: exit 2, the message names the mesh, no traceback, no file
    out = "data/runs/never_written.h5md"
    p = subprocess.run(
        [sys.executable, "-m", "simpar", "run", "experiments/lj_melt.toml", "--engine", "pmap",
         "--mesh", "2x20", "--devices", "40", "--out", out],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert "mesh 2x20" in p.stderr and "smallest allowed sub-box 0.934" in p.stderr
    assert "Traceback" not in p.stderr


def _layout(path):
    out = {}
    with h5py.File(path) as f:

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = (obj.shape, obj.dtype.str)

        f.visititems(visit)
    return out


@pytest.mark.slow
def test_h5md_output_same_layout_as_single(tmp_path):
    import MDAnalysis

    cfg = {
        "name": "t",
        "model": {"name": "lj"},
        "system": {"lattice": "fcc", "density": 0.8442, "cells": list(CELLS),
                   "temperature": 1.44, "seed": 1, "dtype": "float64"},
        "time": {"dt": 0.005, "steps": 20},
        "output": {"every": 10, "path": str(tmp_path / "t.h5md"), "force": True},
    }  # fmt: skip
    res = {}
    for engine, mesh in (("single", None), ("pmap", (2, 2, 2))):
        res[engine] = run_config(cfg, dumps(cfg), engine=engine, mesh=mesh, steps=None,
                                 out=str(tmp_path / f"{engine}.h5md"), progress=False)  # fmt: skip
    a, b = res["single"]["path"], res["pmap"]["path"]
    assert _layout(a) == _layout(b)
    traj = "particles/trajectory/"
    with h5py.File(a) as fa, h5py.File(b) as fb:
        for k in ("position", "velocity", "force"):
            np.testing.assert_array_equal(fb[traj + k + "/value"][:], fa[traj + k + "/value"][:])
        assert fb["parameters"].attrs["engine"] == "pmap"
        assert fb["parameters"].attrs["device_mesh"].tolist() == [2, 2, 2]
    u = MDAnalysis.Universe(b, n_atoms=int(np.prod(CELLS)) * 4, convert_units=False)
    assert len(u.atoms) == int(np.prod(CELLS)) * 4 and u.trajectory.n_frames == 3
    for k in KEYS:
        assert res["pmap"]["final"][k] == pytest.approx(res["single"]["final"][k], rel=1e-10)


MELT = ("experiments/lj_melt.toml", "--steps", "40", "--set", "output.every=20",
        "--set", "system.cells=[6,8,6]", "--quiet")  # fmt: skip


@pytest.fixture(scope="module")
def one_process_melt(tmp_path_factory):
    """The one-process ``single`` run of ``MELT`` (shared by the two-process tests)."""
    from test_distributed import _one_process

    ref = tmp_path_factory.mktemp("melt") / "one.h5md"
    _one_process(*MELT, "--engine", "single", "--out", str(ref))
    return ref


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "mesh"), [("pmap", "2x2x2"), ("shard_map", "2x4")], ids=str)
def test_two_processes_equal_one_process(tmp_path, one_process_melt, engine, mesh):
    """8 devices of two processes (jax.distributed, gloo, 4 CPU devices each) run one
    decomposed melt (1,152 atoms, box 10.1 x 13.4 x 10.1); process 0 writes an H5MD
    trajectory equal to the one-process single-engine run. On 2x4 the first mesh row is
    process 0's devices, the second process 1's: x is cut between the processes."""
    from test_distributed import _two_processes

    out = tmp_path / "two.h5md"
    p0, p1 = _two_processes(*MELT, "--engine", engine, "--mesh", mesh, "--out", str(out))
    assert p0.returncode == 0 and p1.returncode == 0, p0.stderr[-2000:] + p1.stderr[-2000:]
    traj = "particles/trajectory/position/value"
    with h5py.File(out) as a, h5py.File(one_process_melt) as b:
        assert a["parameters"].attrs["process_count"] == 2
        assert a["parameters"].attrs["engine"] == engine
        assert a[traj].shape == b[traj].shape == (3, 1152, 3)
        np.testing.assert_array_equal(a[traj][:], b[traj][:])
        for k in KEYS:
            va, vb = a["observables"][k]["value"][:], b["observables"][k]["value"][:]
            np.testing.assert_allclose(va, vb, rtol=1e-10, err_msg=k)
