"""Benchmark on whatever accelerator JAX finds: heat, LBM, LJ and N-body in one run, one JSON.

What it shows, per workload, the throughput of the ``single`` engine (and, when JAX sees more
than one device, ``shard_map`` and ``sharded`` on all of them at halo 1) next to the device's
memory-bandwidth roofline (``simpar.benchmark.memory_bandwidth``; on a GPU the jitted
in-place and out-of-place passes measure device memory):

- heat 2-D 5-point float32, periodic and with walls on x: M cell-updates/s; roofline
  bandwidth / 8 bytes (one float32 read and written per update);
- LBM D2Q9 float32, periodic and lid-driven cavity: MLUPS; roofline bandwidth / 72 bytes;
- Lennard-Jones (LAMMPS in.lj: fcc 0.8442, T 1.44, rc 2.5) float32: atom-steps/s, with the
  exact neighbour policy and with in.lj's ``every 20 check no``;
- N-body all-pairs float32: pair interactions/s;
- FFT (``bench_pm.fft_case``): 3-D real-to-complex 256^3 float32 and 2-D 1024^2 (rfftn and
  complex fftn) on one device, and simpar's distributed transform on every device: seconds
  and GB/s;
- PM N-body (``bench_pm.pm_case``): 10^6 particles (100^3) on a 128^3 mesh, float32, one
  device: particle-steps/s.

It reuses the functions of ``bench_heat.py``, ``bench_lbm.py``, ``bench_md.py`` and
``bench_nbody.py``; each case is compiled and run once, then timed (best of ``--repeats``).
The default sizes are meant for a GPU and take well under 5 minutes there (most of it
compilation). ``--small`` shrinks every case to a smoke check that runs on CPU in about a
minute; its figures say nothing about speed.

Run:
    python experiments/bench_gpu.py            # on the GPU machine
    python experiments/bench_gpu.py --small    # CPU smoke check
Prints one JSON object on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

from simpar.benchmark import environment  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

SIZES = {  # (heat n, lbm n, LJ fcc cells per side, N-body particles, steps per chunk)
    "full": (8192, 2048, 20, 32768, 50),
    "small": (128, 64, 4, 512, 4),
}


def _log(**kw):
    print(json.dumps(kw), file=sys.stderr, flush=True)


FFT_PM_SIZES = {  # (3-D r2c side, 2-D side, PM particles per side, PM mesh side)
    "full": (256, 1024, 100, 128),
    "small": (32, 64, 16, 16),
}


def fft_and_pm_cases(small: bool, repeats: int) -> tuple[list, dict]:
    """The FFT cases (3-D and 2-D) and the PM N-body case (``bench_pm``)."""
    import bench_pm

    cube, square, side, mesh = FFT_PM_SIZES["small" if small else "full"]
    ffts = [bench_pm.fft_case((cube,) * 3, repeats), bench_pm.fft_case((square,) * 2, repeats)]
    _log(fft=ffts)
    pm = bench_pm.pm_case(side, mesh, steps=2 if small else 10, repeats=repeats)
    _log(pm=pm)
    return ffts, pm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes: a CPU smoke check")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    import bench_heat
    import bench_lbm
    import bench_md
    import bench_nbody
    import jax
    import numpy as np

    from simpar.benchmark import memory_bandwidth
    from simpar.grid import lbm_config
    from simpar.particles.nbody import make_params, plummer_sphere

    n_heat, n_lbm, cells, n_body, steps = SIZES["small" if args.small else "full"]
    ndev = len(jax.devices())
    bw = memory_bandwidth(nbytes=(32 if args.small else 1024) * 2**20, repeats=args.repeats)
    device_bw = max(bw["jax_pass_GBps"], bw["jax_copy_GBps"]) * 1e9
    _log(memory_bandwidth_GBps=bw)

    def engines():
        yield "single", 1
        if ndev > 1:
            yield "shard_map", ndev
            yield "sharded", ndev

    out_heat = []
    for walls in (False, True):
        model, state, params, _ = bench_heat.heat_setup(n_heat, walls)
        for engine, nd in engines():
            for halo in (1, 4) if engine == "single" else (1,):
                r = bench_heat.bench_case(
                    model, state, params, engine, nd, halo, steps, args.repeats
                )
                r["case"] = "walls_x" if walls else "periodic"
                r["roofline_ratio"] = r["Mcell_updates_per_s"] * 1e6 * 8 / device_bw
                out_heat.append(r)
                _log(heat=r)

    out_lbm = []
    rng = np.random.default_rng(0)
    u0 = [0.01 * rng.standard_normal((n_lbm, n_lbm)) for _ in range(2)]
    for cavity in (False, True):
        walls = (("wall", "wall"), ("wall", "lid")) if cavity else (("periodic",) * 2,) * 2
        setup = lbm_config.lattice_setup(
            (n_lbm, n_lbm),
            walls=walls,
            viscosity=0.05,
            u_lid=0.1 if cavity else 0.0,
            dtype="float32",
            u0=u0,
        )
        for engine, nd in engines():
            r = bench_lbm.bench_case(setup, engine, (nd,), 1, steps, args.repeats)
            r["case"] = "cavity" if cavity else "periodic"
            r["roofline_ratio"] = r["mlups"] * 1e6 * 72 / device_bw
            out_lbm.append(r)
            _log(lbm=r)

    lj = bench_md.bench(np.dtype("float32"), cells, steps, args.repeats, 0.3)
    lj = {k: v for k, v in lj.items() if not isinstance(v, dict)}
    _log(lj=lj)
    # LAMMPS's shipped policy (neigh_modify every 20 check no) beside the exact default
    lj20 = bench_md.bench(np.dtype("float32"), cells, steps, args.repeats, 0.3, 20, False)
    lj20 = {k: v for k, v in lj20.items() if not isinstance(v, dict)}
    _log(lj_every20_check_no=lj20)

    pos, vel, mass = plummer_sphere(n_body, seed=1, dtype=np.dtype("float32"))
    nb_params = make_params(0.001, 1.0, 0.01, dtype=np.dtype("float32"))
    out_nbody = [
        bench_nbody.bench_engine(e, nd, pos, vel, mass, nb_params, steps, args.repeats)
        for e, nd in engines()
    ]
    _log(nbody=out_nbody)
    out_fft, out_pm = fft_and_pm_cases(args.small, args.repeats)

    print(
        json.dumps(
            {
                "benchmark": "bench_gpu",
                "sizes": "small (smoke check)" if args.small else "full",
                "backend": jax.default_backend(),
                "device_kind": jax.devices()[0].device_kind,
                "devices": ndev,
                **environment(),
                "host": platform.node(),
                "cpu_count": os.cpu_count(),
                "memory_bandwidth_GBps": bw,
                "device_roofline_GBps": device_bw / 1e9,
                "heat2d_float32": {"grid": [n_heat, n_heat], "results": out_heat},
                "lbm_d2q9_float32": {"grid": [n_lbm, n_lbm], "results": out_lbm},
                "lj_float32": lj,
                "lj_float32_every20_check_no": lj20,
                "nbody_float32": {"n": n_body, "results": out_nbody},
                "fft": out_fft,
                "pm_nbody_float32": out_pm,
                "wall_s": time.perf_counter() - t_start,
            },
            indent=1,
            default=float,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
