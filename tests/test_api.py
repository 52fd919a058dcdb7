"""The package used from Python as a new user meets it: precision, summaries, discoverability."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (JAX not yet configured: x64 off by default)."""
    e = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    e.pop("JAX_ENABLE_X64", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=e,
        cwd=ROOT,
        timeout=300,
    )


PRECISION = """
import json, sys, warnings
from pathlib import Path
warnings.simplefilter("error")  # a truncated float64 request would warn: make it fail
import jax, numpy as np
assert not jax.config.jax_enable_x64
import simpar
from simpar.errors import ConfigError
from simpar.particles import lattice, md, nbody, potentials, space

out = {}
# kernels without a dtype: JAX's default float, never a truncated float64 request
pot = potentials.lennard_jones()
out["kernels"] = sorted({str(pot.epsilon.dtype), str(potentials.morse().alpha.dtype),
    str(space.periodic(np.ones(3)).box.dtype), str(space.free([2.0, 2.0, 2.0]).box.dtype),
    str(md.make_params(0.005, 1.0).dt.dtype), str(nbody.make_params(0.01).G.dtype),
    str(lattice.cubic_lattice("fcc", 0.8442, (2, 2, 2))[0].dtype),
    str(lattice.maxwell_boltzmann(jax.random.PRNGKey(0), 8, 1.0).dtype)})
# an explicit float64 request is refused with the fix
try:
    potentials.lennard_jones(dtype="float64")
except ConfigError as e:
    out["kernel_f64"] = str(e)
# every config-taking entry point refuses float64, naming the key and the fix; no file
tmp = Path(sys.argv[1])
cases = {
    "heat": ("experiments/heat2d.toml", ["grid.dtype='float64'", "grid.shape=[16,16]"]),
    "lj": ("experiments/lj_melt.toml", ["system.dtype='float64'"]),
    "nbody": ("experiments/nbody_plummer.toml", ["particles.dtype='float64'"]),
}
for name, (cfg, sets) in cases.items():
    path = tmp / (name + (".nc" if name == "heat" else ".h5md"))
    try:
        simpar.run_file(cfg, sets, out=str(path), progress=False)
        out[name] = "ran"
    except ConfigError as e:
        out[name] = [e.key, str(e), path.exists()]
# float32 stays float32, labelled float32
s = simpar.run_file("experiments/heat2d.toml", ["grid.shape=[16,16]", "time.dt=1e-4"],
                    out=str(tmp / "f32.nc"), steps=4, progress=False)
import h5py
with h5py.File(tmp / "f32.nc") as f:
    out["f32"] = [str(f["u"].dtype), f.attrs["dtype"].tobytes().decode()]
# `simpar info` reports x64 as a run uses it
from simpar.cli import main
import io, contextlib
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    main(["info"])
out["info_x64"] = json.loads(buf.getvalue())["x64"]
# ... and with x64 on (as the command line sets it) float64 runs in float64
s = simpar.run_file("experiments/heat2d.toml", ["grid.shape=[16,16]", "grid.dtype='float64'",
                    "time.dt=1e-4"], out=str(tmp / "f64.nc"), steps=4, progress=False)
with h5py.File(tmp / "f64.nc") as f:
    out["f64"] = [str(f["u"].dtype), f.attrs["dtype"].tobytes().decode()]
print(json.dumps(out))
"""


def test_float64_is_refused_without_x64_and_kernels_never_truncate(tmp_path):
    r = _python(PRECISION.replace("sys.argv[1]", repr(str(tmp_path))))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["kernels"] == ["float32"]
    assert "jax_enable_x64" in out["kernel_f64"]
    for name, key in (("heat", "grid.dtype"), ("lj", "system.dtype"), ("nbody", "particles.dtype")):
        got_key, msg, exists = out[name]
        assert got_key == key and not exists
        assert 'jax.config.update("jax_enable_x64", True)' in msg and "float32" in msg
    assert out["f32"] == ["float32", "float32"]
    assert out["info_x64"] is True
    assert out["f64"] == ["float64", "float64"]
