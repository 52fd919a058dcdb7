"""Untrusted LJ and N-body checkpoints (issue 17, item 3; the grid ones: test_untrusted.py).

``--resume`` checks a particle checkpoint against the config before reading it: the names,
shapes and dtypes of every ``/state`` dataset from the metadata alone (int8 positions, a wrong
atom count, a string step, a missing or unexpected dataset, external storage), then the values
of the now known-small arrays (the step, finiteness, masses, the neighbour layout against the
config's cutoff, skin, box and boundary). Each crafted file gives a ``ConfigError`` on
``--resume`` naming the file and the dataset, exit 2 through the command line, and leaves the
output untouched.
"""

from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar.errors import ConfigError
from simpar.io import checkpoint, h5md


def _raw(tmp: Path) -> Path:
    other = tmp / "secret.bin"
    other.write_bytes(np.arange(256, dtype=np.float32).tobytes())
    return other


def _particle_cfg(tmp: Path, model: str) -> tuple[Path, Path]:
    """A small LJ (256 atoms) or N-body (16 bodies) config file and its output path."""
    out = tmp / f"{model}.h5md"
    if model == "lj":
        body = (
            '[model]\nname = "lj"\n[system]\nlattice = "fcc"\ndensity = 0.8442\n'
            'cells = [4, 4, 4]\ntemperature = 1.0\nseed = 1\ndtype = "float64"\n'
            '[integrator]\nensemble = "langevin"\ntemperature = 1.0\n'
            "[time]\ndt = 0.005\nsteps = 4\n"
        )
    elif model == "pm":
        body = (
            '[model]\nname = "nbody"\n[physics]\nforce = "pm"\npm_mesh = [8, 8, 8]\n'
            'box = [1.0, 1.0, 1.0]\n[particles]\nlattice = [4, 2, 2]\ndtype = "float64"\n'
            '[initial]\nkind = "plane_wave"\n[time]\ndt = 0.01\nsteps = 4\n'
        )
    else:
        body = (
            '[model]\nname = "nbody"\n[particles]\nn = 16\nseed = 3\ndtype = "float64"\n'
            "[time]\ndt = 0.01\nsteps = 4\n[physics]\nsoftening = 0.05\n"
        )
    cfg = tmp / f"{model}.toml"
    cfg.write_text(body + f'[output]\nevery = 2\npath = "{out}"\n')
    return cfg, out


@pytest.fixture(scope="module")
def particle_runs(tmp_path_factory):
    """model -> (config file, output) of a finished 4-step LJ / N-body / PM run (checkpoint at
    4)."""
    from simpar.cli import main

    tmp = tmp_path_factory.mktemp("particles")
    runs = {}
    for model in ("lj", "nbody", "pm"):
        cfg, out = _particle_cfg(tmp, model)
        assert main(["run", str(cfg), "--quiet"]) == 0
        runs[model] = (cfg, out)
    return runs


def _copy_run(run, tmp: Path) -> tuple[Path, Path]:
    """A copy of a run's output and checkpoint in ``tmp`` (the config still names the
    original output; ``--out`` points at the copy)."""
    _, out = run
    new = tmp / out.name
    new.write_bytes(out.read_bytes())
    ck = checkpoint.checkpoint_path(new)
    ck.write_bytes(checkpoint.checkpoint_path(out).read_bytes())
    return new, ck


def _replace(name, make):
    def build(g, tmp):
        del g[name]
        make(g, tmp)

    return build


def _with(name, data):
    return _replace(name, lambda g, t: g.create_dataset(name, data=data))


def _delete(name):
    return _replace(name, lambda g, t: None)


def _external(name, shape):
    return _replace(
        name,
        lambda g, t: g.create_dataset(
            name, shape, "f8", external=[(str(_raw(t)), 0, h5py.h5f.UNLIMITED)]
        ),
    )


# model -> case -> (build(state_group, tmp), the dataset the message must name)
PARTICLE_CRAFTED = {
    "lj": {
        "int8 positions": (_with("position", np.zeros((256, 3), np.int8)), "/state/position"),
        "wrong atom count": (_with("position", np.zeros((255, 3))), "/state/position"),
        "string step": (_with("step", np.bytes_("4")), "/state/step"),
        "missing dataset": (_delete("velocity"), "/state/velocity"),
        "unexpected dataset": (lambda g, t: g.create_dataset("junk", data=1.0), "/state/junk"),
        "float32 velocities": (
            _with("velocity", np.zeros((256, 3), np.float32)),
            "/state/velocity",
        ),
        "NaN positions": (_with("position", np.full((256, 3), np.nan)), "/state/position"),
        "huge cell grid": (_with("spec_cells", np.full(3, 10**6)), "/state/spec_cells"),
        "huge column capacity": (
            _with("spec_column_capacity", np.int64(2**31 - 1)),
            "/state/spec_column_capacity",
        ),
        "other list radius": (_with("spec_radius", np.float64(1.0)), "/state/spec_radius"),
        "other cell grid": (_with("spec_cells", np.full(3, 3)), "/state/spec_cells"),
        "free-space list": (_with("spec_periodic", np.False_), "/state/spec_periodic"),
        "step beyond int32": (_with("step", np.int64(2**40)), "/state/step"),
        "external storage": (_external("force", (256, 3)), "/state/force"),
    },
    "nbody": {
        "int8 positions": (_with("pos", np.zeros((16, 3), np.int8)), "/state/pos"),
        "wrong body count": (_with("pos", np.zeros((15, 3))), "/state/pos"),
        "string step": (_with("step", np.bytes_("4")), "/state/step"),
        "missing dataset": (_delete("vel"), "/state/vel"),
        "NaN masses": (_with("mass", np.full(16, np.nan)), "/state/mass"),
        "external storage": (_external("acc", (16, 3)), "/state/acc"),
    },
    "pm": {  # physics.force = "pm": the N-body datasets plus the PM buffers
        "int8 positions": (_with("pos", np.zeros((16, 3), np.int8)), "/state/pos"),
        "wrong particle count": (_with("vel", np.zeros((15, 3))), "/state/vel"),
        "missing energy scale": (_delete("energy_scale"), "/state/energy_scale"),
        "negative capacity": (_with("pm_capacity", np.int64(-5)), "/state/pm_capacity"),
        "string layout too long": (_with("pm_layout", np.bytes_("x" * 10**6)), "/state/pm_layout"),
    },
}
PARTICLE_CASES = [(m, c) for m in PARTICLE_CRAFTED for c in sorted(PARTICLE_CRAFTED[m])]


def _check(model: str, out: Path, config_text: str) -> None:
    from simpar.io import particle_checks as pck

    if model == "lj":
        box = np.full(3, 4 * (4 / 0.8442) ** (1 / 3))  # 4 fcc cells at density 0.8442
        pck.check_lj_resume(out, config_text, 256, "float64", 2.5, 0.3, box, True)
    elif model == "pm":
        pck.check_pm_resume(out, config_text, 16, "float64")
    else:
        pck.check_nbody_resume(out, config_text, 16, "float64")


@pytest.mark.parametrize("model,case", PARTICLE_CASES)
def test_crafted_particle_checkpoints_are_refused_against_the_config(
    particle_runs, tmp_path, model, case
):
    out, ck = _copy_run(particle_runs[model], tmp_path)
    with h5py.File(ck, "r") as f:
        text = f.attrs["config"]
    _check(model, out, text)  # the good one passes
    build, name = PARTICLE_CRAFTED[model][case]
    with h5py.File(ck, "a") as f:
        build(f["state"], tmp_path)
    with pytest.raises(ConfigError) as e:
        _check(model, out, text)
    assert e.value.key == "--resume" and name in str(e.value) and str(ck) in str(e.value)


def test_particle_checkpoint_of_another_dtype_or_size_is_refused(particle_runs, tmp_path):
    out, ck = _copy_run(particle_runs["lj"], tmp_path)
    with h5py.File(ck, "r") as f:
        text = f.attrs["config"]
    from simpar.io import particle_checks as pck

    with pytest.raises(
        ConfigError, match=r"/state/position is float64 \(256, 3\); expected dtype float32"
    ):
        pck.check_lj_resume(out, text, 256, "float32", 2.5, 0.3)
    with pytest.raises(
        ConfigError, match=r"/state/position has shape \(256, 3\); expected \(500, 3\)"
    ):
        pck.check_lj_resume(out, text, 500, "float64", 2.5, 0.3)


@pytest.mark.parametrize(
    "model,case",
    [
        ("lj", "int8 positions"),
        ("lj", "wrong atom count"),
        ("nbody", "string step"),
        ("pm", "negative capacity"),
    ],
)
def test_resume_from_a_crafted_particle_checkpoint_exits_2(
    particle_runs, tmp_path, capsys, model, case
):
    from simpar.cli import main

    cfg, _ = particle_runs[model]
    out, ck = _copy_run(particle_runs[model], tmp_path)
    frames = h5md.n_frames(out)
    build, name = PARTICLE_CRAFTED[model][case]
    with h5py.File(ck, "a") as f:
        build(f["state"], tmp_path)
    capsys.readouterr()
    code = main(["run", str(cfg), "--quiet", "--out", str(out), "--steps", "8", "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert name in err and str(ck) in err and "--resume" in err
    assert h5md.n_frames(out) == frames  # untouched by the refusal


@pytest.mark.parametrize(
    "model,kind",
    [("lj", "external_link"), ("pm", "external_link"), ("nbody", "truncated"),
     pytest.param("pm", "truncated", marks=pytest.mark.slow),
     pytest.param("lj", "external_storage", marks=pytest.mark.slow),
     pytest.param("nbody", "external_link", marks=pytest.mark.slow),
     pytest.param("pm", "external_storage", marks=pytest.mark.slow)],
)  # fmt: skip
def test_resume_onto_a_crafted_particle_output_exits_2(particle_runs, tmp_path, capsys, model,
                                                       kind):  # fmt: skip
    """Issue 31, item 1: ``--resume`` onto an output whose ``position/value`` links to or
    is stored in another file, or which is truncated, exits 2 naming the file (and the
    dataset) and writes nothing anywhere (tests/test_untrusted_output.py: every layout)."""
    from test_untrusted_output import resume_refused

    from simpar.cli import main

    cfg, _ = particle_runs[model]
    out, _ = _copy_run(particle_runs[model], tmp_path)
    resume_refused(main, capsys, [str(cfg)], out, "particles/trajectory/position/value", kind,
                   tmp_path)  # fmt: skip
