"""The one mapping (``simpar.parallel.mapping``) and what the engines check when given a state.

Layouts: a value placed then gathered comes back bitwise on every engine; the ``pmap`` stack of
an FFT pencil equals ``fft.split_blocks``. ``place()`` names the expected fields, says
"transpose" for a transposed field and names the expected shape; a model whose ``update`` does
not crop by ``radius`` is refused by name before anything compiles (issue 27, item 5).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from simpar.errors import ConfigError
from simpar.grid import heat, stencils
from simpar.grid.boundary import Periodic
from simpar.grid.domain import Domain
from simpar.parallel import fft, mapping
from simpar.parallel.engines import make_engine
from simpar.parallel.layouts import PARTICLES, REPLICATED, SLOTS, grid_blocks, pencils
from simpar.parallel.topology import DeviceGrid

PERIODIC = ((Periodic(), Periodic()), (Periodic(), Periodic()))


@pytest.mark.parametrize("engine", mapping.ENGINES)
def test_place_then_gather_is_bitwise_on_every_engine(engine):
    grid = (
        DeviceGrid((1, 1), (True, True)) if engine == "single" else DeviceGrid((2, 4), (True,) * 2)
    )
    m = mapping.Mapping(engine, grid)
    rng = np.random.default_rng(0)
    field = rng.random((3, 16, 32))  # a leading component axis is never split
    got = m.gather(m.place(field, grid_blocks(2)), grid_blocks(2))
    np.testing.assert_array_equal(got, field)
    parts = rng.random((64, 3))
    np.testing.assert_array_equal(m.gather(m.place(parts, PARTICLES), PARTICLES), parts)
    slots = rng.random((m.grid.size if not m.kind.one_device else 1, 5))
    np.testing.assert_array_equal(m.gather(m.place(slots, SLOTS), SLOTS), slots)
    np.testing.assert_array_equal(m.gather(m.place(np.float64(2.5), REPLICATED), None), 2.5)


@pytest.mark.parametrize(
    "shape,mesh", [((16, 12), (2, 4)), ((8, 8, 8), (2, 4)), ((8, 8, 8), (2, 2, 2))]
)
@pytest.mark.parametrize("fourier", [False, True])
def test_pmap_stack_of_a_pencil_equals_fft_split_blocks(shape, mesh, fourier):
    plan = fft.make_plan(shape, mesh, real=True)
    m = mapping.Mapping("pmap", mapping.device_grid(plan.mesh))
    full = plan.fourier_shape if fourier else plan.shape
    u = np.random.default_rng(1).random((2, *full))
    lay = pencils(plan, fourier, 1)
    stacked = m.stack(u, lay)
    np.testing.assert_array_equal(stacked, fft.split_blocks(u, plan, fourier))
    np.testing.assert_array_equal(m.unstack(stacked, lay), u)


def _heat_engine(engine="single", shape=(16, 32), mesh=None, model=None):
    model = model or heat.make_model(2, PERIODIC)
    return make_engine(engine, model, shape, mesh), model


def test_place_names_the_expected_fields():
    eng, _ = _heat_engine()
    with pytest.raises(ValueError, match=r"model heat has fields \['u'\], got \['T'\]"):
        eng.place({"T": np.zeros((16, 32))})


@pytest.mark.parametrize("engine,mesh", [("single", None), ("shard_map", (2, 4))])
def test_place_says_transpose_for_a_transposed_field(engine, mesh):
    eng, _ = _heat_engine(engine, mesh=mesh)
    with pytest.raises(ValueError, match=r"transpose: files store \(time, y, x\)"):
        eng.place({"u": np.zeros((32, 16))})
    with pytest.raises(ValueError, match=r"field 'u' has shape \(32, 16\); expected .*\(32, 32\)"):
        make_engine(engine, heat.make_model(2, PERIODIC), (32, 32), mesh).place(
            {"u": np.zeros((32, 16))}
        )
    with pytest.raises(ValueError, match=r"dtype <U1; expected a numeric array"):
        eng.place({"u": np.full((16, 32), "a")})


@pytest.mark.parametrize("crop", [0, 2], ids=["no-crop", "crop-2-radius-1"])
def test_a_model_that_breaks_the_crop_contract_is_named_before_compiling(crop):
    base = heat.make_model(2, PERIODIC)

    def update(state, params):
        u = state["u"]
        return {"u": stencils.crop(u, crop, 2) if crop else u * 1.0}

    model = dataclasses.replace(base, name="mine", update=update)
    eng, _ = _heat_engine(model=model)
    dom = Domain((16, 32), (1.0, 1.0), "float64")
    params = heat.make_params(dom, 1.0, 1e-4)
    state = eng.place({"u": np.zeros((16, 32))})
    with pytest.raises(ConfigError, match=r"radius = 1 .* block \(16, 32\) .*crop") as err:
        eng.advance(state, params, 4)
    assert err.value.key == "model.radius"
    assert not eng._advance  # refused before a chunk program was built


@pytest.mark.parametrize("engine", ["pmap", "shard_map"])
def test_a_program_fed_its_own_results_compiles_once(engine, no_compile_cache):
    """A mapped program called on placed values, then on its own results (a run's chunks),
    compiles one XLA program. Two ways this once failed, each a second full compile of the MD
    chunk (10-18 s of a cold start): ``shard_map``'s zero-size results (an empty send list)
    came back replicated, and ``pmap``'s placed blocks sat on a mesh named by another axis."""
    import jax
    import jax.numpy as jnp

    compiles = []

    def listen(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    m = mapping.Mapping(engine, DeviceGrid((2, 4), (True, True)))

    def block(x, empty, init):
        return x + jnp.where(init, 1.0, 2.0), empty

    fn = m.map(block, (SLOTS, SLOTS, REPLICATED), SLOTS)
    x = m.place(np.zeros((8, 3)), SLOTS)
    empty = m.place(np.zeros((8, 0), np.int32), SLOTS)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        x, empty = fn(x, empty, True)
        for _ in range(3):
            x, empty = fn(x, empty, False)
        jax.block_until_ready(x)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    np.testing.assert_array_equal(m.gather(x, SLOTS), np.full((8, 3), 7.0))
    assert len(compiles) == 1, f"{len(compiles)} compiles"


def test_a_tree_of_blocks_is_placed_by_one_program():
    """``blocks.put_blocks`` of a pytree (a decomposed MD state and its lists: 22 arrays)
    compiles one identity ``pmap``, not one per shape and dtype, and gives the arrays a mapped
    program then meets again in its own results: the program compiles once."""
    import jax
    import jax.numpy as jnp

    from simpar.parallel import blocks

    compiles = []

    def listen(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    m = mapping.Mapping("pmap", DeviceGrid((2, 4), (True, True)))
    tree = {"x": np.arange(24.0).reshape(8, 3), "ids": np.arange(8, dtype=np.int32),
            "empty": np.zeros((8, 0), np.int32)}  # fmt: skip
    fn = m.map(lambda t: {**t, "x": t["x"] + 1.0}, (SLOTS,), SLOTS)
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        placed = blocks.put_blocks(tree, m.devices)
        assert len(compiles) == 1, f"placement: {len(compiles)} compiles"
        out = fn(placed)
        for _ in range(2):
            out = fn(out)
        jax.block_until_ready(out)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert len(compiles) == 2, f"{len(compiles)} compiles"
    for k, v in tree.items():
        np.testing.assert_array_equal(m.gather(placed[k], SLOTS), v)
    np.testing.assert_array_equal(m.gather(out["x"], SLOTS), tree["x"] + 3.0)
    assert isinstance(out["ids"], jnp.ndarray)
