"""PM overflows take the MD error path (``error_codes``, ``step.run_steps``, ``step.Regrowing``).

Two blobs collide in a periodic box cut into 8 slabs along x: the slab where they meet soon
owns more particles than the buffers hold. A chunk stops after the step that overflowed (no
step is wasted after it) and reports that step, the one found by running single steps; the
host loop grows ``pm.capacity`` / ``pm.migrate``, redoes the chunk and then follows a run
started with the larger buffers bit for bit; a particle that jumps more than one sub-box is
an error (``LOST``), never regrown.
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from test_pm_run import WAVE, _datasets, _main

from simpar.errors import SimulationError
from simpar.io.h5md import H5MDWriter
from simpar.parallel.pm_engine import PMEngine
from simpar.particles import error_codes, pm
from simpar.particles.pm_sim import PMSimulation, programs

SHAPE, MESH, N = (16, 8, 8), (8,), 128


def blobs(speed=0.5, n=N, seed=3):
    """Two Gaussian blobs at x = 0.3125 and 0.6875 moving towards each other (host arrays)."""
    rng = np.random.default_rng(seed)
    left = np.arange(n) < n // 2
    pos = np.where(left[:, None], [0.3125, 0.5, 0.5], [0.6875, 0.5, 0.5])  # slab centres
    pos = np.mod(pos + 0.03 * rng.standard_normal((n, 3)), 1.0)
    vel = np.zeros((n, 3))
    vel[:, 0] = np.where(left, speed, -speed)
    return pos, vel, np.full(n, 1.0 / n)


PARAMS = pm.PMParams(jnp.asarray(0.02), jnp.asarray(1 / (4 * np.pi)))


def _tight(pos):
    """A capacity that holds the initial distribution exactly (it overflows later)."""
    return int(PMEngine("pmap", SHAPE, MESH).owned_counts(pos).max())


@pytest.fixture(scope="module")
def single_steps():
    """The chunk program with the tight capacity: the state at the start, and the first
    step whose chunk of one step sets an error bit (with that chunk's check)."""
    pos, vel, mass = blobs()
    eng = PMEngine("pmap", SHAPE, MESH, capacity=_tight(pos), migrate=64)
    placed = eng.distribute(pos, vel, mass)
    start, chunk, _ = programs(eng, np.float64)  # shared with the PMSimulation below
    st0 = start(*placed, PARAMS)
    st = st0
    for k in range(1, 40):
        st, check = chunk(st, PARAMS, jnp.int32(1))
        check = eng.per_device(check, 4)[0]
        if check[0]:
            return eng, chunk, st0, k, check
    raise AssertionError("the blobs never overflowed the tight capacity")


def test_a_chunk_stops_after_the_step_that_overflows(single_steps):
    eng, chunk, st0, k, one = single_steps
    assert k > 1 and one[0] & error_codes.OWNED and one[1] > eng.capacity
    _, check = chunk(st0, PARAMS, jnp.int32(40))
    check = eng.per_device(check, 4)  # every device stopped at the same step
    assert (check == check[0]).all(), check
    error, owned, _, done = check[0]
    assert done == k, "the loop went on stepping after the overflow"
    assert error == one[0] and owned == one[1]


def test_the_error_names_the_real_step_and_pm_capacity(single_steps):
    eng, _, _, k, _ = single_steps
    pos, vel, mass = blobs()
    eng = PMEngine("pmap", SHAPE, MESH, capacity=_tight(pos), migrate=64)
    sim = PMSimulation(eng, PARAMS, pos, vel, mass, max_regrows=0)
    with pytest.raises(SimulationError, match="raise pm.capacity") as err:
        sim.advance(40)
    assert err.value.step == k, str(err.value)
    assert f"run failed at step {k}: owned-particle capacity overflow" in str(err.value)
    assert sim.step == 0  # nothing committed: the chunk is redone or the run stops


@pytest.mark.slow  # recompiles at each regrow
def test_a_regrown_run_equals_one_started_with_the_grown_buffers():
    pos, vel, mass = blobs()
    lines = []
    eng = PMEngine("pmap", SHAPE, MESH, capacity=_tight(pos), migrate=64)
    sim = PMSimulation(eng, PARAMS, pos, vel, mass, log=lines.append)
    sim.advance(30)
    assert sim.step == 30 and sim.regrows == len(lines) >= 1, lines
    assert "regrew pm.capacity" in "".join(lines) and "redoing the chunk from step 0" in lines[0]
    big = PMEngine("pmap", SHAPE, MESH, capacity=eng.capacity, migrate=eng.migrate_cap)
    ref = PMSimulation(big, PARAMS, pos, vel, mass, max_regrows=0)
    ref.advance(30)
    for a, b in zip(sim.snapshot(), ref.snapshot(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_particle_jumping_a_sub_box_is_lost_not_regrown():
    pos, vel, mass = blobs(speed=8.0)  # 0.16 per step, more than a slab (0.125)
    eng = PMEngine("pmap", SHAPE, MESH, capacity=_tight(pos), migrate=64)  # compiled above
    sim = PMSimulation(eng, PARAMS, pos, vel, mass)
    with pytest.raises(SimulationError, match="reduce time.dt") as err:
        sim.advance(10)
    assert err.value.step == 1 and "lost particles" in str(err.value)
    assert sim.regrows == 0


# -- through `simpar run` --------------------------------------------------------------------
def _assert_same_files(a, b):
    a, b = _datasets(a), _datasets(b)
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
def test_the_plane_wave_on_8_devices_regrows_and_equals_a_run_with_room(tmp_path):
    """The 8-device command of pm_plane_wave.toml's header overflowed pm.capacity = 192 at
    step 269 (reported at 270, the chunk's end, and the run failed). Now it regrows and
    equals, bit for bit, a run started with the regrown buffers (to step 270 of 300: the
    regrow is the last event; the run to 300 takes twice as long)."""
    run = ["run", WAVE, "--engine", "pmap", "--devices", "8", "--set",
           "physics.pm_mesh=[64,8,8]", "--quiet", "--steps", "270"]  # fmt: skip
    code, stdout, err = _main([*run, "--out", str(tmp_path / "pw8.h5md")])
    assert code == 0, err
    assert ("nbody-pm: regrew pm.capacity 192 -> 288 (owned-particle capacity overflow at "
            "step 269: needed 208 owned") in err, err  # fmt: skip
    d = json.loads(stdout)["details"]
    assert (d["regrows"], d["pm_capacity"], d["pm_migrate"]) == (1, 288, 48)
    roomy = ["--set", "pm.capacity=288", "--set", "pm.migrate=48"]
    code, stdout, err = _main([*run, *roomy, "--out", str(tmp_path / "room.h5md")])
    assert code == 0 and "regrew" not in err, err
    assert json.loads(stdout)["details"]["regrows"] == 0
    _assert_same_files(tmp_path / "pw8.h5md", tmp_path / "room.h5md")


def _blobs_config(tmp_path) -> str:
    """The colliding blobs as an H5MD frame and a config that starts from it (pmap, 8 slabs,
    buffers that hold the first frame only)."""
    pos, vel, mass = blobs()
    w = H5MDWriter(tmp_path / "blobs.h5md", N, mass=mass)
    w.append(0, 0.0, pos, box=np.ones(3), velocity=vel)
    w.close()
    cfg = tmp_path / "blobs.toml"
    cfg.write_text(f"""
[model]
name = "nbody"
[physics]
force = "pm"
pm_mesh = {list(SHAPE)}
G = {1 / (4 * np.pi)!r}
[particles]
dtype = "float64"
[initial]
kind = "file"
path = "{(tmp_path / "blobs.h5md").as_posix()}"
[time]
dt = 0.02
steps = 20
[output]
every = 10
[pm]
capacity = {_tight(pos)}
migrate = 64
[parallel]
engine = "pmap"
devices = 8
""")
    return str(cfg)


@pytest.mark.slow
def test_resume_after_a_regrow_equals_an_uninterrupted_run_bitwise(tmp_path):
    cfg = _blobs_config(tmp_path)
    full, part = str(tmp_path / "full.h5md"), str(tmp_path / "part.h5md")
    code, _, err = _main(["run", cfg, "--out", full, "--quiet"])
    assert code == 0, err
    assert err.count("regrew") == 1 and "regrew pm.capacity" in err and "at step 10:" in err
    code, _, err = _main(["run", cfg, "--out", part, "--quiet", "--steps", "10"])
    assert code == 0 and err.count("regrew") == 1, err
    # the checkpoint at step 10 holds the regrown buffers: the resumed run starts in them
    code, stdout, err = _main(["run", cfg, "--out", part, "--quiet", "--resume"])
    assert code == 0 and "regrew" not in err, err
    assert json.loads(stdout)["resumed_from"] == 10
    _assert_same_files(full, part)
