"""simpar's pseudo-spectral 2-D Navier-Stokes side by side with jax-cfd's, from the same field.

What it shows: ``simpar.grid.spectral_ns`` (integrating-factor RK4, 2/3 rule) and jax-cfd's
``spectral.equations.NavierStokes2D`` with ``crank_nicolson_rk4`` (Crank-Nicolson for the
viscous term, Carpenter-Kennedy RK4 for advection, 2/3 filter on advection) start from the same
vorticity (decaying turbulence from a seed, or Kolmogorov flow: force ``F sin(k_f y)`` and
linear drag) on a ``2 pi`` periodic square and run to time ``T`` in float64. Printed as one
JSON object: the relative L2 difference of the vorticity at every frame, both energy curves,
and each solver against itself at ``dt / 2`` (its own time error). jax-cfd runs twice: with its
own 2/3 filter, which keeps rows ``m_x = -43 .. 41`` at 128^2 (``int(2/3 n) // 2`` on each
side, not symmetric), and with simpar's ``3 |m| < N`` mask (rows ``-42 .. 42``) put in its
place. Energies and enstrophies of both are computed the same way, on the host from the
gathered vorticity (Parseval).

Measured (128^2, decaying, nu = 1e-3, dt = 5e-3, T = 2): with the same mask the vorticities
differ by 5.5e-6 (relative L2), the size of each scheme's own time error (simpar 8.3e-6,
jax-cfd 3.1e-6 against dt / 2); with jax-cfd's own filter by 9.4% (at nu = 5e-3: 3.4e-7 and
0.35%): the filters' one-row difference at the cut-off, amplified by the turbulence, not the
time schemes.

jax-cfd is not a dependency of simpar. Install it in a separate environment to compare::

    python3.11 -m venv .venv-cfd && .venv-cfd/bin/pip install "jax==0.10.2" jax-cfd
    PYTHONPATH=. .venv-cfd/bin/python experiments/validate_spectral_ns.py

Without it the script reports simpar's numbers only and says jax-cfd is absent.

Run (2 CPU cores, 128^2, T = 2: about 30 s with jax-cfd, 10 s without)::

    python experiments/validate_spectral_ns.py                          # decaying, single
    python experiments/validate_spectral_ns.py --case kolmogorov
    python experiments/validate_spectral_ns.py --engine pmap --devices 8 --mesh 2x4
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from simpar.benchmark import mesh_arg

CASES = {
    # nu, drag, forcing amplitude, forcing wavenumber, dt, T
    "decaying": dict(nu=1e-3, drag=0.0, amp=0.0, k_f=4, dt=5e-3, t_end=2.0),
    "kolmogorov": dict(nu=1e-3, drag=0.1, amp=1.0, k_f=4, dt=5e-3, t_end=2.0),
}


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=sorted(CASES), default="decaying")
    ap.add_argument("--n", type=int, default=128, help="cells per side (default 128)")
    ap.add_argument("--dt", type=float, help="time step (default per case: 5e-3)")
    ap.add_argument("--t-end", type=float, help="final time T (default 2)")
    ap.add_argument("--nu", type=float, help="viscosity (default 1e-3)")
    ap.add_argument("--frames", type=int, default=10, help="frames after t = 0 (default 10)")
    ap.add_argument("--seed", type=int, default=0, help="initial field seed (default 0)")
    ap.add_argument("--engine", default="single", help="single, pmap, shard_map or sharded")
    ap.add_argument("--devices", type=int, help="virtual CPU devices (before JAX starts)")
    ap.add_argument(
        "--mesh", type=mesh_arg, default=(1,), help="device mesh, e.g. 8 or 2x4 (default 1)"
    )
    ap.add_argument("--no-refine", action="store_true", help="skip the dt / 2 self-checks")
    return ap.parse_args(argv)


def energy_enstrophy(w):
    """``(E, Z)`` of a vorticity ``(n, n)`` on a ``2 pi`` square (host, float64)."""
    import numpy as np

    n0, n1 = w.shape
    wh = np.fft.rfft2(w)
    mx = np.fft.fftfreq(n0, 1.0 / n0)[:, None]
    my = np.arange(n1 // 2 + 1)[None, :]
    k2 = mx * mx + my * my
    weight = np.where((my == 0) | (2 * my == n1), 1.0, 2.0)
    a = weight * np.abs(wh) ** 2 / (2.0 * (n0 * n1) ** 2)
    return float(np.sum(np.where(k2 > 0, a / np.where(k2 > 0, k2, 1), 0))), float(np.sum(a))


def run_simpar(w0, c, dt, frames, spf, engine, mesh):
    """Frames ``(frames + 1, n, n)`` of vorticity and the wall time per step (after compile)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    from simpar.grid import spectral_ns as S
    from simpar.parallel import fft as F

    shape = w0.shape
    plan, ops = F.make_ops(engine, shape, mesh, real=True)
    p = S.make_params(c["nu"], dt, (2 * math.pi,) * 2, c["drag"], c["amp"], c["k_f"])
    if engine in ("pmap", "shard_map"):
        to_state = F.blockwise(lambda w: S.to_state(w, ops), plan, engine, False, True)
        chunk = F.blockwise(lambda w: S.advance(w, p, ops, spf), plan, engine, True, True)
        to_phys = F.blockwise(lambda w: S.to_physical(w, ops), plan, engine, True, False)
        if engine == "pmap":
            x = F.split_blocks(w0, plan, False)
            gather = lambda b: F.join_blocks(b, plan, False)  # noqa: E731
        else:
            x, gather = w0, np.asarray
    else:
        to_state = jax.jit(lambda w: S.to_state(w, ops))
        chunk = jax.jit(lambda w: S.advance(w, p, ops, spf))
        to_phys = jax.jit(lambda w: S.to_physical(w, ops))
        x, gather = w0, np.asarray
        if engine == "sharded":
            x = jax.device_put(w0, NamedSharding(F.device_mesh(plan.mesh), plan.spec(False)))
    st = to_state(x)
    jax.block_until_ready(chunk(st))  # compile
    out, wall = [gather(to_phys(st))], 0.0
    for _ in range(frames):
        t = time.perf_counter()
        st = jax.block_until_ready(chunk(st))
        wall += time.perf_counter() - t
        out.append(gather(to_phys(st)))
    return np.stack(out), wall / (frames * spf)


def run_jax_cfd(w0, c, dt, frames, spf, same_filter=False):
    """The same with jax-cfd 0.2.1 (one device); ``None`` when it is not installed.

    ``same_filter``: replace jax-cfd's 2/3 brick-wall filter (rows ``-43 .. 41`` at 128^2) by
    simpar's (``3 |m| < N``, rows ``-42 .. 42``), so that only the time schemes differ."""
    try:
        import jax_cfd.base as cfd
        from jax_cfd.spectral import equations, time_stepping
    except ImportError:
        return None
    import jax
    import jax.numpy as jnp
    import numpy as np

    n = w0.shape[0]
    grid = cfd.grids.Grid((n, n), domain=((0, 2 * math.pi), (0, 2 * math.pi)))
    forcing = None
    if c["amp"]:
        forcing = lambda g: cfd.forcings.kolmogorov_forcing(  # noqa: E731
            g, scale=c["amp"], k=c["k_f"], offsets=((0, 0), (0, 0))
        )
    eq = equations.NavierStokes2D(c["nu"], grid, drag=c["drag"], smooth=True, forcing_fn=forcing)
    if same_filter:
        m = np.fft.fftfreq(n, 1.0 / n)[:, None]
        eq.filter_ = jnp.asarray((3 * np.abs(m) < n) & (3 * np.arange(n // 2 + 1) < n), float)
    chunk = jax.jit(cfd.funcutils.repeated(time_stepping.crank_nicolson_rk4(eq, dt), spf))
    st = jnp.fft.rfftn(jnp.asarray(w0))
    jax.block_until_ready(chunk(st))
    out, wall = [w0], 0.0
    for _ in range(frames):
        t = time.perf_counter()
        st = jax.block_until_ready(chunk(st))
        wall += time.perf_counter() - t
        out.append(np.asarray(jnp.fft.irfftn(st)))
    return np.stack(out), wall / (frames * spf)


def _rel(a, b):
    import numpy as np

    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main(argv=None) -> int:
    args = _args(argv)
    mesh = args.mesh
    import jax

    if args.devices:
        jax.config.update("jax_num_cpu_devices", args.devices)
    jax.config.update("jax_enable_x64", True)
    import numpy as np

    from simpar.errors import ConfigError
    from simpar.grid import spectral_ns as S

    c = dict(CASES[args.case])
    for key in ("dt", "t_end", "nu"):
        if getattr(args, key) is not None:
            c[key] = getattr(args, key)
    steps = round(c["t_end"] / c["dt"])
    if steps % args.frames:
        print(
            f"--frames: {args.frames} does not divide the {steps} steps (T / dt)", file=sys.stderr
        )
        return 2
    spf = steps // args.frames
    shape = (args.n, args.n)
    if args.case == "decaying":
        w0 = S.random_turbulence(shape, seed=args.seed, peak_wavenumber=4.0, energy=0.5)
    else:  # Kolmogorov: a weak random perturbation of rest, spun up by the force
        w0 = S.random_turbulence(shape, seed=args.seed, peak_wavenumber=4.0, energy=0.01)
    times = [i * spf * c["dt"] for i in range(args.frames + 1)]
    try:
        ours, ours_s = run_simpar(w0, c, c["dt"], args.frames, spf, args.engine, mesh)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    report = {
        "case": args.case,
        "grid": list(shape),
        "nu": c["nu"],
        "drag": c["drag"],
        "forcing": {"amplitude": c["amp"], "wavenumber": c["k_f"]},
        "dt": c["dt"],
        "T": c["t_end"],
        "engine": args.engine,
        "mesh": list(mesh),
        "time": times,
        "simpar": {
            "scheme": "ifrk4",
            "energy": [energy_enstrophy(w)[0] for w in ours],
            "enstrophy": [energy_enstrophy(w)[1] for w in ours],
            "s_per_step": ours_s,
        },
    }
    if not args.no_refine:
        half, _ = run_simpar(w0, c, c["dt"] / 2, args.frames, 2 * spf, args.engine, mesh)
        report["simpar"]["rel_l2_vs_dt_half"] = _rel(ours[-1], half[-1])
    theirs = run_jax_cfd(w0, c, c["dt"], args.frames, spf)
    if theirs is None:
        report["jax_cfd"] = "absent (pip install jax-cfd in a separate venv to compare)"
    else:
        import jax_cfd

        cfd, cfd_s = theirs
        same, _ = run_jax_cfd(w0, c, c["dt"], args.frames, spf, same_filter=True)
        report["jax_cfd"] = {
            "version": getattr(jax_cfd, "__version__", "?"),
            "scheme": "crank_nicolson_rk4",
            "energy": [energy_enstrophy(w)[0] for w in cfd],
            "enstrophy": [energy_enstrophy(w)[1] for w in cfd],
            "s_per_step": cfd_s,
        }
        rel = lambda a, b: [_rel(x, y) for x, y in zip(a[1:], b[1:], strict=True)]  # noqa: E731
        # jax-cfd's own brick-wall filter, then simpar's 2/3 mask put into jax-cfd
        report["rel_l2_vorticity"] = rel(ours, cfd)
        report["rel_l2_vorticity_same_filter"] = rel(ours, same)
        report["rel_l2_vorticity_at_T"] = report["rel_l2_vorticity"][-1]
        report["rel_l2_vorticity_at_T_same_filter"] = report["rel_l2_vorticity_same_filter"][-1]
        if not args.no_refine:
            same_half, _ = run_jax_cfd(w0, c, c["dt"] / 2, args.frames, 2 * spf, True)
            report["jax_cfd"]["rel_l2_vs_dt_half_same_filter"] = _rel(same[-1], same_half[-1])
            report["rel_l2_at_T_same_filter_both_dt_half"] = _rel(half[-1], same_half[-1])
    print(json.dumps(report, indent=1))
    return 0 if np.all(np.isfinite(ours[-1])) else 1


if __name__ == "__main__":
    sys.exit(main())
