"""Research workflows built on the engines (``experiments/``): gradients through decomposed
runs and their memory, the sharding tour, surrogate training on simulation output."""

import importlib.util
from pathlib import Path

import jax
import pytest

from simpar.parallel.engines import make_engine

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


def _experiment(name):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def inverse_heat():
    return _experiment("inverse_heat")


DECOMPOSED = [("shard_map", (2, 4)), ("pmap", (2, 4)), ("sharded", (2, 4))]


def test_inverse_heat_gradient_and_recovery_on_every_engine(inverse_heat):
    """d misfit / d D through 18 steps on a 2x4 mesh: central differences to 1e-6, the same
    gradient on shard_map, pmap and sharded to 1e-12; gradient descent from D = 0.5 recovers
    D = 1 within 1% from frames with 1% noise."""
    model, params, u0 = inverse_heat.make_problem((16, 16))
    ref = make_engine("single", model, u0.shape, None, 2)
    data = inverse_heat.observations(ref, params, u0, frames=3, every=6, noise=0.01)
    d = 0.8
    grads = {}
    for name, mesh in DECOMPOSED:
        e = make_engine(name, model, u0.shape, mesh, 2)
        vg = jax.jit(jax.value_and_grad(inverse_heat.misfit(e, params, u0, data, 6)))
        g = float(vg(d)[1])
        h = 1e-5 * d
        fd = (float(vg(d + h)[0]) - float(vg(d - h)[0])) / (2 * h)
        assert abs(g - fd) <= 1e-6 * abs(fd), (name, g, fd)
        grads[name] = g
        if name == "shard_map":
            found, hist = inverse_heat.recover(vg, 0.5)
            assert abs(found - inverse_heat.TRUE_D) <= 0.01 * inverse_heat.TRUE_D, hist
            assert hist[-1][1] < 0.01 * hist[0][1]
    for name, g in grads.items():
        assert abs(g - grads["shard_map"]) <= 1e-12 * abs(g), (name, grads)


def test_checkpointed_2000_step_gradient_stays_within_its_memory_figure(inverse_heat):
    """XLA's temporaries per device for the 2,000-step gradient: with jax.checkpoint per
    50-step chunk at most 4 x (40 chunk inputs + 50 steps) field blocks; without it at least
    one field block per step (the whole history)."""
    model, params, u0 = inverse_heat.make_problem((32, 32))
    e = make_engine("shard_map", model, u0.shape, (2, 4), 2)
    mem = inverse_heat.gradient_memory(e, params, u0, steps=2000, chunk=50, run=False)
    block = mem["field_bytes_per_device"]
    assert block == 32 * 32 * 8 // 8
    assert mem["remat"] <= 4 * (2000 // 50 + 50) * block, mem
    assert mem["plain"] >= 2000 * block, mem
    assert mem["plain"] >= 10 * mem["remat"], mem
