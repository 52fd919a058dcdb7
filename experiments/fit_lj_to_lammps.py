"""Fit LJ epsilon and sigma to a LAMMPS target (g(r) and pressure) on a decomposed engine by
reweighting (DiffTRe, Thaler & Zavadlav 2021) and optax (issue 30, item 5).

Target: ``data/reference/lammps_lj_target/target.json`` (LAMMPS ``lj/cut 2.5``, epsilon 1,
sigma 1, 500 atoms, density 0.8442, Langevin T 1.44; its input, command and block files sit
beside it): g(r) (50 bins to 2.5) and the virial pressure ``sum r.f / 3V`` (the kinetic part
is left out: LAMMPS counts 3N - 3 degrees of freedom, simpar's Langevin thermalises 3N).

Method: from the wrong start ``--start`` (0.8, 1.1), each outer iteration samples ``--samples``
configurations ``--every`` steps apart (after ``--equil`` steps) with a Langevin run (kT 1.44,
gamma 1, dt 0.005) of ``--engine`` on ``--mesh`` at the current parameters. Per sample it
keeps g(r) (parameter-free) and the pair sums ``S6 = sum r^-6``, ``S12 = sum r^-12`` over the
pairs inside the cutoff (fixed at 2.5, as in LAMMPS), so that the LJ energy and virial of
every sample are exact closed forms of (epsilon, sigma): ``U = 4 eps (s^12 S12 - s^6 S6)``,
``W = 4 eps (12 s^12 S12 - 6 s^6 S6)``. The loss ``mean((<g> - g_t)^2) + w_p (<W>/3V -
P_t)^2`` with the canonical reweighting ``w_i ~ exp(-(U_theta - U_sampled) / kT)`` is
plus ``w_u (<U>/N - u_t)^2`` (LAMMPS's potential energy per atom; without it the loss
has a shallow valley near epsilon 0.75, sigma 0.99 where g(r) and the pressure alone stay
within the sampling noise of 500 atoms) is differentiated by ``jax.grad`` and minimised by ``optax.adam`` (step ``--lr`` decaying geometrically to ``--lr-final`` over the outer
iterations) for up to ``--inner`` steps
while the effective sample size stays above ``--ess`` of the samples; then the engine
samples again at the new parameters. The reported fit is the mean of the parameters at the
last ``--average`` resamplings (the sampling noise averages out).

Prints one JSON object: ``fitted`` and ``target`` (epsilon, sigma), ``rel_error``, the loss
history (one entry per outer iteration: the loss at its start, at its sampled parameters),
the parameter history, engine, mesh, atoms and the wall time.

Status (work in progress, 2026-12-06, 2 loaded CPU cores, load ~8): the 1 % / 2 % targets are
NOT reached yet. Measured: without the energy term, 30 outer x 40 samples (lr 0.02 -> 0.002),
shard_map 2x2x2, 507 s: fitted epsilon 0.824, sigma 0.993 (sigma to 0.7 %, epsilon 18 % off,
still climbing out of the valley). With the energy term, ``--quick`` (16 x 60): see the report;
epsilon first drifts down (the virial pressure, far too high at sigma 1.1, dominates the first
Adam steps) and each step is limited by the effective sample size of 500 atoms (one or two
Adam steps per sampling until near the optimum). Next: whiten the loss by the target's
standard errors, start the epsilon step from the energy term, and more samples per outer.
    python experiments/fit_lj_to_lammps.py --quick
    python experiments/fit_lj_to_lammps.py --engine pmap --mesh 8
Bad arguments exit 2 with one line before JAX starts.
"""

from __future__ import annotations

import json
import os
import sys
import time

from simpar.benchmark import ScriptParser, int_in

TARGET = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data",
                      "reference", "lammps_lj_target", "target.json")  # fmt: skip


def parse_args(argv=None):
    ap = ScriptParser(prog="fit_lj_to_lammps.py", description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["single", "pmap", "shard_map"], default="shard_map")
    ap.add_argument("--mesh", default="2x2x2")
    ap.add_argument("--devices", type=int_in(0, 4096), default=8)
    ap.add_argument("--start", type=float, nargs=2, default=[0.8, 1.1])
    ap.add_argument("--outer", type=int_in(1, 1000), default=30)
    ap.add_argument("--inner", type=int_in(1, 10000), default=200)
    ap.add_argument("--equil", type=int_in(0), default=300)
    ap.add_argument("--samples", type=int_in(5), default=100)
    ap.add_argument("--every", type=int_in(1), default=10)
    ap.add_argument("--ess", type=float, default=0.3)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--lr-final", type=float, default=0.002)
    ap.add_argument("--pressure-weight", type=float, default=1.0)
    ap.add_argument("--energy-weight", type=float, default=1.0)
    ap.add_argument("--average", type=int_in(1, 100), default=8)
    ap.add_argument("--seed", type=int_in(0), default=7)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="fewer iterations and samples (2 %% accuracy, under 15 min)",
    )
    ap.add_argument("--target", default=TARGET)
    args = ap.parse_args(argv)
    try:
        args.mesh = tuple(int(m) for m in args.mesh.lower().split("x"))
    except ValueError:
        ap.error(f"--mesh must look like 2x2x2, got {args.mesh!r}")
    if not 0 < args.ess < 1:
        ap.error(f"--ess must be in (0, 1), got {args.ess}")
    if min(args.start) <= 0:
        ap.error(f"--start must be two positive numbers (epsilon sigma), got {args.start}")
    if not os.path.exists(args.target):
        ap.error(f"--target: no file {args.target!r}")
    if args.quick:
        args.outer, args.samples, args.average = min(args.outer, 16), min(args.samples, 60), 5
    return args


def pair_sums(space, positions, cutoff):
    """``(S6, S12)`` float[S]: ``sum_{i<j, r<cutoff} r^-6`` and ``r^-12`` of each sample."""
    import jax
    import jax.numpy as jnp

    from simpar.particles.space import displacement

    @jax.jit
    def one(r):
        n = r.shape[0]
        d = displacement(space, r[:, None, :], r[None, :, :])
        r2 = jnp.sum(d * d, axis=-1) + jnp.eye(n) * 4 * cutoff**2
        inside = r2 < cutoff**2
        i6 = jnp.where(inside, 1.0 / jnp.where(inside, r2, 1.0) ** 3, 0.0)
        return 0.5 * jnp.sum(i6), 0.5 * jnp.sum(i6 * i6)

    return jax.lax.map(one, jnp.asarray(positions))


def main(argv=None):
    args = parse_args(argv)
    from simpar.benchmark import start_jax

    jax = start_jax(args.devices)
    import jax.numpy as jnp
    import numpy as np
    import optax

    from simpar.particles import md, potentials, reweight
    from simpar.particles.decomposed_sim import make_domain_simulation
    from simpar.particles.differentiable import lj_start

    with open(args.target) as f:
        tgt = json.load(f)
    sysd = tgt["system"]
    kt, rc = float(sysd["kt"]), float(sysd["cutoff"])
    g_t = jnp.asarray(tgt["rdf"]["g"])
    p_t = float(tgt["virial_pressure"]["mean"])
    u_t = float(tgt["potential_energy_per_atom"]["mean"])
    bins, r_max = int(tgt["rdf"]["bins"]), float(tgt["rdf"]["r_max"])
    spc, r0, v0 = lj_start([5, 5, 5], density=float(sysd["density"]), kt=kt)
    n = r0.shape[0]
    vol = float(np.prod(np.asarray(spc.box)))

    def sample(theta, r, v, key):
        pot = potentials.lennard_jones(epsilon=float(theta[0]), sigma=float(theta[1]),
                                       cutoff=rc)  # fmt: skip
        kw = dict(dt=0.005, ensemble="langevin", kt=kt, gamma=1.0, key=key)
        if args.engine == "single":
            sim = md.make_simulation(spc, pot, r, v, **kw)
        else:
            sim = make_domain_simulation(args.engine, args.mesh, spc, pot, r, v, **kw)
        sim.advance(args.equil)
        pos = reweight.sample(sim, args.samples, args.every)
        snap = sim.snapshot()
        return pos, np.asarray(snap["position"]), np.asarray(snap["velocity"])

    def observables(theta, s6, s12):
        eps, sig = theta[0], theta[1]
        u = 4 * eps * (sig**12 * s12 - sig**6 * s6)
        w = 4 * eps * (12 * sig**12 * s12 - 6 * sig**6 * s6)
        return u, w

    def loss_fn(theta, theta_s, s6, s12, g):
        u, w = observables(theta, s6, s12)
        u0, _ = observables(theta_s, s6, s12)
        logw = -(u - u0) / kt
        wt = jax.nn.softmax(logw)
        ess = 1.0 / jnp.sum(wt**2) / wt.shape[0]
        gm = jnp.einsum("s,sk->k", wt, g)
        pv = jnp.sum(wt * w) / (3 * vol)
        um = jnp.sum(wt * u) / n
        loss = jnp.mean((gm - g_t) ** 2) + args.pressure_weight * (pv - p_t) ** 2
        return loss + args.energy_weight * (um - u_t) ** 2, ess

    vg = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
    opt = optax.adam(args.lr)  # the step decays geometrically to --lr-final at the end
    decay = (args.lr_final / args.lr) ** (1.0 / max(args.outer - 1, 1))
    theta = jnp.asarray(args.start, jnp.float64)
    state = opt.init(theta)
    r, v = np.asarray(r0), np.asarray(v0)
    hist, thetas = [], []
    t0 = time.perf_counter()
    for it in range(args.outer):
        theta_s = theta
        pos, r, v = sample(theta_s, r, v, jax.random.PRNGKey(args.seed + it))
        s6, s12 = pair_sums(spc, pos, rc)
        _, g = reweight.rdf(spc, pos, bins, r_max)
        g = jnp.asarray(g)
        thetas.append([float(x) for x in theta_s])
        for k in range(args.inner):
            (val, ess), grad = vg(theta, theta_s, s6, s12, g)
            if k == 0:
                hist.append(float(val))
            if float(ess) < args.ess:
                break
            upd, state = opt.update(grad, state, theta)
            theta = optax.apply_updates(theta, upd * decay**it)
        print(json.dumps({"iteration": it, "loss": hist[-1], "theta": thetas[-1],
                          "inner_steps": k, "wall_s": round(time.perf_counter() - t0, 1)}),
              file=sys.stderr, flush=True)  # fmt: skip
    fit = np.mean(np.asarray(thetas[-args.average :]), axis=0)
    target = {"epsilon": float(sysd["epsilon"]), "sigma": float(sysd["sigma"])}
    fitted = {"epsilon": float(fit[0]), "sigma": float(fit[1])}
    out = {"fitted": fitted, "target": target,
           "rel_error": {k: abs(fitted[k] - target[k]) / target[k] for k in target},
           "loss_history": hist, "theta_history": thetas, "engine": args.engine,
           "mesh": list(args.mesh), "atoms": n, "outer": args.outer, "samples": args.samples,
           "every": args.every, "equil": args.equil, "quick": args.quick,
           "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
