"""Inverse problem through a decomposed run: recover the diffusivity from frames of a heat run.

What it shows: ``jax.grad`` goes through ``engine.place -> engine.advance -> engine.gather`` on
the decomposed engines (``shard_map`` and ``pmap`` on a 2x4 mesh of 8 devices, ``sharded``), so
the misfit between simulated and observed frames can be minimised by gradient descent with the
physics written once, for one block. The "observations" are frames of a run with the true
diffusivity plus 1% noise; the descent starts at half the truth and works on log D with
Barzilai-Borwein step lengths (plain gradient steps whose length is the secant of the last two).

Memory (``--memory``): the gradient of a long run keeps every step's intermediates for the
backward pass. ``jax.checkpoint`` around each chunk of steps (a ``lax.scan`` over chunks) keeps
only the chunk boundaries and recomputes one chunk at a time in the backward pass. The script
prints XLA's buffer assignment for the compiled gradient (``memory_analysis()``: temporary
bytes per device) of a 2,000-step run with and without it.

Run (2 CPU cores; measured 26 s CPU for the three engines, ``--memory`` 18 s CPU):
    python experiments/inverse_heat.py                               # shard_map, pmap, sharded
    python experiments/inverse_heat.py --engines single --devices 1
    python experiments/inverse_heat.py --memory --steps 2000 --chunk 50
On N accelerators pass ``--mesh`` with N devices and ``--devices 0``. Bad arguments exit 2
with one line before JAX compiles anything.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from simpar.benchmark import ScriptParser, int_in, mesh_arg
from simpar.grid import heat
from simpar.grid.boundary import Dirichlet, Neumann
from simpar.grid.domain import Domain
from simpar.parallel.engines import make_engine

TRUE_D = 1.0


def make_problem(shape=(32, 32), diffusion_number=0.2, dtype="float64"):
    """A heat problem in a unit plate: insulated side walls, cold bottom, hot top.

    Returns:
      ``(model, params, u0)``: the heat model, its params at the true diffusivity
      (``TRUE_D``; ``dt`` set for the given diffusion number) and the initial field
      ``(nx, ny)`` (two Gaussian spots).
    """
    dom = Domain(tuple(shape), (1.0, 1.0), dtype)
    model = heat.make_model(2, ((Neumann(), Neumann()), (Dirichlet(0.0), Dirichlet(1.0))))
    dt = diffusion_number / (TRUE_D * sum(1 / h**2 for h in dom.dx))
    params = heat.make_params(dom, TRUE_D, dt)
    u0 = heat.gaussian(dom, (0.3, 0.4), 0.08, 2.0) + heat.gaussian(dom, (0.7, 0.6), 0.12, -1.0)
    return model, params, u0.astype(dtype)


def simulate(engine, params, u0, frames: int, every: int):
    """The frames ``u(k * every * dt)``, ``k = 1..frames``, stacked ``(frames, nx, ny)``.

    Differentiable in ``params`` and ``u0`` (``place``/``gather`` are traceable).
    """
    state = engine.place({"u": u0})
    out = []
    for _ in range(frames):
        state = engine.advance(state, params, every)
        out.append(engine.gather(state)["u"])
    return jnp.stack(out)


def observations(engine, params, u0, frames=4, every=10, noise=0.01, seed=0):
    """Frames of the true run plus Gaussian noise of ``noise`` times their RMS."""
    clean = np.asarray(simulate(engine, params, u0, frames, every))
    rng = np.random.default_rng(seed)
    return clean + noise * np.sqrt(np.mean(clean**2)) * rng.standard_normal(clean.shape)


def misfit(engine, params, u0, data, every):
    """``loss(diffusivity)``: mean squared difference between simulated and observed frames."""

    def loss(diffusivity):
        p = dict(params, diffusivity=jnp.asarray(diffusivity, params["dt"].dtype))
        sim = simulate(engine, p, u0, data.shape[0], every)
        return jnp.mean((sim - data) ** 2)

    return loss


def recover(value_and_grad, d0: float, iters: int = 30, tol: float = 1e-10):
    """Gradient descent on ``log D`` with Barzilai-Borwein step lengths.

    Args:
      value_and_grad: ``D -> (loss, dloss/dD)``, e.g. ``jax.jit(jax.value_and_grad(loss))``.
      d0: starting diffusivity.

    Returns:
      ``(D, history)`` with one ``(D, loss)`` pair per iteration.
    """

    def f(x):  # in log D: d loss / d log D = D d loss / d D
        val, g = value_and_grad(math.exp(x))
        return float(val), float(g) * math.exp(x)

    x = math.log(d0)
    val, g = f(x)
    step = 0.1 / abs(g)  # first move: 0.1 in log D
    history = [(d0, val)]
    for _ in range(iters):
        x_new = x - step * g
        val, g_new = f(x_new)
        history.append((math.exp(x_new), val))
        dx, dg = x_new - x, g_new - g
        x, g = x_new, g_new
        if abs(dx) < tol or dg == 0:
            break
        step = abs(dx / dg)
    return math.exp(x), history


def chunked_loss(engine, params, u0, target, steps: int, chunk: int, remat: bool):
    """``loss(diffusivity)`` after ``steps`` steps taken as a ``lax.scan`` over chunks.

    With ``remat`` each chunk is wrapped in ``jax.checkpoint``: the backward pass keeps the
    ``steps // chunk`` chunk inputs and recomputes one chunk's intermediates at a time.
    """
    if steps % chunk:
        raise ValueError(f"steps {steps} is not a multiple of chunk {chunk}")

    def loss(diffusivity):
        p = dict(params, diffusivity=diffusivity)

        def body(state, _):
            return engine.advance(state, p, chunk), None

        body_fn = jax.checkpoint(body) if remat else body
        state, _ = jax.lax.scan(body_fn, engine.place({"u": u0}), None, length=steps // chunk)
        return jnp.mean((engine.gather(state)["u"] - target) ** 2)

    return loss


def gradient_memory(engine, params, u0, steps=2000, chunk=50, run=True):
    """Temporary bytes per device of the compiled 2,000-step gradient, with and without remat.

    Returns:
      ``{"remat": bytes, "plain": bytes, "field_bytes_per_device": bytes}`` and, with
      ``run``, ``"grad_remat"``, ``"grad_plain"`` (the two gradients, which must agree).
    """
    d = params["diffusivity"]
    target = np.zeros_like(u0)
    out = {"field_bytes_per_device": u0.nbytes // len(engine.devices)}
    for remat in (True, False):
        g = jax.jit(jax.grad(chunked_loss(engine, params, u0, target, steps, chunk, remat)))
        compiled = g.lower(d).compile()
        key = "remat" if remat else "plain"
        out[key] = int(compiled.memory_analysis().temp_size_in_bytes)
        if run:
            out[f"grad_{key}"] = float(compiled(d))
    return out


ENGINES = (
    "single",
    "pmap",
    "shard_map",
    "sharded",
)  # simpar.parallel.blocks.ENGINES (JAX not imported yet)
MAX_DEVICES = 4096


def _mesh(text):
    """``mesh_arg`` (the command line's rule), limited to the 2-D grid's 1 or 2 axes."""
    mesh = mesh_arg(text)
    if len(mesh) > 2:
        raise argparse.ArgumentTypeError(f"must be 1 or 2 positive sizes (AxB), got {text!r}")
    return mesh


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked before JAX compiles anything (exit 2 with one line)."""
    ap = ScriptParser(prog="inverse_heat.py", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--engines", nargs="+", choices=ENGINES, default=["shard_map", "pmap", "sharded"]
    )
    ap.add_argument("--mesh", type=_mesh, default=(2, 4), help="device grid, e.g. 2x4")
    ap.add_argument(
        "--devices",
        type=int_in(0, MAX_DEVICES),
        default=8,
        help="virtual CPU devices (CPU only; 0: leave JAX's count)",
    )
    ap.add_argument("--shape", type=int_in(4, 65536), nargs=2, default=[32, 32])
    ap.add_argument("--memory", action="store_true", help="checkpointed long-run gradient")
    ap.add_argument("--steps", type=int_in(1), default=2000, help="--memory: steps")
    ap.add_argument("--chunk", type=int_in(1), default=50, help="--memory: steps per chunk")
    args = ap.parse_args(argv)
    mesh, shape = args.mesh, args.shape
    engines = args.engines[:1] if args.memory else args.engines
    if any(e != "single" for e in engines):
        if args.devices and math.prod(mesh) > args.devices:
            ap.error(
                f"--mesh {args.mesh} needs {math.prod(mesh)} devices; --devices is {args.devices}"
            )
        for n, m, axis in zip(shape, mesh, "xy", strict=False):
            if n % m or n // m < 2:
                ap.error(
                    f"--shape {shape[0]} {shape[1]}: {axis} has {n} cells, not a "
                    f"multiple of {m} blocks of >= 2 (the halo): change --mesh or --shape"
                )
    if args.memory and args.steps % args.chunk:
        ap.error(f"--steps {args.steps} must be a multiple of --chunk {args.chunk}")
    # the gradient keeps the intermediates of every step (without remat) in float64
    from simpar.errors import ConfigError
    from simpar.memory import check_fits

    steps = args.steps if args.memory else 40
    try:
        check_fits(
            3 * steps * shape[0] * shape[1] * 8 + (256 << 20),
            "--shape",
            f"a gradient through {steps} steps of {shape[0]} x {shape[1]} float64",
            "reduce --shape or --steps",
        )
    except ConfigError as err:
        ap.error(str(err))
    return args


def main(argv=None):
    """Recover D on each engine (or, with ``--memory``, measure the gradient's memory) and
    print one JSON line per engine (see the module docstring)."""
    args = parse_args(argv)
    if args.devices:  # affects the CPU backend only
        jax.config.update("jax_num_cpu_devices", args.devices)
    jax.config.update("jax_enable_x64", True)
    mesh = args.mesh
    if any(e != "single" for e in args.engines) and math.prod(mesh) > len(jax.devices()):
        print(
            f"inverse_heat.py: error: --mesh needs {math.prod(mesh)} devices; JAX has "
            f"{len(jax.devices())} {jax.default_backend()} devices",
            file=sys.stderr,
        )
        sys.exit(2)
    model, params, u0 = make_problem(tuple(args.shape))
    if args.memory:
        e = make_engine(args.engines[0], model, u0.shape, mesh, 2)
        t0 = time.perf_counter()
        mem = gradient_memory(e, params, u0, args.steps, args.chunk)
        mem["wall_s"] = round(time.perf_counter() - t0, 1)
        mem.update(engine=e.name, mesh=list(mesh), steps=args.steps, chunk=args.chunk)
        print(json.dumps(mem))
        return
    for name in args.engines:
        e = make_engine(name, model, u0.shape, None if name == "single" else mesh, 2)
        data = observations(e, params, u0)
        t0 = time.perf_counter()
        vg = jax.jit(jax.value_and_grad(misfit(e, params, u0, data, 10)))
        d, hist = recover(vg, 0.5 * TRUE_D)
        print(
            json.dumps(
                {
                    "engine": name,
                    "recovered_D": d,
                    "true_D": TRUE_D,
                    "rel_error": abs(d - TRUE_D) / TRUE_D,
                    "iterations": len(hist) - 1,
                    "final_loss": hist[-1][1],
                    "noise_floor": float(np.mean((data - simulate(e, params, u0, 4, 10)) ** 2)),
                    "wall_s": round(time.perf_counter() - t0, 2),
                    "log10_loss": [round(math.log10(v), 2) for _, v in hist],
                }
            )
        )


if __name__ == "__main__":
    main()
