"""PM overflows take the MD error path (``error_codes``, ``step.run_steps``, ``step.Regrowing``).

Two blobs collide in a periodic box cut into 8 slabs along x: the slab where they meet soon
owns more particles than the buffers hold. A chunk stops after the step that overflowed (no
step is wasted after it) and reports that step, the one found by running single steps; the
host loop grows ``pm.capacity`` / ``pm.migrate``, redoes the chunk and then follows a run
started with the larger buffers bit for bit; a particle that jumps more than one sub-box is
an error (``LOST``), never regrown.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from simpar.errors import SimulationError
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
    eng = PMEngine("pmap", SHAPE, MESH, capacity=_tight(pos), migrate=16)
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
