"""Issue 28 item 4: the defects a new user met, one test each (fast tier)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: JAX not configured, so 64-bit JAX is off."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("JAX_ENABLE_X64", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


KERNELS_F64 = """
import json, math, warnings
warnings.simplefilter("error")  # a float64 truncated to float32 warns: make it fail
import jax, numpy as np
assert not jax.config.jax_enable_x64
from simpar.errors import ConfigError
from simpar.grid import poisson, spectral_ns, spectral_ns3d
from simpar.parallel.pm_engine import PMEngine

out = {}
def refused(name, fn):
    try:
        fn()
        out[name] = "ran"
    except ConfigError as e:
        out[name] = [e.key, str(e)]

x = np.arange(16) * (2 * math.pi / 16)
f64 = np.sin(x)[:, None] * np.ones((16, 16))
refused("ns_params", lambda: spectral_ns.make_params(0.01, 0.01, dtype="float64"))
refused("ns3d_params", lambda: spectral_ns.make_params(
    0.01, 0.01, length=(1.0, 1.0, 1.0), dtype="float64"))
refused("ns_state", lambda: spectral_ns.to_state(f64, poisson.local_ops((16, 16))))
p3 = spectral_ns.make_params(0.01, 0.01, length=(1.0, 1.0, 1.0))
u3 = spectral_ns3d.taylor_green((8, 8, 8), (1.0, 1.0, 1.0))
refused("ns3d_state", lambda: spectral_ns3d.to_state(u3, p3, poisson.local_ops((8, 8, 8))))
refused("poisson", lambda: poisson.solve(f64, (0.1, 0.1)))
eng = PMEngine("single", (8, 8, 8))
pos = np.random.default_rng(0).random((16, 3))
refused("pm", lambda: eng.distribute(pos, np.zeros((16, 3)), np.ones(16)))
# float32 (and no dtype) still run, in float32
out["f32"] = sorted({
    str(spectral_ns.make_params(0.01, 0.01).nu.dtype),
    str(poisson.solve(f64.astype(np.float32), (0.1, 0.1)).dtype),
    str(eng.distribute(pos.astype(np.float32), np.zeros((16, 3), np.float32),
                       np.ones(16, np.float32))[0].dtype),
})
print(json.dumps(out))
"""


def test_float64_kernels_refused_without_x64():
    """spectral_ns / spectral_ns3d / poisson / PM: float64 with x64 off is a ConfigError."""
    r = _python(KERNELS_F64)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    keys = {
        "ns_params": "dtype",
        "ns3d_params": "dtype",
        "ns_state": "spectral_ns.to_state(omega)",
        "ns3d_state": "spectral_ns3d.to_state(u)",
        "poisson": "poisson.solve(f)",
        "pm": "PMEngine.distribute(pos)",
    }
    for name, key in keys.items():
        assert out[name] != "ran", name
        got, msg = out[name]
        assert got == key
        assert 'jax.config.update("jax_enable_x64", True)' in msg and "float32" in msg
    assert out["f32"] == ["float32"]
