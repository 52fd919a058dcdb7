"""Benchmark: one-device FFT against NumPy and SciPy, and what the distributed FFT moves.

What it shows:
  1. ``jnp.fft.fftn`` (jitted) against ``numpy.fft.fftn`` and ``scipy.fft.fftn`` (one worker,
     and every core) on one device at 256^3 and 1024^2 complex64: the implementations take
     turns round after round (interleaved), the best of the rounds is kept, and ratios are
     ``time(other) / time(jnp)`` (> 1: jnp is faster).
  2. The distributed transposes of ``simpar.parallel.fft`` (``sharded`` engine, which compiles
     the same all-to-alls as ``shard_map``) on meshes (8,) and (2, 4) at 256^3 complex64 and
     real float32, read from the compiled HLO (nothing is run): all-to-alls per transform,
     bytes each device sends per transform, and that figure over one local block (1.0 per
     transpose means each transpose moves exactly one block).
  3. The time of the distributed forward transform at 64^3 on those meshes next to ``single``
     (8 *virtual* CPU devices share the cores one after another: overhead, not speed-up).
  4. PM N-body at 10^6 particles (100^3 lattice, 128^3 mesh, float32) on one device against
     the all-pairs ring at the largest N (doubling from 256) whose step fits in the PM step
     time, both in particle-steps/s (``bench_pm.py``; ``--small``: 32^3 particles, 32^3 mesh).
     Measured on the shared 2-core box: PM 0.28 s/step = 3.5 M particle-steps/s; the ring
     reached N = 8,192 in 0.16 s/step = 52 k particle-steps/s (16,384: 0.80 s): 69x.

Run (about 2-3 minutes on 2 CPU cores; ``--small``: 64^3 and 256^2, a smoke check in ~1 min):
    python experiments/bench_fft.py
    python experiments/bench_fft.py --small --rounds 2
Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

from simpar.benchmark import environment  # noqa: E402

if "--gpu" not in sys.argv:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before JAX starts

import jax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if "--gpu" not in sys.argv:
    jax.config.update("jax_num_cpu_devices", 8)

import bench_pm  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.fft  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from simpar.parallel import fft as F  # noqa: E402
from simpar.parallel.hlo import collectives  # noqa: E402


def _args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="64^3 and 256^2 (smoke check)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (best kept)")
    ap.add_argument("--hlo-size", type=int, default=256, help="cube side for the HLO bytes")
    ap.add_argument("--dist-size", type=int, default=64, help="cube side for the timed runs")
    ap.add_argument("--gpu", action="store_true", help="use the default backend")
    return ap.parse_args()


def _interleaved(fns: dict, rounds: int) -> dict[str, float]:
    """Best wall time (s) of each ``fn()`` over ``rounds``, taking turns every round."""
    best = {k: math.inf for k in fns}
    for fn in fns.values():  # warm-up: compilation, plan caches
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def single_device(shape, rounds: int) -> dict:
    """``jnp.fft.fftn`` against NumPy and SciPy on one complex64 array of ``shape``."""
    rng = np.random.default_rng(0)
    host = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    dev = jax.device_put(host, jax.devices()[0])
    jf = jax.jit(jnp.fft.fftn)
    cores = os.cpu_count() or 1
    fns = {
        "jnp": lambda: jf(dev).block_until_ready(),
        "numpy": lambda: np.fft.fftn(host),
        "scipy_1_worker": lambda: scipy.fft.fftn(host),
        f"scipy_{cores}_workers": lambda: scipy.fft.fftn(host, workers=cores),
    }
    ref = np.fft.fftn(host.astype(np.complex128))
    err = float(np.abs(np.asarray(jf(dev)) - ref).max() / np.abs(ref).max())
    t = _interleaved(fns, rounds)
    return {
        "shape": list(shape),
        "dtype": "complex64",
        "seconds": {k: round(v, 5) for k, v in t.items()},
        "ratio_other_over_jnp": {k: round(v / t["jnp"], 3) for k, v in t.items() if k != "jnp"},
        "jnp_rel_error_vs_float64": err,
        "numpy_output_dtype": str(np.fft.fftn(host[..., :2]).dtype),
    }


def transposes(n: int, mesh, real: bool) -> dict:
    """All-to-alls and bytes per device of one forward transform of an ``n^3`` field."""
    plan = F.make_plan((n, n, n), mesh, real)
    m = F.device_mesh(plan.mesh)
    dtype = jnp.float32 if real else jnp.complex64
    arg = jax.ShapeDtypeStruct(plan.shape, dtype, sharding=NamedSharding(m, plan.spec(False)))
    text = jax.jit(F.global_ops(plan, m).forward).lower(arg).compile().as_text()
    found = collectives(text)
    block = math.prod(plan.block_shape(True)) * 8  # complex64 Fourier block, bytes
    sent = sum(c.nbytes for c in found)
    return {
        "mesh": list(mesh),
        "kind": "rfftn float32" if real else "fftn complex64",
        "grid": [n, n, n],
        "fourier_split": [list(s) for s in plan.fourier_split],
        "all_to_all": sum(c.op == "all-to-all" for c in found),
        "other_collectives": sum(c.op != "all-to-all" for c in found),
        "bytes_per_device": sent,
        "bytes_over_fourier_block": round(sent / block, 3),
    }


def distributed_time(n: int, mesh, rounds: int) -> dict:
    """Forward transform of an ``n^3`` complex64 field on ``mesh`` (sharded) against single."""
    plan = F.make_plan((n, n, n), mesh)
    m = F.device_mesh(plan.mesh)
    rng = np.random.default_rng(1)
    host = (rng.standard_normal(plan.shape) + 1j * rng.standard_normal(plan.shape)).astype(
        np.complex64
    )
    x = jax.device_put(host, NamedSharding(m, plan.spec(False)))
    one = jax.device_put(host, jax.devices()[0])
    fd = jax.jit(F.global_ops(plan, m).forward)
    fs = jax.jit(jnp.fft.fftn)
    t = _interleaved(
        {
            "single": lambda: fs(one).block_until_ready(),
            "sharded": lambda: fd(x).block_until_ready(),
        },
        rounds,
    )
    return {
        "mesh": list(mesh),
        "grid": [n, n, n],
        "seconds": {k: round(v, 5) for k, v in t.items()},
        "sharded_over_single": round(t["sharded"] / t["single"], 3),
    }


def pm_against_ring(small: bool) -> dict:
    """PM N-body on one device against the ring at the largest N in the same step time."""
    side, mesh = (32, 32) if small else (100, 128)
    pm = bench_pm.pm_case(side, mesh, steps=3, repeats=2)
    ring = bench_pm.ring_within(pm["seconds_per_step"], n_max=1 << (14 if small else 18))
    ratio = None
    if ring.get("largest_n"):
        ratio = round(pm["particle_steps_per_s"] / ring["particle_steps_per_s"], 1)
    return {"pm": pm, "ring": ring, "pm_over_ring_particle_steps": ratio}


def main():
    a = _args()
    cube, square = ((64,) * 3, (256,) * 2) if a.small else ((256,) * 3, (1024,) * 2)
    hlo_n = min(a.hlo_size, 64) if a.small else a.hlo_size
    dist_n = min(a.dist_size, 32) if a.small else a.dist_size
    out = {
        "benchmark": "fft",
        **environment(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "backend": jax.default_backend(),
        "devices": len(jax.devices()),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "rounds": a.rounds,
        "single_device": [single_device(cube, a.rounds), single_device(square, a.rounds)],
        "transposes": [
            transposes(hlo_n, mesh, real) for mesh in [(8,), (2, 4)] for real in (False, True)
        ],
        "distributed_time": [distributed_time(dist_n, mesh, a.rounds) for mesh in [(8,), (2, 4)]],
        "pm_nbody_vs_ring": pm_against_ring(a.small),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
