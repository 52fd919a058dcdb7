"""Gravitational N-body: kernel vs a NumPy double loop, every engine vs ``single`` on 1,
2, 4 and 8 devices, the ring's coverage, Plummer initial conditions (statistical
bounds), leapfrog energy/momentum conservation, and the config driver (H5MD output,
validation before any file exists, NaN detection).

Tolerances (float64): the ring adds per-block partial sums in ring order, ``single``
sums all sources in one reduction, so forces differ by round-off. We assert
``max|a_engine - a_single| <= 1e-12 * max|a_single|`` (measured: <= 6e-16).
"""

import logging

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simpar.config import dumps
from simpar.errors import ConfigError, SimulationError
from simpar.parallel.blocks import make_mesh
from simpar.parallel.halo import PmapComm, ShardMapComm
from simpar.parallel.mapping import ENGINES
from simpar.parallel.ring import ring_sum
from simpar.parallel.topology import DeviceGrid
from simpar.particles import nbody as nb
from simpar.particles.nbody import make_engine, nbody_run
from simpar.run import run_config

F64 = np.float64
FORCE_RTOL = 1e-12


def _random_system(n: int, seed: int = 0):
    """Plummer positions/velocities with unequal masses (total mass 1)."""
    pos, vel, mass = nb.plummer_sphere(n, seed, dtype=F64)
    mass = np.random.default_rng(seed + 100).uniform(0.2, 2.0, n).astype(F64)
    return nb.NBodyState(pos, vel, np.zeros_like(pos), mass / mass.sum())


def _numpy_loop(tpos, spos, smass, G, eps):
    acc = np.zeros((len(tpos), 3))
    phi = np.zeros(len(tpos))
    for i in range(len(tpos)):
        for j in range(len(spos)):
            d = spos[j] - tpos[i]
            r2 = float(d @ d)
            if r2 == 0.0:
                continue
            s = r2 + eps * eps
            acc[i] += G * smass[j] * d / s**1.5
            phi[i] -= G * smass[j] / np.sqrt(s)
    return acc, phi


# ------------------------------------------------------------------------- kernel


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_kernel_matches_numpy_double_loop(eps):
    rng = np.random.default_rng(1)
    spos = rng.normal(size=(11, 3)).astype(F64)
    smass = rng.uniform(0.5, 2.0, 11).astype(F64)
    tpos = np.concatenate([spos[:4], rng.normal(size=(3, 3))]).astype(F64)  # some shared
    G = F64(1.7)

    @jax.jit  # one program for the dense and the tiled kernels (op by op: 20 small programs)
    def kernels(tpos, spos, smass, G, eps):
        return (nb.accelerations(tpos, spos, smass, G, eps),
                nb.potentials(tpos, spos, smass, G, eps),
                # tiled evaluation (4 targets at a time, 7 targets: one padded block)
                nb.accelerations(tpos, spos, smass, G, eps, target_block=4),
                nb.potentials(tpos, spos, smass, G, eps, target_block=4))  # fmt: skip

    acc, phi, tiled, tiled_phi = kernels(tpos, spos, smass, G, F64(eps))
    ref_acc, ref_phi = _numpy_loop(tpos, spos, smass, G, eps)
    assert acc.dtype == jnp.float64 and acc.shape == (7, 3)
    np.testing.assert_allclose(acc, ref_acc, rtol=1e-13, atol=0)
    np.testing.assert_allclose(phi, ref_phi, rtol=1e-13, atol=0)
    # whole-system potential energy: each pair once
    w = nb.potential_energy(spos, smass, G, F64(eps))
    ref_w = 0.5 * np.sum(smass * _numpy_loop(spos, spos, smass, G, eps)[1])
    np.testing.assert_allclose(w, ref_w, rtol=1e-14)
    np.testing.assert_allclose(tiled, ref_acc, rtol=1e-13, atol=0)
    np.testing.assert_allclose(tiled_phi, ref_phi, rtol=1e-13, atol=0)


def test_kernel_antisymmetric_two_body():
    pos = np.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]], F64)
    mass = np.array([2.0, 0.5], F64)
    acc = np.asarray(nb.accelerations(pos, pos, mass, F64(1.0), F64(0.0)))
    np.testing.assert_allclose(acc[0], 0.5 * np.array([3.0, 4.0, 0.0]) / 125.0, rtol=1e-15)
    np.testing.assert_allclose(mass[0] * acc[0] + mass[1] * acc[1], 0.0, atol=1e-18)


# -------------------------------------------------------------------------- ring


@pytest.mark.parametrize("engine", ["pmap", "shard_map"])
def test_ring_visits_every_block_exactly_once(engine):
    n_dev = 8
    ids = np.eye(n_dev, dtype=F64)  # block k carries the one-hot vector e_k
    ring = DeviceGrid((n_dev,), (True,))
    comm = PmapComm(ring, "dev") if engine == "pmap" else ShardMapComm(ring)

    def block(src):
        return ring_sum(lambda t, s: s, None, src, comm)

    if engine == "pmap":
        out = jax.pmap(block, axis_name="dev")(ids[:, None, :])[:, 0, :]
    else:
        mesh = make_mesh((n_dev,), ring.axis_names, jax.devices())
        sm = jax.shard_map(block, mesh=mesh, in_specs=jax.P("x"), out_specs=jax.P("x"))
        src = jax.device_put(ids, jax.NamedSharding(mesh, jax.P("x")))
        out = jax.jit(sm)(src)
    np.testing.assert_array_equal(np.asarray(out), np.ones((n_dev, n_dev)))


# ------------------------------------------------------------- engines vs single


@pytest.fixture(scope="module")
def reference():
    state = _random_system(64)
    params = nb.make_params(0.005, 1.0, 0.05, dtype=F64)
    force0, obs0 = nbody_run(state, params, 0, "single", 1)
    final, obs = nbody_run(state, params, 25, "single", 1)
    return state, params, force0, obs0, final, obs


@pytest.mark.slow
@pytest.mark.parametrize("n_dev", [1, 2, 4, 8])
@pytest.mark.parametrize("engine", [e for e in ENGINES if e != "single"])
def test_engine_equals_single(reference, engine, n_dev):
    state, params, force0, obs0, final, obs = reference
    s0, o0 = nbody_run(state, params, 0, engine, n_dev)
    scale = np.abs(force0.acc).max()
    assert s0.acc.dtype == np.float64 and s0.acc.shape == (64, 3)
    assert np.abs(s0.acc - force0.acc).max() <= FORCE_RTOL * scale
    np.testing.assert_allclose(o0.potential, obs0.potential, rtol=1e-13)
    s, o = nbody_run(state, params, 25, engine, n_dev)
    for got, want in zip(s, final, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    for got, want in zip(o, obs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("engine,n_dev", [("single", 1), ("pmap", 2), ("shard_map", 4)])
def test_tiled_kernel_engines_equal_single(reference, engine, n_dev):
    # The CPU default tiles 64 targets at a time; N = 64 blocks never tile, so force it.
    state, params, force0, obs0, final, obs = reference
    eng = make_engine(engine, n_dev, target_block=5)
    d = eng.init(state.pos, state.vel, state.mass, params)
    scale = np.abs(force0.acc).max()
    assert np.abs(eng.fetch(d).acc - force0.acc).max() <= FORCE_RTOL * scale
    d, o = eng.run(d, params, 25)
    np.testing.assert_allclose(eng.fetch(d).pos, final.pos, rtol=0, atol=1e-12)
    np.testing.assert_allclose(o.potential, obs.potential, rtol=1e-12)


def test_single_engine_equals_plain_leapfrog(reference):
    state, params, _, _, final, _ = reference
    s = nb.init_state(state.pos, state.vel, state.mass, params.G, params.eps)

    def accel(p, m):
        return nb.accelerations(p, p, m, params.G, params.eps)

    step = jax.jit(lambda s: nb.leapfrog_step(s, params.dt, accel))
    for _ in range(25):
        s = step(s)
    np.testing.assert_allclose(s.pos, final.pos, rtol=0, atol=1e-14)


def test_indivisible_particle_count_is_a_config_error():
    state = _random_system(10)
    params = nb.make_params(0.01, 1.0, 0.05, dtype=F64)
    with pytest.raises(ConfigError, match=r"N = 10 .* 4 devices") as err:
        nbody_run(state, params, 1, "pmap", 4)
    assert err.value.key == "parallel.devices"
    with pytest.raises(ConfigError, match="bogus"):
        make_engine("bogus", 1)


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize(
    "engine,n_dev", [("single", 1), ("pmap", 2), ("shard_map", 4), ("sharded", 2)]
)
def test_chunked_run_compiles_once_and_equals_one_chunk(engine, n_dev):
    state = _random_system(32, seed=3)
    params = nb.make_params(0.01, 1.0, 0.05, dtype=F64)
    eng = make_engine(engine, n_dev)
    d = eng.init(state.pos, state.vel, state.mass, params)
    one, _ = eng.run(d, params, 12)  # compiles
    log = _Messages()
    logging.getLogger("jax").addHandler(log)
    try:
        with jax.log_compiles(True):
            for n in (5, 7):  # traced step count: other chunk lengths, same program
                d, _ = eng.run(d, params, n)
    finally:
        logging.getLogger("jax").removeHandler(log)
    assert [m for m in log.messages if m.startswith("Compiling")] == []
    np.testing.assert_array_equal(eng.fetch(d).pos, eng.fetch(one).pos)


# ------------------------------------------------------- Plummer sphere physics


def test_plummer_initial_conditions():
    n = 2048
    pos, vel, mass = nb.plummer_sphere(n, seed=7, dtype=F64)
    assert pos.dtype == vel.dtype == mass.dtype == np.float64
    np.testing.assert_array_equal(pos, nb.plummer_sphere(n, seed=7, dtype=F64)[0])
    assert not np.array_equal(pos, nb.plummer_sphere(n, seed=8, dtype=F64)[0])
    np.testing.assert_allclose(mass.sum(), 1.0, rtol=1e-14)
    # centre of mass at rest at the origin, to round-off
    assert np.abs(mass @ pos).max() < 1e-15 and np.abs(mass @ vel).max() < 1e-15
    state = nb.init_state(pos, vel, mass, F64(1.0), F64(0.0))
    obs = nb.observables(state, F64(1.0), F64(0.0))
    # Sampling noise measured over 20 seeds at N = 1024: std(Q) = 0.017, std(E) = 0.012;
    # at N = 2048 that is ~0.012 / ~0.009, so these bounds are ~4 sigma.
    assert abs(float(obs.virial_ratio) - 0.5) < 0.05
    assert abs(float(obs.total) + 0.25) < 0.04
    # Plummer half-mass radius: 1.305 a with a = 3 pi / 16 in N-body units (0.769).
    r_half = np.median(np.linalg.norm(pos, axis=1))
    assert abs(r_half / (1.305 * 3 * np.pi / 16) - 1) < 0.06


@pytest.mark.slow
@pytest.mark.parametrize("engine,n_dev,chunks", [("single", 1, 10), ("pmap", 4, 3)])
def test_plummer_leapfrog_conserves_energy_and_momentum(engine, n_dev, chunks):
    pos, vel, mass = nb.plummer_sphere(256, seed=0, dtype=F64)
    params = nb.make_params(0.01, 1.0, 0.05, dtype=F64)
    eng = make_engine(engine, n_dev)
    d = eng.init(pos, vel, mass, params)
    o0 = eng.observables(d, params)
    e0, l0 = float(o0.total), np.asarray(o0.angular_momentum)
    worst_de = worst_p = worst_l = 0.0
    for _ in range(chunks):  # single: 400 steps = t 4 (~1.4 crossing times); pmap: 120
        d, o = eng.run(d, params, 40)
        worst_de = max(worst_de, abs(float(o.total) / e0 - 1))
        worst_p = max(worst_p, np.abs(np.asarray(o.momentum)).max())
        worst_l = max(worst_l, np.abs(np.asarray(o.angular_momentum) - l0).max())
    # measured: |dE/E| <= 1.6e-5, |P| <= 1e-16, |dL| <= 3e-17
    assert worst_de < 1e-4
    assert worst_p < 1e-14
    assert worst_l < 1e-14


# ------------------------------------------------------------------------ driver


def _config(tmp_path, **over):
    data = {
        "model": {"name": "nbody"},
        "particles": {"n": 64, "seed": 3, "dtype": "float64"},
        "time": {"dt": 0.01, "steps": 20},
        "physics": {"softening": 0.05, "G": 1.0},
        "output": {"every": 10, "path": str(tmp_path / "run.h5md")},
        "parallel": {"engine": "single", "devices": 1},
    }
    for key, value in over.items():
        table, name = key.split("__")
        if value is None:
            data[table].pop(name)
        else:
            data[table][name] = value
    return data


@pytest.mark.filterwarnings("ignore:there is no reference attributes")
def test_driver_writes_h5md(tmp_path):
    data = _config(tmp_path)
    text = dumps(data)
    out = run_config(data, text, engine="pmap", mesh=(2,), steps=None, out=None, progress=False)
    assert out["frames"] == 3 and out["mesh"] == [2] and out["engine"] == "pmap"
    assert out["details"]["energy_max_rel_error"] < 5e-4  # N = 64: measured 7e-5
    path = tmp_path / "run.h5md"
    with h5py.File(path, "r") as f:
        meta = f["parameters"].attrs
        assert meta["run_status"] == "complete" and meta["unit_system"] == "nbody"
        assert meta["engine"] == "pmap" and meta["config"] == text
        assert list(meta["device_mesh"]) == [2]
        assert list(f["particles/trajectory/box"].attrs["boundary"]) == ["none"] * 3
        np.testing.assert_allclose(f["particles/trajectory/mass"][:].sum(), 1.0)
        assert list(f["h5md"].attrs["version"]) == [1, 1]
        pos = f["particles/trajectory/position"]
        assert pos["value"].shape == (3, 64, 3)
        np.testing.assert_array_equal(pos["step"][:], [0, 10, 20])
        np.testing.assert_allclose(pos["time"][:], [0.0, 0.1, 0.2])
        obs = f["observables"]
        assert obs["momentum/value"].shape == (3, 3)
        total = obs["total_energy/value"][:]
        np.testing.assert_allclose(
            total, obs["kinetic_energy/value"][:] + obs["potential_energy/value"][:]
        )
        assert np.abs(total / total[0] - 1).max() < 5e-4
        last = pos["value"][-1]
    # same numbers as the engine API with the same initial conditions
    p0, v0, m0 = nb.plummer_sphere(64, 3, dtype=F64)
    ref, _ = nbody_run(
        nb.NBodyState(p0, v0, p0 * 0, m0), nb.make_params(0.01, 1.0, 0.05), 20, "single"
    )
    np.testing.assert_allclose(last, ref.pos, rtol=0, atol=1e-12)
    import MDAnalysis as mda

    u = mda.Universe(str(path), n_atoms=64, convert_units=False)  # README "Output files"
    assert set(u.trajectory.units.values()) == {None}  # N-body units, not Angstrom/ps
    assert u.trajectory.n_frames == 3 and len(u.atoms) == 64
    u.trajectory[2]
    np.testing.assert_allclose(u.atoms.positions, last, rtol=1e-6, atol=1e-6)
    assert u.trajectory.ts.time == pytest.approx(0.2)
    np.testing.assert_allclose(u.trajectory.ts.data["total_energy"], total[2])
    assert u.trajectory.ts.data["momentum"].shape == (3,)
    assert u.dimensions is None  # open boundaries: no periodic box


@pytest.mark.parametrize(
    "over,kwargs,key",
    [
        ({"particles__n": None}, {}, "particles.n"),
        ({"time__dt": 0.0}, {}, "time.dt"),
        ({"physics__softnening": 0.1}, {}, "physics.softnening"),
        ({"parallel__engine": "mpi"}, {}, "parallel.engine"),
        ({"particles__n": 66}, {"engine": "shard_map", "mesh": (4,)}, "--mesh"),  # issue 17
        ({}, {"engine": "pmap", "mesh": (2, 2)}, "--mesh"),
        ({}, {"engine": "warp"}, "--engine"),
        ({"output__path": "x.h5"}, {}, "output.path"),
        ({"parallel__devices": 8}, {}, "parallel.devices"),  # engine single
        ({"parallel__mesh": [4]}, {"engine": "pmap"}, "parallel.mesh"),  # != devices
        ({"parallel__devices": 16}, {"engine": "pmap"}, "parallel.devices"),  # > 8
    ],
)
def test_driver_rejects_bad_input_before_creating_a_file(tmp_path, over, kwargs, key):
    data = _config(tmp_path, **over)
    if "output__path" in over:
        data["output"]["path"] = str(tmp_path / "x.h5")
    args = {"engine": None, "mesh": None, "steps": None, "out": None} | kwargs
    with pytest.raises(ConfigError) as err:
        run_config(data, dumps(data), progress=False, **args)
    assert err.value.key == key
    if over.get("particles__n") == 66:
        assert "66" in str(err.value) and "4 devices" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_driver_engine_single_from_command_line_ignores_config_devices(tmp_path):
    data = _config(tmp_path, parallel__engine="pmap", parallel__devices=8)
    out = run_config(
        data, dumps(data), engine="single", mesh=None, steps=0, out=None, progress=False
    )
    assert (out["engine"], out["mesh"], out["frames"]) == ("single", [1], 1)


def test_driver_detects_nan(tmp_path):
    # float32 with an absurd time step: positions overflow to inf within a few steps.
    data = _config(tmp_path, particles__dtype="float32", time__dt=1e37, time__steps=40)
    with pytest.raises(SimulationError, match="non-finite") as err:
        run_config(data, dumps(data), engine="", mesh=None, steps=None, out=None, progress=False)
    # reported at the end of the first chunk that met it (chunks start at 1 step and grow)
    assert 1 <= err.value.step <= 40 and "time.dt" in str(err.value)
    with h5py.File(tmp_path / "run.h5md", "r") as f:
        assert f["parameters"].attrs["run_status"].startswith("failed: non-finite")
        frames = f["particles/trajectory/position/step"][:]
        assert list(frames) == list(range(0, err.value.step, 10))  # the good frames stay
