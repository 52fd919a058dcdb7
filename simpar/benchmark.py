"""Shared pieces of the scripts in ``experiments/`` (timing, memory bandwidth, argument parsing).

Benchmarks compare ratios measured in one run (engine vs ``single``, simpar vs NumPy, rate vs
the memory-bandwidth roofline); absolute times drift on shared machines.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable


class ScriptParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose bad arguments exit 2 with one line (no usage block, no
    traceback), as the ``simpar`` command does."""

    def error(self, message):
        """Print ``PROG: error: MESSAGE (--help for usage)`` to stderr and exit 2."""
        print(f"{self.prog}: error: {message} (--help for usage)", file=sys.stderr)
        sys.exit(2)


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``lo .. hi`` (``hi`` None: no upper bound).

    Raises (from the returned parser):
      argparse.ArgumentTypeError: not an integer, or out of range (the message says which).
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            span = f">= {lo}" if hi is None else f"{lo} .. {hi}"
            raise argparse.ArgumentTypeError(f"must be {span}, got {value}")
        return value

    return parse


def mesh_arg(text: str) -> tuple[int, ...]:
    """An argparse ``type``: a device-grid shape ``8``, ``2x4`` or ``2x2x2``
    (``simpar.parallel.topology.parse_mesh``, the command line's own rule).

    Raises (from argparse's view):
      argparse.ArgumentTypeError: not 1 to 3 positive integers joined by 'x'.
    """
    from simpar.errors import ConfigError
    from simpar.parallel.topology import parse_mesh

    try:
        return parse_mesh(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(err.message) from None


def best_time(fn: Callable[[], object], repeats: int = 3, warmup: bool = True) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` (after one untimed call)."""
    import jax

    if warmup:
        jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def memory_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> dict[str, float]:
    """Streaming bandwidth, bytes read + written per second, over a ``nbytes`` float32 array.

    Returns:
      ``numpy_copy_GBps``: ``np.copyto`` into a second array, one thread.
      ``numpy_copy_threads_GBps``: the same split over ``os.cpu_count()`` threads (STREAM
      "Copy": read one array, write another; glibc's memcpy uses non-temporal stores).
      ``jax_pass_GBps``: a jitted in-place ``x * c`` pass (donated buffer), ten per call in a
      ``fori_loop`` with an optimisation barrier so each pass really reads and writes memory
      (uses every core XLA gives it). In place, a written cache line was just read, so no
      write-allocate traffic: the highest figure on most machines.
      ``jax_copy_GBps``: the same pass into a second buffer (``y = x * c`` with ``x`` kept),
      what an out-of-place XLA kernel such as a stencil or an LBM step gets.
      ``roofline_GBps``: the largest of them (the roofline of every benchmark here).
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    numpy_bw, numpy_threads_bw = _numpy_copy_rates(nbytes, repeats)
    passes = 10
    c = jnp.float32(1.0000001)
    in_place = jax.jit(
        lambda v: jax.lax.fori_loop(0, passes, lambda i, x: jax.lax.optimization_barrier(x * c), v),
        donate_argnums=0,
    )
    # (x, y) -> (x * c, x): x stays live, so x * c goes to the other buffer
    out_of_place = jax.jit(
        lambda v: jax.lax.fori_loop(
            0, passes, lambda i, xy: jax.lax.optimization_barrier((xy[0] * c, xy[0])), v
        ),
        donate_argnums=0,
    )

    def rate(fn, init):
        box = {"x": fn(init)}

        def run():
            box["x"] = fn(box["x"])
            return box["x"]

        return passes * 2 * nbytes / best_time(run, repeats)

    dev = jax.devices()[0]
    x = jax.device_put(np.random.default_rng(0).random(nbytes // 4, dtype=np.float32), dev)
    jax_bw = rate(in_place, x.copy())
    jax_copy_bw = rate(out_of_place, (x, x + 1))
    out = {
        "numpy_copy_GBps": numpy_bw / 1e9,
        "numpy_copy_threads_GBps": numpy_threads_bw / 1e9,
        "jax_pass_GBps": jax_bw / 1e9,
        "jax_copy_GBps": jax_copy_bw / 1e9,
    }
    out["roofline_GBps"] = max(out.values())
    return out


def _numpy_copy_rates(nbytes: int, repeats: int) -> tuple[float, float]:
    """Bytes/s of ``np.copyto`` between two float32 arrays: one thread, and one per core."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    a = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    one = 2 * nbytes / best_time(lambda: np.copyto(b, a), repeats)
    threads = os.cpu_count() or 1
    bounds = np.linspace(0, a.size, threads + 1).astype(int)
    spans = [(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True) if hi > lo]
    with ThreadPoolExecutor(threads) as pool:

        def copy_threads():
            list(pool.map(lambda s: np.copyto(b[s[0] : s[1]], a[s[0] : s[1]]), spans))

        many = 2 * nbytes / best_time(copy_threads, repeats)
    return one, many


def time_engine(engine, state, params, steps: int, repeats: int = 3) -> float:
    """Seconds per step of ``engine.advance`` on chunks of ``steps`` (state kept on devices)."""
    box = {"s": engine.place(state)}

    def run():
        box["s"] = engine.advance(box["s"], params, steps, donate=True)
        return box["s"]

    return best_time(run, repeats) / steps


def bytes_per_step(engine, state, params) -> float:
    """Bytes one device sends per step through collectives, from the compiled HLO.

    Compiles a chunk of one halo exchange (``halo // radius`` steps) of ``engine``
    (``simpar.parallel.engines``), sums the arrays of every collective in it
    (``simpar.parallel.hlo.bytes_moved``) and divides by its steps. 0 on one device.
    """
    from simpar.parallel.hlo import bytes_moved

    per = max(engine.halo // engine.model.radius, 1)
    text = engine.lowered_advance(engine.place(state), params, per).compile().as_text()
    return bytes_moved(text) / per


def environment() -> dict:
    """What a benchmark's JSON records about where it ran: Python, JAX and jaxlib versions,
    the backend, the CPU model, and which XLA tuning options simpar passed
    (``simpar.memory.compiler_options_report``: options this jaxlib refuses are dropped)."""
    import platform

    import jax
    import jaxlib

    from simpar.memory import compiler_options_report

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "cpu": cpu,
        "compiler_options": compiler_options_report(),
    }


def start_jax(devices: int, x64: bool = True):
    """Configure JAX for a script before its first computation: ``devices`` virtual CPU
    devices (0: leave JAX's count; CPU only) and 64-bit floats; returns the ``jax`` module."""
    import jax

    if devices:
        jax.config.update("jax_num_cpu_devices", devices)
    jax.config.update("jax_enable_x64", x64)
    return jax
