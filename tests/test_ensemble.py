"""Ensembles on device groups: every member equals the same run done alone.

Engines hold 4 members: vmapped on one device (``single``), 4 members x 2 blocks on 8 pmap
devices (halos inside a member, diagnostics by ``axis_index_groups``), a member mesh axis
(``shard_map``, ``sharded``). Fields are compared bitwise, sums to round-off.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from simpar import config as cfgmod
from simpar.errors import ConfigError
from simpar.grid import heat
from simpar.grid.boundary import Dirichlet, Neumann, Periodic
from simpar.grid.domain import Domain
from simpar.parallel.engines import make_engine
from simpar.parallel.ensemble import make_ensemble_engine
from simpar.parallel.layout import blocks
from simpar.run import run_config, run_file
from simpar.testing import assert_same_field

SHAPE = (16, 12)
# x periodic: a halo crossing from one member into another would show on the split x axis
BCS = ((Periodic(), Periodic()), (Dirichlet(0.5), Neumann()))
CASES = [("single", None), ("pmap", (2,)), ("shard_map", (1, 2)), ("sharded", (2, 1))]


@pytest.mark.parametrize("engine,mesh", CASES, ids=[c[0] for c in CASES])
def test_each_member_equals_its_run_alone(engine, mesh):
    dom = Domain(SHAPE, (1.6, 1.2), "float64")
    model = heat.make_model(2, BCS)
    members = [heat.make_params(dom, d, 1e-4) for d in (0.5, 0.7, 0.9, 1.1)]
    fields = [np.random.default_rng(m).random(SHAPE) for m in range(4)]
    params = jax.tree.map(lambda *p: jnp.stack(p), *members)
    e = make_ensemble_engine(engine, model, SHAPE, 4, mesh, 2)
    assert len(e.devices) == (1 if engine == "single" else 8)
    if engine == "pmap":  # 4 members x 2 blocks: member m on devices 2m, 2m + 1
        assert [(b["member"], b["coords"]) for b in blocks(e)][4:6] == [(2, (0, 0)), (2, (1, 0))]
    st = e.advance(e.place({"u": np.stack(fields)}), params, 7)
    out, obs = e.gather(st)["u"], e.observe(st, params)
    alone = make_engine(engine, model, SHAPE, mesh, 2)
    for m in range(4):
        s1 = alone.advance(alone.place({"u": fields[m]}), members[m], 7)
        assert_same_field(out[m], alone.gather(s1)["u"], f"{engine} member {m}")
        o1 = alone.observe(s1, members[m])
        for k, v in o1.items():
            np.testing.assert_allclose(obs[k][m], v, rtol=1e-12, err_msg=f"{engine} {k} {m}")


def test_ensemble_file_has_an_ensemble_dimension_and_members_equal_runs_alone(tmp_path):
    small = ["grid.shape=[16,16]", "output.every=10", "time.dt=2e-4"]
    path = tmp_path / "ens.nc"
    run_file(
        "experiments/heat_ensemble.toml",
        small,
        engine="single",
        steps=20,
        out=str(path),
        progress=False,
    )
    ds = xr.open_dataset(path, engine="h5netcdf")
    assert ds.u.dims == ("time", "ensemble", "y", "x") and ds.sizes["ensemble"] == 4
    assert ds.u_sum.dims == ("time", "ensemble") and ds.u_profile.dims == ("time", "ensemble", "y")
    assert ds.attrs["ensemble_members"] == 4 and ds.attrs["run_status"] == "complete"
    # (the engine test above checks all 4 members on every engine; here the driver and the
    # file, on single, for the first and the last member)
    for m, d, seed in ((0, 0.5, 1), (3, 2.0, 4)):
        one = tmp_path / f"alone{m}.nc"
        data, _ = cfgmod.load(
            "experiments/heat_ensemble.toml",
            [*small, f"physics.diffusivity={d}", f"initial.seed={seed}"],
        )
        data.pop("ensemble")
        run_config(data, "", engine="single", steps=20, out=str(one), progress=False)
        ref = xr.open_dataset(one, engine="h5netcdf")
        assert "ensemble" not in ref.dims
        assert_same_field(ds.u.isel(ensemble=m).values, ref.u.values, f"member {m}")
        np.testing.assert_allclose(ds.u_sum.isel(ensemble=m).values, ref.u_sum.values, rtol=1e-12)


@pytest.mark.slow
def test_swept_parameters_are_coordinates_and_plot_shows_every_member(tmp_path, monkeypatch):
    path = tmp_path / "ens.nc"
    run_file(
        "experiments/heat_ensemble.toml",
        ["grid.shape=[16,16]", "output.every=5", "time.dt=2e-4"],
        engine="single",
        steps=10,
        out=str(path),
        progress=False,
    )
    ds = xr.open_dataset(path, engine="h5netcdf")
    assert ds.diffusivity.dims == ("ensemble",) and "diffusivity" in ds.coords
    assert ds.seed.dims == ("ensemble",) and ds.seed.values.tolist() == [1, 2, 3, 4]
    np.testing.assert_array_equal(ds.diffusivity.values, [0.5, 1.0, 1.5, 2.0])
    picked = ds.sel(diffusivity=1.5)
    assert picked.u.dims == ("time", "y", "x") and int(picked.seed) == 3
    np.testing.assert_array_equal(picked.u.values, ds.u.isel(ensemble=2).values)
    np.testing.assert_array_equal(ds.sel(seed=4).u_sum.values, ds.u_sum.isel(ensemble=3).values)

    from simpar.io import plot

    figures = {}
    real = plot._save

    def keep(fig, out):
        figures[out.name] = fig
        return real(fig, out)

    monkeypatch.setattr(plot, "_save", keep)
    written = plot.plot_file(path)
    assert all(p.is_file() for p in written)
    field = figures["ens_u.png"]
    images = [ax for ax in field.axes if ax.images]
    assert len(images) == 4  # one panel per member
    titles = sorted(ax.get_title() for ax in images)
    assert titles == [
        f"diffusivity = {d}, seed = {s}" for d, s in ((0.5, 1), (1, 2), (1.5, 3), (2, 4))
    ]
    assert len({tuple(ax.images[0].get_clim()) for ax in images}) == 1  # one colour scale
    series = figures["ens_timeseries.png"]
    lines = [ln.get_label() for ln in series.axes[0].lines]
    assert lines == [
        f"diffusivity = {d}, seed = {s}" for d, s in ((0.5, 1), (1, 2), (1.5, 3), (2, 4))
    ]
    profile = figures["ens_u_profile.png"]
    assert len(profile.axes[0].lines) == 4


@pytest.mark.parametrize(
    "sets,key",
    [
        (['ensemble.sweep={"physics.stencil"=["5pt","9pt","5pt","9pt"]}'], "ensemble.sweep"),
        (['ensemble.sweep={"physics.difusivity"=[1,1,1,1]}'], "ensemble.sweep.physics.difusivity"),
        (['ensemble.sweep={"physics.diffusivity"=[1,2]}'], "ensemble.sweep.physics.diffusivity"),
    ],
    ids=["model-changes", "typo", "length"],
)
def test_bad_ensemble_sections_are_refused(tmp_path, sets, key):
    with pytest.raises(ConfigError) as err:
        run_file(
            "experiments/heat_ensemble.toml",
            ["grid.shape=[16,16]", *sets],
            steps=2,
            out=str(tmp_path / "x.nc"),
            progress=False,
        )
    assert err.value.key == key, str(err.value)
    assert not (tmp_path / "x.nc").exists()


def test_too_few_devices_for_the_members():
    model = heat.make_model(2, BCS)
    with pytest.raises(ConfigError, match="4 members x mesh 4x1 need 16 devices"):
        make_ensemble_engine("pmap", model, SHAPE, 4, (4,), 1)
