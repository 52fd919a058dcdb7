"""No traceback or abort under limits or extreme sizes, and the smaller points (issue 31, items
4 and 6).

- ``--devices``/``--mesh`` beyond what RLIMIT_AS (or RLIMIT_NPROC) lets XLA create threads
  for are refused up front (exit 2), not aborted by absl's ``pthread_create() failed``;
- ``system.density = 1e-9`` (a cell grid beyond int32) and ``1e300`` exit 2 naming
  ``system.density`` with readable numbers;
- ``simpar info --grid 100000x100000`` draws the layout without allocating the field;
- a NaN or a wrong dtype in a spectral checkpoint names ``--resume``, the checkpoint file and
  the dataset; PM memory refusals name the size key that drives them;
- HDF5 loads no filter plugin while simpar reads a crafted file.
"""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_untrusted import _cli

from simpar import memory
from simpar.cli import main
from simpar.errors import ConfigError
from simpar.io import checkpoint

ROOT = Path(__file__).resolve().parents[1]
HEAT = str(ROOT / "experiments/heat2d.toml")
LJ = str(ROOT / "experiments/lj_melt.toml")
TG = str(ROOT / "experiments/taylor_green.toml")
PM = str(ROOT / "experiments/pm_plane_wave.toml")
ULIMIT_V = 8_000_000 * 1024  # ``ulimit -v 8000000`` of the issue


def _main(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, out, err


@pytest.mark.parametrize(
    "args,key",
    [
        (("run", HEAT, "--devices", "4096"), "--devices"),
        (("run", HEAT, "--show-layout", "--engine", "pmap", "--mesh", "4096"), "--mesh"),
        pytest.param(("info", "--devices", "1024"), "--devices", marks=pytest.mark.slow),
    ],
)
def test_devices_beyond_the_address_space_limit_are_refused_up_front(tmp_path, args, key):
    r = _cli(*args, "--out", str(tmp_path / "x.nc"), rlimit_as=ULIMIT_V) if args[0] == "run" \
        else _cli(*args, rlimit_as=ULIMIT_V)  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    line = r.stderr.strip()
    assert "\n" not in line and key in line and "RLIMIT_AS" in line and "at most" in line, line
    assert not (tmp_path / "x.nc").exists()


def test_device_limit_from_the_limits(monkeypatch):
    """The estimate: about two threads per device (one beyond 256), each reserving a stack."""
    import resource

    real = resource.getrlimit
    gib = memory.GIB
    assert memory.device_limit(8) is None or real(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY

    def limits(as_, nproc):
        def get(which):
            if which == resource.RLIMIT_AS:
                return (as_, as_)
            if which == resource.RLIMIT_NPROC:
                return (nproc, nproc)
            if which == resource.RLIMIT_STACK:
                return (8 << 20, resource.RLIM_INFINITY)
            return real(which)

        monkeypatch.setattr(resource, "getrlimit", get)

    inf = resource.RLIM_INFINITY
    monkeypatch.setattr(memory, "_vm_size", lambda: gib // 2)
    limits(ULIMIT_V, inf)
    most, why = memory.device_limit(4096)
    # 7.63 GiB - 0.5 (Python + JAX) - 2 (XLA's client) = 5.13 GiB of 8 MiB stacks: 656 threads
    assert most == 400 and "RLIMIT_AS" in why
    assert memory.device_limit(400) is None and memory.device_limit(401) is not None
    limits(inf, inf)
    assert memory.device_limit(4096) is None
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(memory, "_user_threads", lambda: 100)
    limits(inf, 1000)
    most, why = memory.device_limit(1000)
    assert most == 580 and "RLIMIT_NPROC" in why  # 1000 - 100 - 64 = 836 = 580 + 256 threads
    with pytest.raises(ConfigError, match=r"--mesh: 1000 devices .*at most 580 fit"):
        memory.check_device_count(1000, "--mesh", 4096)


@pytest.mark.parametrize("density", ["1e-9", "1e300"])
def test_lj_extreme_density_names_system_density(tmp_path, capsys, density):
    out = tmp_path / "x.h5md"
    code, stdout, err = _main(capsys, "run", LJ, "--set", f"system.density={density}",
                              "--out", out)  # fmt: skip
    assert code == 2 and stdout == "" and not out.exists(), err
    line = err.strip()
    assert "\n" not in line and "invalid input: system.density:" in line, line
    assert "system.cells" not in line and not re.search(r"\d{12}", line), line


def test_info_draws_a_huge_grid_without_allocating_it():
    r = _cli("info", "--mesh", "2x4", "--grid", "100000x100000", rlimit_as=ULIMIT_V)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "grid 100000x100000 cells on device mesh 2x4" in r.stdout
    assert "x 50000:100000, y 75000:100000" in r.stdout  # the last block


@pytest.fixture(scope="module")
def spectral_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tg") / "tg.nc"
    args = ["run", TG, "--set", "grid.shape=[16,16]", "--set", "output.every=2", "--quiet"]
    assert main([*args, "--steps", "4", "--out", str(out)]) == 0
    return args, out


@pytest.mark.parametrize("how", ["nan", "dtype"])
def test_spectral_resume_names_the_checkpoint_and_dataset(spectral_run, tmp_path, capsys, how):
    args, src = spectral_run
    out = tmp_path / src.name
    shutil.copy(src, out)
    ck = checkpoint.checkpoint_path(out)
    shutil.copy(checkpoint.checkpoint_path(src), ck)
    with h5py.File(ck, "a") as f:
        re_ = f["state/vorticity_hat_re"]
        a = re_[()]
        if how == "nan":
            a[1, 1] = np.nan
            re_[...] = a
        else:
            del f["state/vorticity_hat_re"]
            f["state/vorticity_hat_re"] = a.astype(np.float32)
    frames = h5py.File(out, "r")["time"].shape[0]
    code, _, err = _main(capsys, *args, "--steps", "8", "--out", out, "--resume")
    line = err.strip()
    assert code == 2 and "\n" not in line, err
    assert line.startswith("simpar: invalid input: --resume:") and "initial" not in line, line
    assert str(ck) in line and "/state/vorticity_hat_re" in line, line
    assert ("non-finite" if how == "nan" else "float32") in line, line
    assert h5py.File(out, "r")["time"].shape[0] == frames


@pytest.mark.parametrize(
    "override,key",
    [("particles.lattice=[2000,2000,2000]", "particles.lattice"),
     ("physics.pm_mesh=[4000,4000,4000]", "physics.pm_mesh")],
)  # fmt: skip
def test_pm_memory_refusal_names_the_key_that_drives_it(tmp_path, capsys, override, key):
    out = tmp_path / "x.h5md"
    code, _, err = _main(capsys, "run", PM, "--set", override, "--out", out)
    assert code == 2 and f"invalid input: {key}: the run needs about" in err, err
    assert not out.exists()


_EVIL = """
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void hit(void) {
  FILE *f = fopen(getenv("SIMPAR_TEST_MARKER"), "w");
  if (f) { fputs("loaded", f); fclose(f); }
}
int H5PLget_plugin_type(void) { return 0; }
const void *H5PLget_plugin_info(void) { return NULL; }
"""

_READER = """
import sys, h5py, numpy as np
from simpar.io import checkpoint
from simpar.errors import ConfigError
path, marker = sys.argv[1:]
try:
    checkpoint.load(path, expected={"u": ((16, 16), np.dtype("float32"))})
    print("read")
except ConfigError as err:
    print("refused:", err)
import os
print("plugin loaded" if os.path.exists(marker) else "no plugin")
with h5py.File(path, "r") as f:  # plain h5py, loading on: the plugin IS loaded
    try:
        f["state/u"][()]
    except OSError:
        pass
print("plugin loaded" if os.path.exists(marker) else "no plugin")
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a plugin")
def test_no_hdf5_plugin_is_loaded_for_a_crafted_filter(tmp_path):
    """A checkpoint whose dataset names filter 40000 (chunks written as filtered): plain
    h5py searches HDF5_PLUGIN_PATH and runs the code it finds; simpar refuses the dataset
    naming the filter and loads nothing."""
    from h5py import h5d, h5p, h5s, h5t, h5z

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (tmp_path / "evil.c").write_text(textwrap.dedent(_EVIL))
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(plugins / "libevil.so"),
                    str(tmp_path / "evil.c")], check=True)  # fmt: skip
    ck = tmp_path / "x.nc.ckpt"
    checkpoint.save(ck, {"u": np.zeros((16, 16), np.float32)}, 4, "[model]\nname='heat'\n", "heat")
    with h5py.File(ck, "a") as f:
        del f["state/u"]
        dcpl = h5p.create(h5p.DATASET_CREATE)
        dcpl.set_chunk((16, 16))
        dcpl.set_filter(40000, h5z.FLAG_OPTIONAL)
        ds = h5d.create(f["state"].id, b"u", h5t.py_create(np.dtype("float32")),
                        h5s.create_simple((16, 16)), dcpl=dcpl)  # fmt: skip
        ds.write_direct_chunk((0, 0), np.zeros((16, 16), np.float32).tobytes(), filter_mask=0)
    marker = tmp_path / "marker"
    env = dict(os.environ, PYTHONPATH=str(ROOT), HDF5_PLUGIN_PATH=str(plugins),
               SIMPAR_TEST_MARKER=str(marker))  # fmt: skip
    r = subprocess.run([sys.executable, "-c", _READER, str(ck), str(marker)], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 3, r.stdout + r.stderr
    assert lines[0].startswith("refused:") and "/state/u" in lines[0] and "40000" in lines[0]
    assert lines[1] == "no plugin"
    assert lines[2] == "plugin loaded"  # the check is real: HDF5 would have run the code
