"""Data-parallel training on simulation output: a small CNN that steps a heat field forward.

What it shows: a simpar run writes frames ``u(t)`` of a periodic heat problem (random initial
field) to its netCDF file; training pairs ``(u(t), u(t + k dt))`` are read back with h5py, each
process reading only its own slice of the pairs (multi-process ready). A two-layer
convolutional network ``u -> u + conv(tanh(conv(u)))`` (periodic padding) learns the k-step map
with Adam (optax). One training step, two data-parallel versions:

- ``pmap``: the global batch reshaped to ``(jax.local_device_count(), per_device, ...)``,
  ``in_axes=(None, None, 0, 0)`` (parameters and optimiser state replicated, batch split),
  ``out_axes=(None, None, None)``, gradients and loss averaged with ``lax.pmean`` over the
  axis name;
- sharding: the same step without ``pmean``, ``jax.jit`` with the batch on a
  ``NamedSharding(mesh, P("batch"))`` and everything else replicated; XLA inserts the
  all-reduce.

Both equal a one-device step on the whole batch after 20 steps to round-off (tested). The
script trains on the first 2/3 of the frames and reports the error of a rollout (the network
applied to its own output) on the held-out last third against the simulation.

Run (2 CPU cores, measured 35 s CPU for 600 steps; needs optax: ``pip install "simpar[ml]"``):
    python experiments/train_surrogate.py                    # 8 virtual CPU devices
    python experiments/train_surrogate.py --steps 2000 --version pmap --overwrite
Bad arguments exit 2 with one line before JAX compiles anything; ``--data PATH`` (where the
simulated frames go; the script writes them itself, and creates the default folder
``data/runs``) is never replaced without ``--overwrite``.
On N accelerators pass ``--devices N`` equal to the number of devices you have.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import h5py
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from simpar.benchmark import ScriptParser, int_in


# --------------------------------------------------------------------------------- data
def simulate(path, shape=(32, 32), frames=60, every=5, seed=0, overwrite=False) -> Path:
    """Run simpar's heat model (periodic box, random initial field, float64) into ``path``.

    ``frames + 1`` frames, ``every`` steps apart, at diffusion number 0.1 per step. An
    existing ``path`` is replaced only with ``overwrite`` (else ``ConfigError``, exit 2).
    """
    from simpar import config as cfgmod
    from simpar.run import run_config

    dx2 = (1.0 / shape[0]) ** 2
    data = {
        "model": {"name": "heat"},
        "grid": {"shape": list(shape), "length": [1.0, 1.0], "dtype": "float64"},
        "boundary": {"x": "periodic", "y": "periodic"},
        "physics": {"diffusivity": 1.0},
        "initial": {"kind": "random", "seed": seed},
        "time": {"dt": 0.05 * dx2, "steps": frames * every},
        "output": {"every": every, "path": str(path), "checkpoint": False},
    }
    run_config(data, cfgmod.dumps(data), overwrite=overwrite, progress=False)
    return Path(path)


def read_pairs(path, lag=1, first=0, last=None, process_index=None, process_count=None):
    """This process's slice of the pairs ``(u[i], u[i + lag])`` for ``first <= i < last``.

    Each process reads only the frames of its own contiguous slice of pairs from the file
    (h5py slicing), so a dataset larger than one host's memory can be spread over hosts.

    Returns:
      ``(x, y)``: ``(n_local, ny, nx, 1)`` float64 arrays (file layout ``time, y, x``).
    """
    pi = jax.process_index() if process_index is None else process_index
    pc = jax.process_count() if process_count is None else process_count
    with h5py.File(path, "r") as f:
        u = f["u"]
        n_frames = f["time"].shape[0]
        last = n_frames - lag if last is None else last
        n = last - first
        lo, hi = first + pi * n // pc, first + (pi + 1) * n // pc
        block = np.asarray(u[lo : hi + lag], np.float64)[..., None]
    return block[: hi - lo], block[lag:]


# -------------------------------------------------------------------------------- model
def init_params(key, channels=8, kernel=5):
    """CNN parameters: ``w1 (k, k, 1, C)``, ``b1 (C,)``, ``w2 (k, k, C, 1)``, ``b2 (1,)``."""
    k1, k2 = jax.random.split(key)
    scale1 = 1 / math.sqrt(kernel * kernel)
    scale2 = 0.1 / math.sqrt(kernel * kernel * channels)
    return {
        "w1": scale1 * jax.random.normal(k1, (kernel, kernel, 1, channels)),
        "b1": jnp.zeros((channels,)),
        "w2": scale2 * jax.random.normal(k2, (kernel, kernel, channels, 1)),
        "b2": jnp.zeros((1,)),
    }


def _conv(x, w):
    r = w.shape[0] // 2
    x = jnp.pad(x, ((0, 0), (r, r), (r, r), (0, 0)), mode="wrap")  # periodic box
    dims = ("NHWC", "HWIO", "NHWC")
    return lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=dims)


def apply(params, u):
    """One surrogate step: ``u (batch, ny, nx, 1) -> u + conv(tanh(conv(u)))``."""
    h = jnp.tanh(_conv(u, params["w1"]) + params["b1"])
    return u + _conv(h, params["w2"]) + params["b2"]


def loss_fn(params, x, y):
    return jnp.mean((apply(params, x) - y) ** 2)


def make_step(optimizer, axis_name=None):
    """One Adam/optax step on a batch ``x, y (batch, ny, nx, 1)``:
    ``step(params, opt_state, x, y) -> (params, opt_state, loss)``; with ``axis_name``
    gradients and loss are averaged over that (pmap) axis."""
    import optax  # optional dependency: pip install 'simpar[ml]'

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        if axis_name is not None:
            grads = lax.pmean(grads, axis_name)
            loss = lax.pmean(loss, axis_name)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def pmap_step(optimizer, devices=None):
    """The pmap version; call with the batch shaped ``(n_dev, per_device, ny, nx, 1)``."""
    return jax.pmap(
        make_step(optimizer, axis_name="batch"),
        axis_name="batch",
        in_axes=(None, None, 0, 0),
        out_axes=(None, None, None),
        devices=devices,
    )


def sharded_step(optimizer, mesh):
    """The sharding version: the unchanged step, batch on ``P("batch")``, rest replicated."""
    batch = NamedSharding(mesh, P("batch"))
    rep = NamedSharding(mesh, P())
    return jax.jit(
        make_step(optimizer),
        in_shardings=(rep, rep, batch, batch),
        out_shardings=(rep, rep, rep),
    ), batch


def batches(n_pairs, batch_size, steps, seed=0):
    """Indices of ``steps`` mini-batches (reshuffled every epoch)."""
    rng = np.random.default_rng(seed)
    order, out = np.array([], int), []
    for _ in range(steps):
        if order.size < batch_size:
            order = np.concatenate([order, rng.permutation(n_pairs)])
        out.append(order[:batch_size])
        order = order[batch_size:]
    return out


def train(version, x, y, steps, batch_size=16, lr=3e-3, seed=0, devices=None, log=None):
    """Train from ``init_params(PRNGKey(seed))``; ``version`` is ``one``, ``pmap`` or
    ``sharded``. Returns ``(params, losses)``."""
    import optax

    devices = devices or jax.local_devices()
    n_dev = len(devices)
    opt = optax.adam(lr)
    params = init_params(jax.random.PRNGKey(seed))
    opt_state = opt.init(params)
    if version == "one":
        step = jax.jit(make_step(opt))
    elif version == "pmap":
        step = pmap_step(opt, devices)
    elif version == "sharded":
        mesh = jax.sharding.Mesh(np.asarray(devices), ("batch",))
        step, batch_sharding = sharded_step(opt, mesh)
    else:
        raise ValueError(f"version must be one, pmap or sharded, got {version!r}")
    losses = []
    for i, idx in enumerate(batches(len(x), batch_size, steps, seed)):
        bx, by = x[idx], y[idx]
        if version == "pmap":
            bx = bx.reshape(n_dev, batch_size // n_dev, *bx.shape[1:])
            by = by.reshape(n_dev, batch_size // n_dev, *by.shape[1:])
        elif version == "sharded":
            bx = jax.make_array_from_process_local_data(batch_sharding, bx)
            by = jax.make_array_from_process_local_data(batch_sharding, by)
        params, opt_state, loss = step(params, opt_state, bx, by)
        losses.append(float(loss))
        if log and (i % log == 0 or i == steps - 1):
            print(f"step {i:5d}  loss {losses[-1]:.3e}", flush=True)
    return params, losses


def rollout_error(params, frames):
    """Relative L2 error of the surrogate applied to its own output, started at
    ``frames[0]``, against ``frames[1:]`` (``(T, ny, nx, 1)``). Returns ``(T - 1,)``."""
    u, errs = frames[:1], []
    f = jax.jit(apply)
    for ref in frames[1:]:
        u = f(params, u)
        errs.append(float(jnp.linalg.norm(u[0] - ref) / jnp.linalg.norm(ref - ref.mean())))
    return np.asarray(errs)


# ------------------------------------------------------------------------- command line
FRAMES = 60  # frames of the simulated data set (61 with the initial one)
TRAIN_PAIRS = 2 * (FRAMES + 1) // 3  # pairs (u[i], u[i + 1]) with i < split
MAX_DEVICES = 4096
DEFAULT_DATA = "data/runs/surrogate_heat.nc"  # relative to the working directory


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked before JAX compiles anything (exit 2 with one line)."""
    ap = ScriptParser(prog="train_surrogate.py", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--devices",
        type=int_in(1, MAX_DEVICES),
        default=8,
        help="virtual CPU devices (CPU backend only)",
    )
    ap.add_argument("--version", choices=("sharded", "pmap", "one"), default="sharded")
    ap.add_argument("--steps", type=int_in(1), default=600, help="training steps (>= 1)")
    ap.add_argument(
        "--batch",
        type=int_in(1, TRAIN_PAIRS),
        default=16,
        help=f"global batch (1 .. {TRAIN_PAIRS} training pairs; a multiple of "
        "--devices for pmap and sharded)",
    )
    ap.add_argument(
        "--data",
        default=DEFAULT_DATA,
        help=f"where the simulated frames are written (.nc; default {DEFAULT_DATA}, its folder "
        "is created)",
    )
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --data")
    args = ap.parse_args(argv)
    if args.version != "one" and args.batch % args.devices:
        ap.error(
            f"--batch {args.batch} must be a multiple of --devices {args.devices} for "
            f"--version {args.version} (each device takes batch / devices pairs)"
        )
    data = Path(args.data)
    if data.exists() and not args.overwrite:
        ap.error(f"--data {args.data} exists; pass --overwrite to replace it or choose another")
    if data.suffix not in (".nc", ".h5"):
        ap.error(f"--data must end in .nc or .h5, got {args.data!r}")
    if args.data == DEFAULT_DATA:  # a fresh clone has no data/runs yet: the script makes it
        data.parent.mkdir(parents=True, exist_ok=True)
    if not data.parent.is_dir():
        ap.error(f"--data: directory {str(data.parent)!r} does not exist")
    try:
        import optax  # noqa: F401
    except ImportError:
        ap.error('needs optax: pip install "simpar[ml]"')
    return args


def main(argv=None):
    """Simulate, train and print one JSON line (see the module docstring)."""
    args = parse_args(argv)
    jax.config.update("jax_num_cpu_devices", args.devices)  # affects the CPU backend only
    jax.config.update("jax_enable_x64", True)
    from simpar.errors import ConfigError

    if args.version != "one" and len(jax.local_devices()) != args.devices:
        print(
            f"train_surrogate.py: error: --devices {args.devices} but JAX has "
            f"{len(jax.local_devices())} {jax.default_backend()} devices",
            file=sys.stderr,
        )
        sys.exit(2)
    t0 = time.perf_counter()
    try:
        path = simulate(args.data, frames=FRAMES, every=5, overwrite=args.overwrite)
    except ConfigError as err:
        print(f"train_surrogate.py: error: {err}", file=sys.stderr)
        sys.exit(2)
    with h5py.File(path) as f:
        n_frames = f["time"].shape[0]
    split = 2 * n_frames // 3
    x, y = read_pairs(path, last=split)  # pairs (u[i], u[i+1]), i < split: training
    _, held = read_pairs(path, first=split - 1)  # the held-out frames u[split:]
    params, losses = train(args.version, x, y, args.steps, args.batch, log=100)
    errs = rollout_error(params, held)  # from u[split], against u[split + 1:]
    print(
        json.dumps(
            {
                "version": args.version,
                "devices": len(jax.local_devices()),
                "train_pairs": len(x),
                "held_out_frames": len(held),
                "loss_first": losses[0],
                "loss_last": losses[-1],
                "rollout_rel_error_first": errs[0],
                "rollout_rel_error_last": errs[-1],
                "rollout_steps": len(errs),
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
