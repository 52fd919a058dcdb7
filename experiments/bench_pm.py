"""Particle-mesh and FFT benchmark cases shared by ``bench_fft.py`` and ``bench_gpu.py``.

Nothing here configures JAX (the callers choose the backend and the device count first).

- :func:`pm_case`: PM N-body (``simpar.particles.pm`` on one device: CIC deposit, real FFT
  Poisson, 4th-order gradient, CIC interpolation, leapfrog) of ``side^3`` particles on a
  lattice with Zel'dovich displacements, in particle-steps/s (best of ``repeats`` chunks of
  ``steps`` steps, after compilation).
- :func:`ring_within`: the all-pairs ring (``simpar.particles.nbody``, ``single``) at
  doubling N from 256 while one step takes at most a time budget (the PM step time): the
  largest N it can do in the same time per step, in particle-steps/s.
- :func:`fft_case`: one-device ``jnp.fft.rfftn``/``fftn`` of a float32/complex64 array, and,
  with more than one device, simpar's distributed transform (``sharded`` engine) on
  ``(n_devices,)``: seconds and GB/s (input + output bytes over the time).

Run on its own (CPU, small sizes, ~1 minute): ``python experiments/bench_pm.py``.
"""

from __future__ import annotations

import json
import math
import time


def _best(fn, repeats: int) -> float:
    fn()  # compile
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def pm_case(side: int, mesh: int, steps: int = 3, repeats: int = 2, dtype="float32") -> dict:
    """PM N-body of ``side^3`` particles on a ``mesh^3`` grid, one device.

    Returns:
      ``n``, ``mesh``, ``dtype``, ``seconds_per_step`` (s), ``particle_steps_per_s``.
    """
    import jax.numpy as jnp
    import numpy as np

    from simpar.parallel.pm_engine import PMEngine
    from simpar.particles import pm, pm_ics

    n = side**3
    box = (1.0, 1.0, 1.0)
    pos, vel = pm_ics.zeldovich((side,) * 3, box, seed=1, sigma=0.02, spectral_index=-3.0)
    eng = PMEngine("single", (mesh,) * 3, (1,), box)
    start, chunk = pm.make_program(eng)
    dt = np.dtype(dtype)
    params = pm.PMParams(jnp.asarray(0.02, dt), jnp.asarray(1 / (4 * math.pi), dt))
    state = start(*eng.distribute(pos.astype(dt), vel.astype(dt), np.full(n, 1 / n, dt)), params)
    k = jnp.asarray(steps)
    t = _best(lambda: chunk(state, params, k)[0].pos.block_until_ready(), repeats)
    return {
        "n": n,
        "mesh": [mesh] * 3,
        "dtype": str(dt),
        "steps": steps,
        "seconds_per_step": t / steps,
        "particle_steps_per_s": n * steps / t,
    }


def ring_within(budget_s: float, n_max: int = 1 << 20, steps: int = 2, dtype="float32") -> dict:
    """The all-pairs ring (one device) at N = 256, 512, ... while a step takes <= budget_s.

    Returns:
      ``largest_n`` (the last N within the budget; None if 256 already exceeds it), its
      ``particle_steps_per_s``, and every measured ``(n, seconds_per_step)``.
    """
    import numpy as np

    from simpar.particles.nbody import make_engine, make_params, plummer_sphere

    dt = np.dtype(dtype)
    eng = make_engine("single", 1)
    params = make_params(0.001, 1.0, 0.01, dtype=dt)
    tried, best = [], None
    n = 256
    while n <= n_max:
        pos, vel, mass = plummer_sphere(n, seed=1, dtype=dt)
        state = eng.init(pos, vel, mass, params)
        t = _best(lambda s=state: eng.run(s, params, steps)[0].pos.block_until_ready(), 1)
        per = t / steps
        tried.append({"n": n, "seconds_per_step": per})
        if per > budget_s:
            break
        best = {"largest_n": n, "particle_steps_per_s": n / per, "seconds_per_step": per}
        n *= 2
    return {**(best or {"largest_n": None}), "budget_s_per_step": budget_s, "measured": tried}


def fft_case(shape, repeats: int = 3) -> dict:
    """``jnp.fft.rfftn`` (float32) and ``fftn`` (complex64) of ``shape`` on one device, and
    simpar's ``sharded`` forward transforms on every device when there are several."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding

    from simpar.parallel import fft as F

    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    out = {"shape": list(shape), "single": {}, "distributed": {}}
    for kind, host in (("rfftn_float32", x), ("fftn_complex64", x.astype(np.complex64))):
        dev = jax.device_put(host, jax.devices()[0])
        f = jax.jit(jnp.fft.rfftn if kind.startswith("r") else jnp.fft.fftn)
        t = _best(lambda f=f, d=dev: f(d).block_until_ready(), repeats)
        nbytes = host.nbytes + f(dev).nbytes
        out["single"][kind] = {"seconds": t, "GBps": nbytes / t / 1e9}
        nd = len(jax.devices())
        if nd > 1:
            real = kind.startswith("r")
            try:
                plan = F.make_plan(shape, (nd,), real)
            except Exception as err:  # a mesh that does not divide: say so, keep going
                out["distributed"][kind] = {"error": str(err)}
                continue
            m = F.device_mesh(plan.mesh)
            xs = jax.device_put(host, NamedSharding(m, plan.spec(False)))
            g = jax.jit(F.global_ops(plan, m).forward)
            t = _best(lambda g=g, d=xs: g(d).block_until_ready(), repeats)
            out["distributed"][kind] = {"mesh": [nd], "seconds": t, "GBps": nbytes / t / 1e9}
    return out


if __name__ == "__main__":
    import os

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    pmr = pm_case(32, 32)
    print(json.dumps({"pm": pmr, "ring": ring_within(pmr["seconds_per_step"], 1 << 14),
                      "fft": fft_case((64, 64, 64))}, indent=1))  # fmt: skip
