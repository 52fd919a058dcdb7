"""``simpar.memory.release_free_memory`` and ``current_rss_mib``: the C heap's freed pages go
back to the system on Linux/glibc; elsewhere a no-op that says so."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simpar import memory


def test_release_free_memory_returns_bool_and_keeps_live_data():
    keep = [bytes([i % 251]) * 4096 for i in range(2000)]  # live data must survive a trim
    junk = [bytearray(4096) for _ in range(20000)]  # ~80 MB of small blocks, then freed
    del junk
    got = memory.release_free_memory()
    assert isinstance(got, bool)
    if sys.platform.startswith("linux") and memory._malloc_trim() is not None:
        assert got, "glibc kept 80 MB of freed small blocks"
    assert all(b == bytes([i % 251]) * 4096 for i, b in enumerate(keep))


def test_release_free_memory_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_LIBC", [None])  # as on macOS or a libc without malloc_trim
    assert memory.release_free_memory() is False


_HEAP_PROBE = """
import sys
from simpar import memory
fixed = memory.fix_mmap_threshold() if sys.argv[1] == "fix" else None
first = bytearray(2 << 20); del first  # glibc's threshold rises to the size freed
before = memory.current_rss_mib()
blocks = [bytearray(b"x" * (2 << 20)) for _ in range(32)]  # 64 MiB written
del blocks[:-1]  # the last stays: the heap's top cannot be trimmed
print(fixed, memory.current_rss_mib() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc, /proc/self/status")
def test_fixed_mmap_threshold_returns_freed_big_blocks_at_once(monkeypatch):
    """``fix_mmap_threshold`` (``simpar run``): 31 freed 2 MiB blocks leave the process at
    once; with glibc's rising threshold they stay in the heap (62 MiB resident)."""
    if memory._malloc_trim() is None:
        pytest.skip("not glibc")
    run = lambda mode: subprocess.run([sys.executable, "-c", _HEAP_PROBE, mode], check=True,  # noqa: E731
                                      capture_output=True, text=True).stdout.split()  # fmt: skip
    fixed, kept = run("fix")
    assert fixed == "True" and float(kept) < 8.0
    assert float(run("default")[1]) > 50.0
    monkeypatch.setattr(memory, "_LIBC", [None])
    assert memory.fix_mmap_threshold() is False  # off glibc: a no-op that says so


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_current_rss_is_positive_and_below_the_peak():
    now = memory.current_rss_mib()
    assert 0 < now <= memory.peak_memory_mib() + 1.0


@pytest.mark.slow
def test_md_chunk_compiled_ahead_once_and_same_trajectory(no_compile_cache):
    """``md.Simulation`` compiles its time steps ahead of the first call (to release the
    compiler's memory before the chunk's buffers exist): each of the chunk's programs is
    compiled once, not twice (the steps and the energy ahead of the chunk; the list rebuild
    is the program ``make_simulation`` compiled for the first list, not a second one), and
    the host-driven chunk follows the one-program ``md.run_chunk`` bit for bit."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax._src import dispatch, monitoring

    from simpar.particles import lattice, md, potentials, space

    f64 = jnp.float64
    r, box = lattice.cubic_lattice("fcc", 0.8442, (4, 4, 5), f64)  # a layout no other test uses
    v = lattice.maxwell_boltzmann(jax.random.PRNGKey(3), r.shape[0], 1.44, dtype=f64)
    spc = space.periodic(box, f64)
    pot = potentials.lennard_jones(cutoff=2.5, dtype=f64)
    sim = md.make_simulation(spc, pot, r, v, dt=0.005, skin=0.3)
    start = (sim.state, sim.nbrs)
    compiles = []

    def listen(event, duration, **_):
        if event == dispatch.BACKEND_COMPILE_EVENT:
            compiles.append(duration)

    monitoring.register_event_duration_secs_listener(listen)
    try:
        sim.advance(40)
        first = len(compiles)
        sim.state, sim.nbrs = start
        sim.advance(40)
    finally:
        monitoring.unregister_event_duration_listener(listen)
    assert int(sim.nbrs.n_builds) > 1, "no rebuild in the chunk: the test would miss a program"
    assert first == 2, f"{first} backend compilations of the first chunk (steps, energy)"
    assert len(compiles) == first, "the second chunk compiled again"
    state, nbrs = md.run_chunk(sim.ensemble, sim.spec, sim.space, sim.pot, sim.params, *start,
                               jnp.int32(40), block=md.row_block(start[0].position))  # fmt: skip
    assert np.array_equal(np.asarray(state.position), np.asarray(sim.state.position))
    assert np.array_equal(np.asarray(state.velocity), np.asarray(sim.state.velocity))
    assert int(nbrs.n_builds) == int(sim.nbrs.n_builds)


def test_lean_programs_compose_with_an_outer_jit():
    """``memory.lean_jit`` programs (the velocity draw, ``md.thermo``) called inside
    ``jax.jit`` become part of the outer program (compiler options are refused there) and
    give the values of a direct call."""
    import jax
    import numpy as np

    from simpar.particles import lattice

    key = jax.random.PRNGKey(4)
    direct = lattice.maxwell_boltzmann(key, 200, 1.3)
    inside = jax.jit(lambda k: lattice.maxwell_boltzmann(k, 200, 1.3))(key)
    np.testing.assert_allclose(np.asarray(inside), np.asarray(direct), rtol=1e-6, atol=1e-6)
    t = jax.jit(lambda v: lattice.kinetic_temperature(v, 1.0))(inside)
    assert abs(float(t) - 1.3) < 1e-5
    host_key = np.asarray(key)  # a constant of the outer program, not a tracer
    closed = jax.jit(lambda: lattice.maxwell_boltzmann(host_key, 200, 1.3))()
    np.testing.assert_allclose(np.asarray(closed), np.asarray(direct), rtol=1e-6, atol=1e-6)


def test_set_up_programs_dropped_only_with_the_cache_on(monkeypatch, tmp_path):
    """``drop_compiled_if_cached`` (``simpar run``'s set-up programs): with JAX's persistent
    cache on it empties the given functions' compiled programs (all of JAX's caches when none
    is given) and says so; with the cache off, or with ``KEEP_COMPILED`` (the test suite), it
    keeps them and returns False."""
    import jax
    import numpy as np

    f, g = jax.jit(lambda x: x * 2.0), jax.jit(lambda x: x + 3.0)
    x = np.arange(4.0)

    def compiled():
        f(x), g(x)
        return f._cache_size(), g._cache_size()

    def drop(cache_on, *fns):  # the settings read, not the cache in use: nothing compiles here
        was = jax.config.jax_enable_compilation_cache, jax.config.jax_compilation_cache_dir
        jax.config.update("jax_enable_compilation_cache", cache_on)
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        try:
            return memory.drop_compiled_if_cached(*fns)
        finally:
            jax.config.update("jax_enable_compilation_cache", was[0])
            jax.config.update("jax_compilation_cache_dir", was[1])

    assert compiled() == (1, 1) and memory.KEEP_COMPILED  # the conftest sets it
    assert drop(True, f) is False and compiled() == (1, 1)
    monkeypatch.setattr(memory, "KEEP_COMPILED", False)
    assert drop(False, f) is False and compiled() == (1, 1)
    assert drop(True, f) is True
    assert (f._cache_size(), g._cache_size()) == (0, 1)
    compiled()
    assert drop(True) is True  # every program: jax.clear_caches
    assert (f._cache_size(), g._cache_size()) == (0, 0)
