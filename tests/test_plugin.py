"""Your own model as a plugin (issue 27, items 3 and 4): one model protocol, open to users.

- The README section "Your own model as a plugin" (until it exists: ``docs/plugin_example/``)
  holds three files: the plugin's ``pyproject.toml`` (entry point in the group
  ``simpar.models``), its module and an experiment. Copied verbatim into an empty folder and
  installed with ``pip install -e``, the model runs through ``simpar run`` on ``single`` and
  on ``shard_map --devices 8 --mesh 2x4`` with bitwise equal fields, resumes bit for bit, and
  ``simpar plot`` draws it (slow: a pip install and five runs in fresh processes).
- ``simpar.run.run_config`` takes a model object directly; the registry never imports what a
  config names; the command line imports no model module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from simpar.config import dumps
from simpar.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "plugin_example"
SECTION = "## Your own model as a plugin"
FILES = ("pyproject.toml", "allen_cahn.py", "allen_cahn.toml")


def plugin_files() -> dict[str, str]:
    """The plugin's three files as the README shows them (first three code blocks of its
    section, each opening with ``# file: NAME``), else as ``docs/plugin_example/`` has them."""
    readme = (ROOT / "README.md").read_text()
    if SECTION + "\n" in readme:
        body = readme.split(SECTION + "\n", 1)[1].split("\n## ", 1)[0]
        blocks = re.findall(r"```(\w+)\n(.*?)```", body, re.S)[:3]
        assert [lang for lang, _ in blocks] == ["toml", "python", "toml"], blocks
        out = {}
        for _, text in blocks:
            name = text.splitlines()[0].removeprefix("# file: ").strip()
            out[name] = text
        assert tuple(out) == FILES[:1] + tuple(out)[1:] and len(out) == 3, list(out)
        return out
    return {name: (EXAMPLE / name).read_text() for name in FILES}


def test_the_readme_shows_the_example_files_verbatim():
    files = plugin_files()
    assert set(files) == set(FILES)
    for name, text in files.items():
        assert text.splitlines()[0] == f"# file: {name}"
        assert text == (EXAMPLE / name).read_text(), f"README and docs/plugin_example/{name}"


def _load_example():
    spec = importlib.util.spec_from_file_location("allen_cahn_example", EXAMPLE / "allen_cahn.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _small(config: dict, **over) -> dict:
    import copy

    data = copy.deepcopy(config)
    data["grid"]["shape"] = [16, 16]
    data["time"]["steps"] = 8
    data.setdefault("output", {})["every"] = 4
    for k, v in over.items():
        a, b = k.split(".")
        data.setdefault(a, {})[b] = v
    return data


@pytest.mark.parametrize(
    "runs",
    [
        {"single": None, "sharded": (4, 2)},
        pytest.param({"single": None, "pmap": (2, 2), "shard_map": (2, 4)}, marks=pytest.mark.slow),
    ],
)
def test_run_config_takes_a_model_object_on_every_engine(tmp_path, runs):
    """A script hands its model object to run_config: no install, no edit of simpar; the four
    engines write bitwise equal fields (the model's arithmetic is the same on every block)."""
    import tomllib

    from simpar.run import run_config

    mod = _load_example()
    config = tomllib.loads((EXAMPLE / "allen_cahn.toml").read_text())
    fields = {}
    for engine, mesh in runs.items():
        data = _small(config, **{"parallel.engine": engine})
        out = tmp_path / f"{engine}.nc"
        s = run_config(data, dumps(data), model=mod.model, mesh=mesh, out=str(out), progress=False)
        assert s["model"] == "allen_cahn" and s["frames"] == 3 and s["engine"] == engine
        with h5py.File(out) as f:
            fields[engine] = f["u"][...]
            assert f.attrs["model"] in ("allen_cahn", b"allen_cahn")
    for engine, u in fields.items():
        np.testing.assert_array_equal(u, fields["single"], err_msg=engine)
    assert np.abs(fields["single"][-1]).max() > np.abs(fields["single"][0]).max()  # it grows
    # [model] name, when given, must be the model's
    data = _small(config)
    data["model"]["name"] = "heat"
    with pytest.raises(ConfigError, match="model.name"):
        run_config(data, dumps(data), model=mod.model, out=str(tmp_path / "x.nc"))
    assert not (tmp_path / "x.nc").exists()


def test_a_config_names_a_model_never_a_module(tmp_path):
    """``[model] name`` is looked up among built-ins and installed entry points only: a
    module path written in a config is an unknown model (and is not imported)."""
    from simpar import models
    from simpar.run import run_config

    data = {"model": {"name": "os.path:join"}, "time": {"steps": 1}}
    with pytest.raises(ConfigError, match="unknown model 'os.path:join'; available: heat"):
        run_config(data, dumps(data), out=str(tmp_path / "x.nc"))
    assert set(models.BUILTIN) <= set(models.available())
    with pytest.raises(ConfigError, match="not a simpar model"):
        run_config(data, dumps(data), model=object(), out=str(tmp_path / "x.nc"))
    # a reader that breaks the contract: one line naming the model
    import tomllib

    wrong = models.grid_model("phase_field", _load_example().from_config)
    data = tomllib.loads((EXAMPLE / "allen_cahn.toml").read_text())
    data["model"]["name"] = "phase_field"
    with pytest.raises(ConfigError, match="'phase_field': its GridModel is named 'allen_cahn'"):
        run_config(data, dumps(data), model=wrong, out=str(tmp_path / "x.nc"))
    assert not (tmp_path / "x.nc").exists()


def test_the_command_line_imports_no_model_module():
    """``import simpar.cli``, ``simpar info`` and ``simpar info --mesh`` load no model module
    (``simpar.grid.*`` but the contract, ``simpar.particles.*``, ``simpar.drive.*`` but the
    package's table of built-in names)."""
    code = (
        "import sys\n"
        "from simpar import cli\n"
        "assert cli.main(['info', '--devices', '4', '--mesh', '2x2']) == 0\n"
        "allowed = {'simpar.grid', 'simpar.grid.model', 'simpar.drive'}\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('simpar.grid.', "
        "'simpar.particles', 'simpar.drive')) and m not in allowed)\n"
        "print('LOADED', bad)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "LOADED []" in r.stdout, r.stdout[-500:]


def _pip_install(folder: Path) -> list[str]:
    """``pip install -e folder`` into this interpreter's venv; offline when setuptools can
    build editable wheels here (no build isolation), else with build isolation (a registry)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(folder)]
    try:
        import setuptools

        offline = int(setuptools.__version__.split(".")[0]) >= 71 or bool(
            importlib.util.find_spec("wheel")
        )
    except ImportError:
        offline = False
    if offline:
        cmd.insert(-2, "--no-build-isolation")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return [sys.executable, "-m", "pip", "uninstall", "-q", "-y", "allen-cahn-simpar"]


def _simpar(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    r = subprocess.run(
        [sys.executable, "-m", "simpar", *args], cwd=folder, capture_output=True, text=True,
        env=env, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow
@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="installs a package: venv only")
def test_the_readme_plugin_installs_and_runs_on_single_and_shard_map(tmp_path):
    folder = tmp_path / "allen_cahn_plugin"
    folder.mkdir()
    for name, text in plugin_files().items():
        (folder / name).write_text(text)
    uninstall = _pip_install(folder)
    try:
        one = _simpar(folder, "run", "allen_cahn.toml", "--quiet", "--out", "single.nc")
        assert json.loads(one.stdout)["model"] == "allen_cahn"
        _simpar(folder, "run", "allen_cahn.toml", "--quiet", "--engine", "shard_map",
                "--devices", "8", "--mesh", "2x4", "--out", "shard_map.nc")  # fmt: skip
        with h5py.File(folder / "single.nc") as a, h5py.File(folder / "shard_map.nc") as b:
            assert a["u"].shape[0] >= 2
            np.testing.assert_array_equal(a["u"][...], b["u"][...])
            np.testing.assert_array_equal(a["time"][...], b["time"][...])
            u = a["u"][...]
        assert (folder / "single.nc.xdmf").exists() and (folder / "shard_map.nc.xdmf").exists()
        # --resume: half the steps, then the rest, as the uninterrupted run bit for bit
        n = json.loads(one.stdout)["steps"]
        half = ["run", "allen_cahn.toml", "--quiet", "--out", "resumed.nc"]
        _simpar(folder, *half, "--steps", str(n // 2))
        r = _simpar(folder, *half, "--steps", str(n), "--resume")
        assert json.loads(r.stdout)["resumed_from"] == n // 2
        with h5py.File(folder / "resumed.nc") as f:  # (the cadence follows each --steps)
            assert int(f["step"][-1]) == n
            np.testing.assert_array_equal(f["u"][-1], u[-1])
        listed = _simpar(folder, "run", "--help").stdout
        assert "allen_cahn" in listed
        pngs = _simpar(folder, "plot", "single.nc").stdout.split()
        assert any(p.endswith("single_u.png") for p in pngs)
        assert all((folder / p).stat().st_size > 1000 for p in pngs)
    finally:
        subprocess.run(uninstall, capture_output=True, timeout=300)
