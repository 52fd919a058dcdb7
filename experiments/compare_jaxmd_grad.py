"""simpar's LJ energy and force gradients with respect to epsilon and sigma against JAX-MD's,
at fixed positions (issue 30, item 2).

What it does: LJ at density 0.8442 (fcc ``--cells``, 5 5 5 = 500 atoms, jittered by
``--jitter`` sigma so no pair sits on the cutoff), cutoff 2.5, epsilon 1, sigma 1, float64.

* JAX-MD (``jax_md.energy.lennard_jones``, the bare 4 eps ((s/r)^12 - (s/r)^6) kernel,
  summed over all pairs by ``jax_md.smap.pair`` with ``space.periodic``) truncated hard at
  r = 2.5 with no energy shift: simpar's ``potentials.lennard_jones(cutoff=2.5)`` and
  LAMMPS's ``lj/cut 2.5``. JAX-MD's own ``lennard_jones_pair`` is a different potential: it
  multiplies by a smooth switch from ``r_onset * sigma`` (2.0) to ``r_cutoff * sigma`` (2.5),
  both scaled by sigma, so its sigma derivative has a switch term; the script reports its
  difference too (``jaxmd_lennard_jones_pair_smooth``), to show that the match is not trivial.
* simpar on ``single`` (one neighbour list, ``forces.pair_forces``) and on each decomposed
  ``--engines`` x ``--meshes`` through ``differentiable.rollout(n_steps=0)`` (the pure run
  that lays the atoms out on the devices, exchanges ghosts and evaluates the pair energy at
  the start positions). Forces are ``-d E / d x`` (``jax.grad`` through the decomposed run,
  ghosts included); their parameter derivatives ``d F / d(epsilon, sigma)`` float[N, 3, 2]
  are forward-over-reverse (``jax.jacfwd`` of ``jax.grad``).

Prints one JSON object: per engine and mesh, the largest relative difference to JAX-MD of the
energy, the forces, ``dE/d(eps, sigma)`` and ``dF/d(eps, sigma)`` (``max |a - b| / max |b|``
per quantity). Exits 2 with one line when ``jax_md`` is not installed (it is not a simpar
dependency: ``pip install jax-md``; 0.2.29 imports on jax 0.10.2 with flax 0.12).

Run (2 CPU cores, loaded, defaults: about 2 min):
    python experiments/compare_jaxmd_grad.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time

from simpar.benchmark import ScriptParser, int_in, mesh_arg


def parse_args(argv=None):
    ap = ScriptParser(prog="compare_jaxmd_grad.py", description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int_in(3, 12), nargs=3, default=[5, 5, 5])
    ap.add_argument("--jitter", type=float, default=0.05)
    ap.add_argument("--engines", default="shard_map,pmap")
    ap.add_argument("--meshes", type=mesh_arg, nargs="+", default=[(2, 2, 2), (8,)])
    ap.add_argument("--devices", type=int_in(0, 4096), default=8)
    args = ap.parse_args(argv)
    args.engines = args.engines.split(",")
    bad = [e for e in args.engines if e not in ("pmap", "shard_map")]
    if bad:
        ap.error(f"--engines: unknown {bad}; allowed: pmap, shard_map")
    return args


def main(argv=None):
    args = parse_args(argv)
    if importlib.util.find_spec("jax_md") is None:
        print("compare_jaxmd_grad.py: jax_md is not installed (pip install jax-md); "
              "it is not a simpar dependency", file=sys.stderr)  # fmt: skip
        return 2
    from simpar.benchmark import start_jax

    jax = start_jax(args.devices)
    import dataclasses

    import jax.numpy as jnp
    import numpy as np
    from jax_md import energy as jmd_energy
    from jax_md import smap as jmd_smap
    from jax_md import space as jmd_space

    from simpar.particles import neighbors, potentials
    from simpar.particles.differentiable import lj_start, rollout
    from simpar.particles.forces import pair_forces

    t0 = time.perf_counter()
    rc = 2.5
    spc, r, v = lj_start(args.cells, jitter=args.jitter)
    r = jnp.asarray(spc_wrap(spc, r))
    box = jnp.asarray(spc.box)
    theta = jnp.asarray([1.0, 1.0])  # (epsilon, sigma)

    # JAX-MD: the bare LJ kernel truncated hard at rc, no shift; and its smooth-switch wrapper
    disp, _ = jmd_space.periodic(box)

    def jmd_truncated(dr, sigma, epsilon, **kw):
        # the i == j diagonal (dr = 0) masked before the kernel, so no 0 * inf in the
        # parameter derivatives (JAX-MD's nan_to_num fixes the value, not the gradient)
        inside = (dr > 0) & (dr < rc)
        e = jmd_energy.lennard_jones(jnp.where(inside, dr, rc), sigma, epsilon)
        return jnp.where(inside, e, 0.0)

    def jmd_energy_fn(th, x):
        e = jmd_smap.pair(jmd_truncated, jmd_space.canonicalize_displacement_or_metric(disp),
                          sigma=th[1], epsilon=th[0])  # fmt: skip
        return e(x)

    def jmd_smooth_fn(th, x):
        return jmd_energy.lennard_jones_pair(disp, sigma=th[1], epsilon=th[0], r_onset=2.0,
                                             r_cutoff=2.5)(x)  # fmt: skip

    def terms(efn):
        f = lambda th, x: -jax.grad(efn, argnums=1)(th, x)  # noqa: E731
        return {"energy": efn(theta, r), "forces": f(theta, r),
                "dE": jax.grad(efn)(theta, r), "dF": jax.jacfwd(f)(theta, r)}  # fmt: skip

    ref = jax.tree.map(np.asarray, jax.jit(lambda: terms(jmd_energy_fn))())

    def rel(a):
        return {k: float(np.max(np.abs(np.asarray(a[k]) - ref[k])) / np.max(np.abs(ref[k])))
                for k in ref}  # fmt: skip

    pot = potentials.lennard_jones(cutoff=rc)

    def with_theta(th):
        return dataclasses.replace(pot, params={"epsilon": th[0], "sigma": th[1]})

    # simpar single: one neighbour list over all atoms, the engines' force kernel
    valid = jnp.ones(r.shape[0], bool)
    spec = neighbors.size_list(spc, r, valid, cutoff=rc, skin=0.3, capacity_factor=1.5)
    nb = neighbors.build(spec, spc, r, valid)

    def single_energy(th, x):
        return pair_forces(with_theta(th), spc, x, nb.idx, block=None)[1]

    out = {"atoms": int(r.shape[0]), "cutoff": rc, "jitter": args.jitter, "dtype": "float64",
           "jaxmd_magnitudes": {k: float(np.max(np.abs(x))) for k, x in ref.items()},
           "max_rel_diff_vs_jaxmd": {}}  # fmt: skip
    out["max_rel_diff_vs_jaxmd"]["single"] = rel(jax.jit(lambda: terms(single_energy))())
    out["max_rel_diff_vs_jaxmd"]["jaxmd_lennard_jones_pair_smooth"] = rel(
        jax.jit(lambda: terms(jmd_smooth_fn))()
    )
    # simpar decomposed: the pure run with no steps, ghosts exchanged on the devices
    for engine in args.engines:
        for mesh in args.meshes:
            run = rollout(engine, spc, pot, r, v, n_steps=0, dt=0.005, mesh=mesh)

            def dom_energy(th, x, run=run):
                return run(with_theta(th), x, v).e_pair

            out["max_rel_diff_vs_jaxmd"][f"{engine}_{'x'.join(map(str, mesh))}"] = rel(
                jax.jit(lambda f=dom_energy: terms(f))()
            )
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out), flush=True)
    return 0


def spc_wrap(spc, r):
    from simpar.particles.space import wrap

    return wrap(spc, r)


if __name__ == "__main__":
    sys.exit(main())
