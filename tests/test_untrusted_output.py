"""Untrusted outputs (issue 31, item 1): the file ``--resume`` appends to is checked like the
checkpoint before anything is appended (``simpar.io.untrusted``: links, storage, layout;
``nclayout.check_grid_output``, ``h5md_read.check_h5md_output``: frames).

Every model's output layout is built by its own writer (grid netCDF with an ensemble, the
spectral file with its ``k`` dimension, H5MD for LJ, N-body and PM), given three frames, then
crafted: links (external, soft), external storage, a virtual dataset, a filter needing a
plugin, another dtype, shape or maxshape, a missing or unexpected dataset, no frame at the
checkpoint's step, steps that do not increase, an element with fewer frames or its own
``step``. ``open_existing`` must raise a ``ConfigError`` naming the file and the dataset, and
neither the file nor any other file may change. The command-line cases of the issue (an
external link on ``step`` / ``position/value``, external storage, a truncated file) exit 2 on
every model.
"""

import hashlib
from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar.errors import ConfigError
from simpar.io import untrusted
from simpar.io.h5md import H5MDWriter
from simpar.io.netcdf import GridWriter

STEPS = (0, 2, 4)  # the frames written; the checkpoint is at the last one


def _grid_like(ensemble: int | None, spectral: bool):
    member = ("ensemble",) if ensemble else ()
    coords = {"y": np.arange(4.0), "x": np.arange(5.0)}
    variables = {
        "u": {"dims": ("time", *member, "y", "x"), "dtype": "float32"},
        "energy": {"dims": ("time", *member), "dtype": "float64"},
    }
    extra = None
    if spectral:
        extra = {"k": {"data": np.arange(3.0), "units": "m-1"}}
        variables["spectrum"] = {"dims": ("time", "k"), "dtype": "float64"}
    coords_e = {"kappa": {"data": np.array([1.0, 2.0])}} if ensemble else None

    def like(path, **kw):
        return GridWriter(path, coords=coords, variables=variables, extra_dims=extra,
                          ensemble=ensemble, ensemble_coords=coords_e, **kw)  # fmt: skip

    def frame(w, s):
        shape = (ensemble,) if ensemble else ()
        values = {"u": np.full(shape + (4, 5), s, np.float32), "energy": np.full(shape, 1.0 * s)}
        if spectral:
            values["spectrum"] = np.arange(3.0) * s
        w.append(s, 0.1 * s, values)

    return like, frame


def _h5md_like(model: str):
    from simpar.drive import nbody_output

    n = 6
    if model == "lj":
        names = ("temperature", "total_energy")

        def like(path, **kw):
            return H5MDWriter(path, n, observables=names, rng_key=True, mass=np.ones(n), **kw)

        def frame(w, s):
            w.append(s, 0.005 * s, np.full((n, 3), s, float), box=np.ones(3),
                     velocity=np.zeros((n, 3)), observables=dict.fromkeys(names, 1.0),
                     rng_key=np.array([1, s], np.uint32))  # fmt: skip

        return like, frame
    pm = model == "pm"
    names = nbody_output.PM_OBSERVABLES if pm else nbody_output._OBSERVABLES

    def like(path, **kw):
        return nbody_output.open_output(path, n, "float64", np.ones(n), {}, periodic=pm,
                                        names=names, **kw)  # fmt: skip

    def frame(w, s):
        obs = {k: (np.zeros(3) if k in ("momentum", "angular_momentum") else 1.0) for k in names}
        w.append(s, 0.01 * s, np.full((n, 3), s, float), box=np.ones(3), velocity=np.zeros((n, 3)),
                 observables=obs)  # fmt: skip

    return like, frame


LAYOUTS = {  # name -> (like, frame), the appended-to dataset and a time-dependent element
    "grid_ensemble": (lambda: _grid_like(2, False), "step", "u"),
    "grid": (lambda: _grid_like(None, False), "step", "u"),
    "spectral": (lambda: _grid_like(None, True), "step", "spectrum"),
    "lj": (lambda: _h5md_like("lj"), "particles/trajectory/position/value",
           "observables/temperature/value"),
    "nbody": (lambda: _h5md_like("nbody"), "particles/trajectory/position/value",
              "observables/momentum/value"),
    "pm": (lambda: _h5md_like("pm"), "particles/trajectory/position/value",
           "observables/density_contrast/value"),
}  # fmt: skip


def _write(path: Path, layout: str):
    (make, target, element) = LAYOUTS[layout]
    like, frame = make()
    w = like(path)
    for s in STEPS:
        frame(w, s)
    w.close()
    return like, target, element


def _victim(tmp: Path) -> Path:
    v = tmp / "victim.h5"
    with h5py.File(v, "w") as f:
        f.create_dataset("data", (3, 6, 3), maxshape=(None, 6, 3), chunks=True, dtype="f8")
    return v


def _recreate(f, name, **kw):
    old = f[name]
    spec = {"shape": old.shape, "dtype": old.dtype, "data": old[()]} | kw
    del f[name]
    if "external" in kw:
        spec.pop("data")
    return f.create_dataset(name, **spec)


def _unknown_filter(f, name, tmp):
    from h5py import h5d, h5p, h5s, h5t, h5z

    old = f[name]
    shape = old.shape
    del f[name]
    dcpl = h5p.create(h5p.DATASET_CREATE)
    dcpl.set_chunk(tuple(max(1, s) for s in shape))
    dcpl.set_filter(40000, h5z.FLAG_OPTIONAL)
    space = h5s.create_simple(shape, (h5s.UNLIMITED,) + shape[1:])
    h5d.create(f.id, name.encode(), h5t.NATIVE_DOUBLE, space, dcpl=dcpl)


def _external_storage(f, name, tmp):
    raw = tmp / "raw.bin"
    raw.write_bytes(np.asarray(f[name][()]).tobytes())
    _recreate(f, name, external=[(str(raw), 0, h5py.h5f.UNLIMITED)])


def _virtual(f, name, tmp):
    shape, dtype = f[name].shape, f[name].dtype
    layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
    layout[...] = h5py.VirtualSource(str(tmp / "victim.h5"), "data", shape=shape)
    del f[name]
    f.create_virtual_dataset(name, layout)


def _step_ds(f):
    return "step" if "step" in f else "particles/trajectory/position/step"


def _set_steps(values):
    def go(f, name, tmp):
        f[_step_ds(f)][:] = values

    return go


def _short(f, name, tmp):
    _, element = name
    f[element].resize(1, axis=0)


def _own_step(f, name, tmp):
    grp = f[name[1]].parent
    steps = grp["step"][()]
    del grp["step"]
    grp.create_dataset("step", data=steps, maxshape=(None,), chunks=True)


CRAFTED = {  # name -> (change(f, dataset, tmp), which dataset, expected words)
    "external_link": (lambda f, n, t: (f.__delitem__(n), f.__setitem__(
        n, h5py.ExternalLink(str(t / "victim.h5"), "/data"))), "target", "external link"),
    "soft_link": (lambda f, n, t: (f.__delitem__(n), f.__setitem__(
        n, h5py.SoftLink("/" + _step_ds(f) if n != _step_ds(f) else "/time"))), "target",
        "soft link"),
    "external_storage": (_external_storage, "target", "external storage"),
    "virtual": (_virtual, "target", "virtual dataset"),
    "unknown_filter": (_unknown_filter, "element", "filter 40000"),
    "dtype": (lambda f, n, t: _recreate(f, n, dtype="int32", maxshape=(None,) + f[n].shape[1:],
                                        chunks=True), "element", "int32"),
    "not_appendable": (lambda f, n, t: _recreate(f, n), "element", "maxshape"),
    "shape": (lambda f, n, t: _recreate(f, n, data=np.zeros(f[n].shape[:1] + (7,) * (
        f[n].ndim - 1)), dtype=f[n].dtype, shape=None, maxshape=(None,) + (7,) * (f[n].ndim - 1),
        chunks=True), "wide", "7"),
    "missing": (lambda f, n, t: f.__delitem__(n), "element", "missing"),
    "unexpected": (lambda f, n, t: f.create_dataset("extra", data=np.zeros(2)), "/extra",
                   "not in the output"),
    "no_frame_at_checkpoint": (_set_steps([0, 2, 5]), "step", "no frame at the checkpoint"),
    "decreasing_steps": (_set_steps([0, 4, 3]), "step", "do not increase"),
    "short_element": (_short, "element", "frames"),
    "own_step": (_own_step, "step", "step"),
}  # fmt: skip


def _digest(paths) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def _open(layout, path, like):
    cls = GridWriter if layout.startswith("grid") or layout == "spectral" else H5MDWriter
    return cls.open_existing(path, step=STEPS[-1], like=like)


FAST = {"spectral", "pm"}  # every case on these in the fast tier; links on the rest


@pytest.mark.parametrize(
    "layout,case",
    [
        pytest.param(layout, case, marks=() if layout in FAST or case == "external_link"
                     else pytest.mark.slow)
        for layout in sorted(LAYOUTS) for case in sorted(CRAFTED)
    ],
)  # fmt: skip
def test_crafted_outputs_are_refused_before_appending(tmp_path, layout, case):
    path = tmp_path / "out.h5"
    like, target, element = _write(path, layout)
    victim = _victim(tmp_path)
    change, which, words = CRAFTED[case]
    if case == "own_step" and layout[:1] not in "lnp":  # H5MD only: shared step/time
        pytest.skip("grid files have one step dataset")
    h5md = layout[:1] in "lnp"
    name = {"target": target, "element": element, "wide": target if h5md else element}.get(
        which, which
    )
    with h5py.File(path, "a") as f:
        change(f, (target, element) if case in ("short_element", "own_step") else name, tmp_path)
    if case == "own_step":
        name = element.rsplit("/", 1)[0] + "/step"
    before = _digest([path, victim, tmp_path / "raw.bin"])
    with pytest.raises(ConfigError) as err:
        _open(layout, path, like)
    msg = str(err.value)
    assert err.value.key == "--resume" and str(path) in msg, msg
    assert name.lstrip("/") in msg and words in msg, msg
    assert "\n" not in msg
    assert _digest([path, victim, tmp_path / "raw.bin"]) == before  # nothing written anywhere


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_good_output_is_resumed_at_the_checkpoint_frame(tmp_path, layout):
    """The untouched file passes and is cut to the frames up to the checkpoint's step."""
    path = tmp_path / "out.h5"
    like, _, _ = _write(path, layout)
    w = _open(layout, path, like)
    try:
        frames = getattr(w, "n_frames", None) or w.frames
        assert frames == len(STEPS)
    finally:
        w.close()
    cls = GridWriter if layout.startswith("grid") or layout == "spectral" else H5MDWriter
    w = cls.open_existing(path, step=STEPS[1], like=like)  # an earlier checkpoint: cut
    try:
        assert (getattr(w, "n_frames", None) or w.frames) == 2
    finally:
        w.close()


def test_plugin_loading_is_off_while_reading_untrusted_files(tmp_path):
    """HDF5 looks for no filter plugin while simpar reads a file from outside."""
    state = untrusted.plugin_loading_state()
    assert state is not None and state != 0
    with untrusted.no_plugins():
        assert untrusted.plugin_loading_state() == 0
    assert untrusted.plugin_loading_state() == state
    with pytest.raises(ZeroDivisionError), untrusted.no_plugins():
        raise ZeroDivisionError
    assert untrusted.plugin_loading_state() == state


# ----------------------------------------------------------------- the command lines
def _craft(out: Path, name: str, kind: str, tmp: Path) -> Path:
    """The issue's cases on a real output: ``name`` replaced by an external link into
    ``victim.h5`` or by external storage, or the file truncated to half. Returns the victim."""
    victim = tmp / "victim.h5"
    if kind == "truncated":
        data = out.read_bytes()
        out.write_bytes(data[: len(data) // 2])
        return victim
    with h5py.File(out, "a") as f:
        old = f[name]
        with h5py.File(victim, "w") as v:
            v.create_dataset("data", data=old[()], maxshape=old.maxshape, chunks=True)
        if kind == "external_link":
            del f[name]
            f[name] = h5py.ExternalLink(str(victim), "/data")
        else:
            _external_storage(f, name, tmp)
    return victim


def resume_refused(main, capsys, cfg_args, out: Path, name: str, kind: str, tmp: Path):
    """``simpar run ... --resume`` on a crafted copy of ``out``: exit 2, one line naming the
    file and ``name``, no file changed."""
    victim = _craft(out, name, kind, tmp)
    before = _digest([out, victim, tmp / "raw.bin"])
    capsys.readouterr()
    code = main(["run", *cfg_args, "--quiet", "--out", str(out), "--steps", "8", "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert err.count("\n") == 1 and str(out.name) in err, err
    if kind != "truncated":
        assert name in err, err
    assert _digest([out, victim, tmp / "raw.bin"]) == before


_GRID_RUNS: dict = {}


def _grid_run(model: str, tmp: Path):
    """(config args, output) of a finished 4-step 16^2 heat / spectral run (once per model)."""
    from simpar.cli import main

    if model not in _GRID_RUNS:
        root = Path(__file__).resolve().parents[1] / "experiments"
        toml = {"heat": "heat2d.toml", "spectral": "taylor_green.toml"}[model]
        args = [str(root / toml), "--set", "grid.shape=[16,16]", "--set", "output.every=2"]
        out = tmp / f"{model}.nc"
        assert main(["run", *args, "--quiet", "--out", str(out), "--steps", "4"]) == 0
        _GRID_RUNS[model] = (args, out)
    return _GRID_RUNS[model]


@pytest.fixture(scope="module")
def grid_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grids")
    return lambda model: _grid_run(model, tmp)


@pytest.mark.parametrize("kind", ["external_link", pytest.param("external_storage",
                         marks=pytest.mark.slow), pytest.param("truncated", marks=pytest.mark.slow)])  # fmt: skip
@pytest.mark.parametrize("model", ["heat", pytest.param("spectral", marks=pytest.mark.slow)])
def test_resume_onto_a_crafted_grid_output_exits_2(grid_runs, tmp_path, capsys, model, kind):
    from simpar.cli import main
    from simpar.io import checkpoint

    args, src = grid_runs(model)
    out = tmp_path / src.name
    out.write_bytes(src.read_bytes())
    checkpoint.checkpoint_path(out).write_bytes(checkpoint.checkpoint_path(src).read_bytes())
    resume_refused(main, capsys, args, out, "step", kind, tmp_path)
