"""Lennard-Jones MD: LAMMPS step-0 values, conservation, neighbour lists, Langevin, H5MD,
continuation from a file, sharded == single (8 CPU devices, see conftest.py)."""

from __future__ import annotations

import dataclasses
import os
import tomllib

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.config import dumps
from simpar.errors import ConfigError, SimulationError
from simpar.io import h5md
from simpar.particles import checkpoint as particle_checkpoint
from simpar.particles import decomposed_sim, error_codes, lattice, md, neighbors, potentials, space
from simpar.run import run_config

F64 = jnp.float64


def lj_system(cells=5, temperature=1.44, seed=87287, dtype=F64, shift=False):
    r, box = lattice.cubic_lattice("fcc", 0.8442, (cells,) * 3, dtype)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(seed), r.shape[0], temperature, dtype=dtype)
    return (
        r,
        v,
        space.periodic(box, dtype),
        potentials.lennard_jones(cutoff=2.5, shift=shift, dtype=dtype),
    )


def small_config(tmp_path, **over):
    cfg = {
        "name": "t",
        "model": {"name": "lj"},
        "system": {"lattice": "fcc", "density": 0.8442, "cells": [5, 5, 5],
                   "temperature": 1.44, "seed": 1, "dtype": "float64"},
        "time": {"dt": 0.005, "steps": 20},
        "output": {"every": 10, "path": str(tmp_path / "t.h5md"), "force": True},
    }  # fmt: skip
    for key, value in over.items():
        sec, name = key.split(".")
        cfg.setdefault(sec, {})[name] = value
    return cfg


def lammps(x: float) -> str:
    """LAMMPS prints thermo with %.8g."""
    return f"{x:.8g}"


@pytest.mark.slow
def test_lammps_bench_step0_32000_atoms_float64():
    r, v, spc, pot = lj_system(cells=20)
    assert r.shape == (32000, 3)
    np.testing.assert_allclose(np.asarray(spc.box), 33.591924, atol=5e-7)
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3)
    th = sim.thermo()
    assert lammps(th["temperature"]) == "1.44"
    assert lammps(th["potential_energy"]) == "-6.7733681"
    assert lammps(th["total_energy"]) == "-4.6134356"
    assert lammps(th["pressure"]) == "-5.0197073"
    # zero total momentum
    np.testing.assert_allclose(np.asarray(jnp.sum(sim.state.velocity, 0)), 0, atol=1e-10)


def test_sc_lattice():
    rs, box = lattice.cubic_lattice("sc", 0.5, (4, 4, 4))
    assert rs.shape == (64, 3)
    np.testing.assert_allclose(np.asarray(box), 4 * 2.0 ** (1 / 3))
    np.testing.assert_allclose(np.asarray(rs[1]), [0, 0, 2.0 ** (1 / 3)])


def test_potentials_force_is_minus_gradient():
    r2 = jnp.linspace(0.8, 2.4, 17, dtype=F64) ** 2
    for pot in (potentials.lennard_jones(cutoff=2.5, shift=True),
                potentials.morse(d0=1.0, alpha=3.0, r0=1.1, cutoff=2.5)):  # fmt: skip

        @jax.jit  # one program per potential (op by op, this test compiled 65 small programs)
        def force_and_gradient(r2, pot=pot):
            energy = lambda r: potentials.pair_terms(pot, r * r)[0]  # noqa: E731
            de = jax.vmap(jax.grad(energy))(jnp.sqrt(r2))
            return potentials.pair_terms(pot, r2)[1], -de / jnp.sqrt(r2)

        fr, minus_grad = force_and_gradient(r2)
        np.testing.assert_allclose(np.asarray(fr), np.asarray(minus_grad), rtol=1e-10)
    shifted = potentials.lennard_jones(cutoff=2.5, shift=True)
    mo = potentials.morse(d0=2.0, alpha=3.0, r0=1.1, cutoff=2.5)
    e_shift, e_mo = jax.jit(
        lambda: (potentials.pair_terms(shifted, jnp.asarray([2.5**2 - 1e-12, 2.6**2]))[0],
                 potentials.pair_terms(mo, jnp.asarray(1.1**2))[0])
    )()  # fmt: skip
    np.testing.assert_allclose(np.asarray(e_shift), 0.0, atol=1e-9)
    assert float(e_mo) == pytest.approx(-2.0)


@pytest.mark.parametrize("periodic", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_cell_list_matches_brute_force(periodic):
    box = np.array([9.0, 7.5, 12.0])  # not cubic: catches axis mix-ups
    r = jax.random.uniform(jax.random.PRNGKey(3), (700, 3), F64) * box
    valid = jnp.arange(700) < 690  # the last 10 slots are empty
    spc = space.periodic(box) if periodic else space.free(box)
    spec_c, nb_c = neighbors.allocate(spc, r, valid, cutoff=1.2, skin=0.3)
    spec_a, nb_a = neighbors.allocate(spc, r, valid, cutoff=1.2, skin=0.3, all_pairs=True)
    assert spec_c.cells is not None and spec_a.cells is None
    assert not bool(nb_c.did_overflow) and not bool(nb_a.did_overflow)
    rn = np.asarray(r)
    for i in range(0, 700, 7):
        d = rn[:690] - rn[i]
        if periodic:
            d -= box * np.round(d / box)
        ref = set(np.nonzero(np.sum(d * d, 1) < 1.5**2)[0]) - {i} if i < 690 else set()
        for nb in (nb_c, nb_a):
            row = np.asarray(nb.idx[i])
            assert set(row[row < 700]) == ref


@pytest.mark.slow
def test_nve_energy_conserved_with_dt_squared_error():
    r, v, spc, pot = lj_system(cells=5, temperature=0.8, shift=True)
    sim = md.make_simulation(spc, pot, r, v, dt=0.005)
    sim.advance(100)  # melt a little first
    start = sim.state
    errs = {}
    for dt in (0.004, 0.002):
        sim.state, sim.params = start, md.make_params(dt, dtype=F64)
        sim.nbrs = jax.jit(neighbors.build, static_argnums=0)(
            sim.spec, spc, start.position, start.valid
        )
        e = []
        for _ in range(10):
            sim.advance(int(0.2 / dt) // 10)
            e.append(sim.thermo()["total_energy"])
        errs[dt] = np.max(np.abs(np.asarray(e) - e[0]))
    assert errs[0.004] < 2e-3
    assert 2.5 < errs[0.004] / errs[0.002] < 6.0, errs  # second order


@pytest.mark.slow
def test_neighbor_overflow_is_detected_and_repaired():
    r, v, spc, pot = lj_system(cells=5, temperature=1.44)
    big = md.make_simulation(spc, pot, r, v, dt=0.005)
    need = np.asarray(big.nbrs.needed)
    small = md.make_simulation(spc, pot, r, v, dt=0.005, max_neighbors=int(need[0]),
                               column_capacity=int(need[1]))  # fmt: skip
    assert small.spec.max_neighbors < big.spec.max_neighbors
    assert not bool(small.nbrs.did_overflow)
    # the lattice melts: neighbour counts fluctuate above the lattice's and overflow
    for _ in range(3):
        big.advance(20)
        small.advance(20)
    assert small.regrows >= 1
    assert not bool(small.nbrs.did_overflow)
    # a regrow rebuilds the list from the last build's positions: the same trajectory
    np.testing.assert_array_equal(np.asarray(small.state.position), np.asarray(big.state.position))
    assert small.thermo()["total_energy"] == pytest.approx(big.thermo()["total_energy"], abs=1e-10)


def test_error_bitmask_decoded_into_one_message():
    err = error_codes.decode(error_codes.NEIGHBORS | error_codes.GHOSTS, 120, "needed [90]")
    assert isinstance(err, SimulationError) and err.step == 120
    msg = str(err)
    assert msg.startswith("run failed at step 120: neighbour-list overflow")
    assert "ghost capacity overflow" in msg and "(needed [90])" in msg
    assert "raise neighbors.max_neighbors or neighbors.capacity_factor" in msg
    lost = str(error_codes.decode(error_codes.LOST, 7))
    assert "step 7: lost atoms" in lost and "reduce time.dt" in lost
    assert "unknown error bits 0x400" in str(error_codes.decode(1 << 10, 3))
    # one hint per setting, however many bits name it
    both = str(error_codes.decode(error_codes.CELLS | error_codes.GHOSTS, 1))
    assert both.count("raise neighbors.capacity_factor") == 1
    with pytest.raises(ValueError, match="not an error"):
        error_codes.decode(0, 1)
    error_codes.check(np.int32(0), 5)  # no error: nothing raised
    assert error_codes.REPAIRABLE & error_codes.LOST == 0


@pytest.mark.slow
def test_overflow_sets_error_bits_stops_the_chunk_and_regrows():
    """A list built with 8 neighbour slots sets ``NEIGHBORS``; with no regrow allowed the run
    raises the decoded message (step, need, setting); with regrows it repairs and redoes the
    chunk from its start, following the run that never overflowed bit for bit."""
    r, v, spc, pot = lj_system(cells=5, temperature=1.44)
    ref = md.make_simulation(spc, pot, r, v, dt=0.005)
    sim = md.make_simulation(spc, pot, r, v, dt=0.005)
    tiny = dataclasses.replace(sim.spec, max_neighbors=8)
    nb = jax.jit(neighbors.build, static_argnums=0)(tiny, spc, sim.state.position,
                                                    sim.state.valid)  # fmt: skip
    assert int(nb.error) == error_codes.NEIGHBORS and bool(nb.did_overflow)
    sim.spec, sim.nbrs, sim.max_regrows = tiny, nb, 0
    with pytest.raises(SimulationError, match=r"step 0: neighbour-list overflow .*still overflowing "
                       r"after 0 regrows; needed \[\d+, \d+\].* raise neighbors.max_neighbors"):  # fmt: skip
        sim.advance(10)
    assert sim.step == 0 and sim.regrows == 0  # nothing committed
    sim.max_regrows = 3
    sim.advance(30)
    ref.advance(30)
    assert sim.regrows == 1 and sim.error == 0 and sim.step == 30 and sim.hops is None
    np.testing.assert_array_equal(sim.snapshot()["position"], np.asarray(ref.state.position))


@pytest.mark.slow
def test_one_interface_for_single_and_decomposed_simulations():
    """``md.Simulation`` and the decomposed ``DomainSimulation`` (one device, ``local``)
    answer the same driver interface with the same numbers, checkpoints included."""
    r, v, spc, pot = lj_system(cells=4, temperature=1.44)
    kw = dict(dt=0.005, ensemble="langevin", kt=1.0, gamma=1.0, key=jax.random.PRNGKey(4))
    one = md.make_simulation(spc, pot, r, v, **kw)
    dom = decomposed_sim.make_domain_simulation("local", (1,), spc, pot, r, v, **kw)
    for sim in (one, dom):
        sim.advance(30)
    assert one.step == dom.step == 30 and one.builds == dom.builds and one.error == dom.error == 0
    assert one.regrows == dom.regrows == 0 and one.hops is None and dom.hops == (1, 1, 1)
    a, b = one.snapshot(), dom.snapshot()
    for k in ("position", "velocity", "force", "key"):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert a["step"] == b["step"] == 30
    ta, tb = one.thermo(), dom.thermo()
    assert ta.keys() == tb.keys() and ta["temperature"] == tb["temperature"]
    ca = particle_checkpoint.lj_to_checkpoint(one, b"single:1:256", 0)
    cb = particle_checkpoint.lj_to_checkpoint(dom, b"local:1:256", 0, snapshot=b)
    for k in ("position", "velocity", "force", "nbr_ref_position", "key", "step"):
        np.testing.assert_array_equal(ca[k], cb[k], err_msg=k)


@pytest.mark.slow
def test_langevin_seeded_and_reaches_temperature():
    r, v, spc, pot = lj_system(cells=5, temperature=0.5, shift=True)

    def run(seed, n=4, k=50):
        sim = md.make_simulation(spc, pot, r, v, dt=0.005, ensemble="langevin", kt=1.5,
                                 gamma=5.0, key=jax.random.PRNGKey(seed))  # fmt: skip
        temps = []
        for _ in range(n):
            sim.advance(k)
            temps.append(sim.thermo()["temperature"])
        return sim, temps

    a, ta = run(7)
    b, tb = run(7)
    c, tc = run(8)
    np.testing.assert_array_equal(np.asarray(a.state.position), np.asarray(b.state.position))
    assert not np.allclose(np.asarray(a.state.position), np.asarray(c.state.position))
    late = np.mean(ta[1:] + tc[1:])
    assert late == pytest.approx(1.5, rel=0.05), (ta, tc)


@pytest.mark.slow  # the fast tier opens a PM H5MD file (same writer) with MDAnalysis
def test_h5md_written_and_opened_by_mdanalysis(tmp_path):
    import MDAnalysis

    cfg = small_config(tmp_path)
    res = run_config(cfg, dumps(cfg), engine=None, mesh=None, steps=None, out=None,
                     progress=False)  # fmt: skip
    path = res["path"]
    with pytest.raises(ValueError, match="readable units"):
        MDAnalysis.Universe(path)  # reduced units: no Angstrom/ps for MDAnalysis to convert
    u = MDAnalysis.Universe(path, n_atoms=500, convert_units=False)  # README "Output files"
    assert len(u.atoms) == 500 and set(u.trajectory.units.values()) == {None}
    assert u.trajectory.n_frames == 3
    with h5py.File(path, "r") as f:
        pos = f["particles/trajectory/position/value"][...]
        edges = f["particles/trajectory/box/edges/value"][...]
        assert list(f["particles/trajectory/position/step"][...]) == [0, 10, 20]
        assert f["particles/trajectory/velocity/step"] == f["particles/trajectory/position/step"]
        for el in ("position/value", "position/time", "velocity/value", "box/edges/value"):
            assert "unit" not in f["particles/trajectory/" + el].attrs  # reduced: no unit
        assert f["particles/trajectory/position/value"].attrs["reduced_unit"] == "sigma"
        assert f["observables/pressure/value"].shape == (3,)
        assert "lj" in f["parameters"].attrs["config"]
        assert f["parameters"].attrs["engine"] == "single"
        assert f["h5md"].attrs["version"].tolist() == [1, 1]
    for ts in u.trajectory:
        np.testing.assert_allclose(ts.positions, pos[ts.frame], rtol=1e-6)
        np.testing.assert_allclose(ts.dimensions[:3], edges[ts.frame], rtol=1e-6)
        np.testing.assert_allclose(ts.dimensions[3:], 90.0)
    assert u.trajectory[-1].data["total_energy"] == pytest.approx(res["final"]["total_energy"])
    fr = h5md.read_frame(path)
    assert fr["step"] == 20 and fr["position"].dtype == np.float64
    assert fr["observables"]["pressure"] == pytest.approx(res["final"]["pressure"])
    np.testing.assert_allclose(fr["box"], 5 * (4 / 0.8442) ** (1 / 3))

    # a state exported by another code (MDAnalysis's own H5MD writer, float32) continues
    other = str(tmp_path / "other.h5md")
    with MDAnalysis.Writer(other, n_atoms=500, velocities=True, convert_units=False) as w:
        w.write(u.atoms)  # the last frame
    cont = small_config(tmp_path, **{"output.path": str(tmp_path / "c.h5md")})
    cont["system"] = {"init": "h5md", "file": other}
    res2 = run_config(cont, dumps(cont), engine=None, mesh=None, steps=0, out=None,
                      progress=False)  # fmt: skip
    for k in ("potential_energy", "temperature", "pressure"):
        assert res2["initial"][k] == pytest.approx(res["final"][k], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("ensemble", ["nve", "langevin"])
def test_continue_from_h5md_reproduces_uninterrupted_run(tmp_path, ensemble):
    over = {"integrator.ensemble": ensemble}
    if ensemble == "langevin":
        over.update({"integrator.temperature": 1.2, "integrator.seed": 5})
    full = small_config(
        tmp_path, **over, **{"time.steps": 30, "output.path": str(tmp_path / "a.h5md")}
    )
    run_config(full, dumps(full), engine=None, mesh=None, steps=None, out=None, progress=False)
    cont = small_config(
        tmp_path, **over, **{"time.steps": 10, "output.path": str(tmp_path / "b.h5md")}
    )
    cont["system"] = {"init": "h5md", "file": str(tmp_path / "a.h5md"), "frame": 2,
                      "dtype": "float64"}  # fmt: skip
    run_config(cont, dumps(cont), engine=None, mesh=None, steps=None, out=None, progress=False)
    a, b = h5md.read_frame(tmp_path / "a.h5md"), h5md.read_frame(tmp_path / "b.h5md")
    assert a["step"] == b["step"] == 30
    # The tolerance documented in simpar.io.h5md: the continuation rebuilds the neighbour
    # list and recomputes the forces at the frame (another summation order), so it is not
    # bitwise (--resume is); round-off then grows with the chaos of the liquid.
    # Measured after 10 steps: 8.9e-16 sigma in position, 1.0e-14 in velocity.
    np.testing.assert_allclose(b["position"], a["position"], rtol=0, atol=1e-14)
    np.testing.assert_allclose(b["velocity"], a["velocity"], rtol=0, atol=1e-13)


@pytest.mark.slow
def test_sharded_equals_single(tmp_path):
    assert len(jax.devices()) == 8
    cfg = small_config(tmp_path)  # 500 atoms: padded to 504 slots on 8 devices
    one = run_config(cfg, dumps(cfg), engine="single", mesh=None, steps=None,
                     out=str(tmp_path / "s.h5md"), progress=False)  # fmt: skip
    cfg = small_config(tmp_path)
    eight = run_config(cfg, dumps(cfg), engine="sharded", mesh=(8,), steps=None,
                       out=str(tmp_path / "p.h5md"), progress=False)  # fmt: skip
    a, b = h5md.read_frame(one["path"]), h5md.read_frame(eight["path"])
    np.testing.assert_allclose(b["position"], a["position"], atol=1e-12)
    np.testing.assert_allclose(b["velocity"], a["velocity"], atol=1e-12)
    for k, v in one["final"].items():
        assert eight["final"][k] == pytest.approx(v, rel=1e-12, abs=1e-12)
    with h5py.File(eight["path"]) as f:
        assert f["parameters"].attrs["device_mesh"].tolist() == [8]


@pytest.mark.slow
def test_free_space_cluster_conserves_energy_and_momentum():
    r, _ = lattice.cubic_lattice("fcc", 1.0, (3, 3, 3))
    spc = space.free([10.0, 10.0, 10.0])
    pot = potentials.morse(d0=1.0, alpha=3.0, r0=2 ** (-0.5), cutoff=2.5, shift=True)
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(0), r.shape[0], 0.3)
    sim = md.make_simulation(spc, pot, r, v, dt=0.002, skin=0.3)
    e0 = sim.thermo()["total_energy"]
    sim.advance(200)
    assert sim.thermo()["total_energy"] == pytest.approx(e0, abs=1e-4)
    np.testing.assert_allclose(np.asarray(jnp.sum(sim.state.velocity, 0)), 0, atol=1e-10)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("parallel.engine", "gpu", "supported: single, pmap, shard_map, sharded"),
        ("potential.kind", "coulomb", "choose one of"),
        ("system.cells", [1, 1, 1], "minimum image"),
        ("potential.typo", 1.0, "unknown key"),
        ("output.path", "x.h5", "must end in .h5md"),
        ("output.path", "EXISTING", "exists; pass --overwrite"),
    ],
)
def test_invalid_config_raises_before_any_file(tmp_path, key, value, match):
    if value == "EXISTING":
        value = str(tmp_path / "old.h5md")
        (tmp_path / "old.h5md").write_bytes(b"keep me")
    cfg = small_config(tmp_path, **{key: value})
    with pytest.raises(ConfigError, match=match):
        run_config(cfg, dumps(cfg), engine=None, mesh=None, steps=None, out=None, progress=False)
    assert not (tmp_path / "t.h5md").exists()
    if value == str(tmp_path / "old.h5md"):
        assert (tmp_path / "old.h5md").read_bytes() == b"keep me"


@pytest.mark.slow
def test_unstable_run_raises_simulation_error(tmp_path):
    cfg = small_config(tmp_path, **{"time.dt": 0.05, "time.steps": 100})
    with pytest.raises(SimulationError, match=r"run failed at step \d+: .*reduce time.dt"):
        run_config(cfg, dumps(cfg), engine=None, mesh=None, steps=None, out=None, progress=False)
    assert h5md.n_frames(tmp_path / "t.h5md") >= 1  # frames before the failure are kept


@pytest.mark.slow
def test_melt_experiment_step0_matches_lammps(tmp_path, capsys):
    data = tomllib.loads(open("experiments/lj_melt.toml").read())
    res = run_config(data, dumps(data), engine=None, mesh=None, steps=0,
                     out=str(tmp_path / "melt.h5md"), progress=True)  # fmt: skip
    th = res["initial"]
    # examples/melt log, 4,000 atoms: 0 3 -6.7733681 0 -2.2744931 -3.7033504. (Not in
    # data/reference; the values also follow from in.lj's: KE/N = 1.5 T (1 - 1/N) and
    # P_kin = rho T (1 - 1/N) with the same E_pair and pair virial.)
    assert [lammps(th[k]) for k in ("temperature", "potential_energy", "total_energy",
                                    "pressure")] == ["3", "-6.7733681", "-2.2744931", "-3.7033504"]  # fmt: skip
    err = capsys.readouterr().err  # the thermo table goes to stderr (stdout: the summary)
    assert "Step" in err and "-6.7733681" in err
    bench = tomllib.loads(open("experiments/lj_bench.toml").read())
    assert bench["system"]["cells"] == [20, 20, 20] and bench["neighbors"]["skin"] == 0.3


def test_lammps_dump_velocities_map_onto_the_lattice(tmp_path):
    """``experiments/lammps_peer.lattice_velocities`` (the start of ``bench_md.py
    --vs-lammps``) puts each dumped atom's velocity on the lattice site it sits on, whatever
    the order and periodic image of the dump, and refuses atoms off the sites."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "experiments" / "lammps_peer.py"
    spec = importlib.util.spec_from_file_location("lammps_peer", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    r, box = lattice.cubic_lattice("fcc", 0.8442, (3,) * 3, F64)
    r, edge = np.asarray(r), float(box[0])
    rng = np.random.default_rng(0)
    v = rng.uniform(-1, 1, r.shape)
    perm = rng.permutation(r.shape[0])
    shifted = r[perm] + edge * rng.integers(-1, 2, r.shape)  # other images of the same sites
    rows = np.column_stack([np.arange(1, r.shape[0] + 1), shifted, v[perm]])
    dump = tmp_path / "d.txt"
    np.savetxt(dump, rows, header="\n" * 8, comments="", fmt="%.17g")
    np.testing.assert_array_equal(peer.lattice_velocities(str(dump), r, edge), v)
    rows[0, 1] += 0.3  # off its site
    np.savetxt(dump, rows, header="\n" * 8, comments="", fmt="%.17g")
    with pytest.raises(ValueError, match="lattice"):
        peer.lattice_velocities(str(dump), r, edge)


def test_lammps_peer_starts_ranks_bound_one_per_core(tmp_path, monkeypatch):
    """``lammps_peer.run_lammps(..., ranks=N)`` (the peer of ``bench_md.py --processes N``)
    starts ``mpirun -np N`` with rank ``i`` bound to the ``i``-th core given, reads the
    bindings mpirun reports (in rank order) into ``affinity`` and the rate from LAMMPS's log; too few
    cores is an error. Stand-ins for ``mpirun`` and ``lmp`` (CI has neither)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "experiments" / "lammps_peer.py"
    spec = importlib.util.spec_from_file_location("lammps_peer", path)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    mpirun, lmp = tmp_path / "mpirun", tmp_path / "lmp"
    mpirun.write_text(
        '#!/bin/bash\necho "$@" > "$(dirname "$0")/args"\n'
        'while [ "$1" != "--report-bindings" ]; do\n'
        '  if [ "$1" = "--cpu-list" ]; then list="$2"; fi; shift\ndone\nshift; i=0\n'
        'for c in ${list//,/ }; do\n'  # mpirun reports the ranks in any order
        '  echo "[vm:1] MCW rank $i bound to socket 0[core $c[hwt 0]]: [B]"; i=$((i+1))\n'
        'done | tac >&2\nexec "$@"\n'
    )  # fmt: skip
    lmp.write_text(
        '#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = "-log" ] && log="$2"; shift; done\n'
        "printf 'Loop time of 0.5 on 2 procs for 100 steps with 32000 atoms\\n"
        "Neighbor list builds = 5\\n' > \"$log\"\n"
    )  # fmt: skip
    mpirun.chmod(0o755)
    lmp.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out = peer.run_lammps(str(lmp), peer.in_lj(3), {5, 3, 9}, ranks=2)
    assert out["ranks"] == 2 and out["affinity"] == [3, 5]
    assert out["atom_steps_per_s"] == 32000 * 100 / 0.5 and out["neighbor_builds"] == 5
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("-np") + 1] == "2" and "cpu-list:ordered" in args
    assert args[args.index("--cpu-list") + 1] == "3,5"
    with pytest.raises(RuntimeError, match="3 cores"):
        peer.run_lammps(str(lmp), peer.in_lj(3), {0, 1}, ranks=3)


@pytest.mark.parametrize(
    "ensemble, policy",
    [("nve", (1, True)),
     pytest.param("langevin", (1, True), marks=pytest.mark.slow),
     pytest.param("nve", (20, False), marks=pytest.mark.slow),
     pytest.param("langevin", (3, True), marks=pytest.mark.slow)],
)  # fmt: skip
def test_host_driven_rebuilds_equal_the_one_program_chunk(ensemble, policy):
    """``single`` runs its steps and its list builds as separate programs (``md.Simulation``:
    ``run_until_rebuild``, the lean ``rebuild_list``); the one-program ``md.run_chunk`` (what
    ``sharded`` runs) from the same start gives the same state and list bit for bit, over
    chunks that end between builds and at a rebuild, and the same build count."""
    r, v, spc, pot = lj_system(cells=4, temperature=3.0)
    kw = dict(dt=0.005, skin=0.3, every=policy[0], check=policy[1], ensemble=ensemble)
    if ensemble == "langevin":
        kw.update(kt=1.0, gamma=1.0, key=jax.random.PRNGKey(5))
    sim = md.make_simulation(spc, pot, r, v, **kw)
    state, nbrs = sim.state, sim.nbrs
    for n in (13, 1, 30):
        sim.advance(n)
        state, nbrs = md.run_chunk(ensemble, sim.spec, spc, pot, sim.params, state, nbrs,
                                   jnp.int32(n), policy=policy)  # fmt: skip
        for name in ("position", "velocity", "force", "key", "step", "e_pair", "virial"):
            a, b = np.asarray(getattr(sim.state, name)), np.asarray(getattr(state, name))
            assert np.array_equal(a, b), f"{name} differs after {n} steps"
        assert np.array_equal(np.asarray(sim.nbrs.idx), np.asarray(nbrs.idx))
        assert int(sim.nbrs.n_builds) == int(nbrs.n_builds)
    assert int(nbrs.n_builds) >= 3


def test_consume_list_donates_the_start_list_and_changes_no_bit():
    """``Simulation.consume_list`` (``simpar run``'s chunks take the list instead of a copy):
    the start list's ``idx`` is donated (deleted), the run follows the default one bit for bit."""
    r, v, spc, pot = lj_system(cells=4, temperature=3.0)
    ref = md.make_simulation(spc, pot, r, v, dt=0.005)
    sim = md.make_simulation(spc, pot, r, v, dt=0.005)
    sim.consume_list = True
    for n in (7, 13):
        start = sim.nbrs
        sim.advance(n)
        ref.advance(n)
        assert start.idx.is_deleted() and not sim.nbrs.idx.is_deleted()
        np.testing.assert_array_equal(sim.snapshot()["position"], ref.snapshot()["position"])
        np.testing.assert_array_equal(np.asarray(sim.nbrs.idx), np.asarray(ref.nbrs.idx))


@pytest.mark.slow
def test_consume_list_redo_after_an_overflow_rebuilds_the_donated_list():
    """With ``consume_list`` a chunk that overflows has consumed its start list; the redo
    rebuilds it from ``ref_position`` and follows the default run bit for bit."""
    r, v, spc, pot = lj_system(cells=4, temperature=3.0)
    ref = md.make_simulation(spc, pot, r, v, dt=0.005)
    sim = md.make_simulation(spc, pot, r, v, dt=0.005)
    sim.consume_list = True
    sim.advance(20)
    ref.advance(20)
    tiny = dataclasses.replace(sim.spec, max_neighbors=8)
    sim.spec = tiny
    sim.nbrs = sim._rebuild(sim.state._replace(position=sim.nbrs.ref_position))._replace(
        n_builds=ref.nbrs.n_builds)  # fmt: skip
    assert sim.error == error_codes.NEIGHBORS
    start = sim.nbrs
    sim.advance(10)
    ref.advance(10)
    assert start.idx.is_deleted()
    assert sim.regrows == 1 and sim.error == 0 and sim.builds == ref.builds
    for name in ("position", "velocity", "force"):
        np.testing.assert_array_equal(sim.snapshot()[name], ref.snapshot()[name])
    assert sim.thermo() == ref.thermo()
