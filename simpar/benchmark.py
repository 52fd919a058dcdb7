"""Shared pieces of the benchmark scripts in ``experiments/`` (timing, memory bandwidth).

Benchmarks compare ratios measured in one run (engine vs ``single``, simpar vs NumPy, rate vs
the memory-bandwidth roofline); absolute times drift on shared machines.
"""

from __future__ import annotations

import time
from collections.abc import Callable


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
      ``numpy_copy_GBps``: ``np.copyto`` into a preallocated array (one thread).
      ``jax_pass_GBps``: a jitted in-place ``x * c`` pass (donated buffer), ten per call in a
      ``fori_loop`` with an optimisation barrier so each pass really reads and writes memory
      (uses every core XLA gives it). The roofline of a benchmark uses the larger of the two.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    a = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    b = np.empty_like(a)
    numpy_bw = 2 * nbytes / best_time(lambda: np.copyto(b, a), repeats)
    passes = 10
    scale = jax.jit(
        lambda v: jax.lax.fori_loop(
            0, passes, lambda i, x: jax.lax.optimization_barrier(x * jnp.float32(1.0000001)), v
        ),
        donate_argnums=0,
    )
    box = {"x": scale(jax.device_put(a, jax.devices()[0]))}

    def run():
        box["x"] = scale(box["x"])
        return box["x"]

    jax_bw = passes * 2 * nbytes / best_time(run, repeats)
    return {
        "numpy_copy_GBps": numpy_bw / 1e9,
        "jax_pass_GBps": jax_bw / 1e9,
        "roofline_GBps": max(numpy_bw, jax_bw) / 1e9,
    }


def time_engine(engine, state, params, steps: int, repeats: int = 3) -> float:
    """Seconds per step of ``engine.advance`` on chunks of ``steps`` (state kept on devices)."""
    box = {"s": engine.place(state)}

    def run():
        box["s"] = engine.advance(box["s"], params, steps)
        return box["s"]

    return best_time(run, repeats) / steps
