"""Research workflows built on the engines (``experiments/``): gradients through decomposed
runs and their memory, the sharding tour, surrogate training on simulation output.

Slow tier: the inverse problem on three engines, the 2,000-step gradient's memory and the
surrogate training (compilation of gradients is most of their time)."""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
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


@pytest.mark.slow
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


@pytest.mark.slow
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


def test_layout_maps_pmap_flat_axis_back_to_the_grid(capsys):
    """``simpar info --mesh 2x4 --engine pmap`` names the block of every device; the placed
    pmap blocks sit on exactly those devices, and the picture shows the same grid."""
    from simpar.cli import main
    from simpar.grid import heat
    from simpar.grid.boundary import Periodic
    from simpar.parallel.layout import blocks

    assert main(["info", "--mesh", "2x4", "--engine", "pmap", "--grid", "64x32"]) == 0
    out = capsys.readouterr().out
    assert "blocks of 32x8 cells" in out
    assert "cpu:6  index 6  coords (1, 2)  x 32:64, y 16:24" in out
    assert "│ CPU 0 │ CPU 1 │ CPU 2 │ CPU 3 │" in out and "│ CPU 4 │ CPU 5 │ CPU 6 │ CPU 7 │" in out
    model = heat.make_model(2, ((Periodic(), Periodic()),) * 2)
    e = make_engine("pmap", model, (64, 32), (2, 4), 1)
    u = np.arange(64 * 32.0).reshape(64, 32)
    placed = e.place({"u": u})["u"]
    table = blocks(e)
    for shard in placed.addressable_shards:
        b = table[e.devices.index(shard.device)]
        assert b["device"] == str(shard.device)
        (x0, x1), (y0, y1) = b["cells"]
        np.testing.assert_array_equal(np.asarray(shard.data)[0], u[x0:x1, y0:y1])


def test_show_layout_prints_before_the_run(tmp_path, capsys):
    import json

    from simpar.cli import main

    out = tmp_path / "lay.nc"
    args = ["run", "experiments/heat2d.toml", "--engine", "shard_map", "--mesh", "4x2"]
    args += ["--show-layout", "--steps", "2", "--set", "grid.shape=[16,16]", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0
    captured = capsys.readouterr()
    # the layout goes to stderr; stdout holds the one JSON summary line
    assert json.loads(captured.out)["path"] == str(out)
    text = captured.err
    assert "engine shard_map: grid 16x16 cells on device mesh 4x2" in text
    assert "cpu:7  index 7  coords (3, 1)  x 12:16, y 8:16" in text
    assert "│  CPU 6   │  CPU 7   │" in text


def test_sharded_dot_equals_unsharded_and_stays_sharded():
    dot = _experiment("sharded_dot")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 16, 1000))
    out, xs, _ = dot.sharded_dots(x, y, 8)
    np.testing.assert_allclose(np.asarray(out), np.einsum("ij,ij->i", x, y), rtol=1e-13)
    one_device = np.asarray(jax.vmap(jnp.vdot)(x, y))  # summed in another order: round-off
    np.testing.assert_allclose(np.asarray(out), one_device, rtol=1e-14, atol=1e-13)
    assert str(out.sharding.spec) == "P('rows',)" and len(out.sharding.device_set) == 8
    assert len(xs.addressable_shards) == 8 and xs.addressable_shards[3].data.shape == (2, 1000)


@pytest.mark.slow
def test_surrogate_training_pmap_and_sharding_equal_one_device(tmp_path):
    """A heat run's output read back with h5py (each process its own slice of pairs); 20 Adam
    steps with the pmap step (pmean) and the sharded jit step give the parameters of a
    one-device step on the whole batch to round-off, and the loss falls."""
    sur = _experiment("train_surrogate")
    path = sur.simulate(tmp_path / "heat.nc", shape=(16, 16), frames=20, every=5)
    x, y = sur.read_pairs(path)
    assert x.shape == (20, 16, 16, 1)
    halves = [sur.read_pairs(path, process_index=i, process_count=2) for i in (0, 1)]
    np.testing.assert_array_equal(np.concatenate([h[0] for h in halves]), x)
    np.testing.assert_array_equal(np.concatenate([h[1] for h in halves]), y)
    np.testing.assert_array_equal(x[1:], y[:-1])
    results = {v: sur.train(v, x, y, steps=20, batch_size=16) for v in ("one", "pmap", "sharded")}
    ref_params, ref_losses = results["one"]
    before = float(sur.loss_fn(sur.init_params(jax.random.PRNGKey(0)), x, y))
    after = float(sur.loss_fn(ref_params, x, y))
    assert after < 0.5 * before, (before, after)
    for version, (params, losses) in results.items():
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-10, err_msg=version)
        for k in ref_params:
            np.testing.assert_allclose(
                np.asarray(params[k]),
                np.asarray(ref_params[k]),
                rtol=1e-9,
                atol=1e-12,
                err_msg=f"{version} {k}",
            )


def test_readme_research_workflows_code_runs():
    """The Python blocks of docs/kernels.md's "Research workflows" section run as written."""
    text = (EXPERIMENTS.parent / "docs" / "kernels.md").read_text()
    section = text.split("## Research workflows", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    blocks = [b for b in blocks if not b.startswith("# fragment")]  # marked, not a script
    assert blocks
    for code in blocks:
        exec(compile(code, "docs/kernels.md", "exec"), {})
