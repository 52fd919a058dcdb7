"""Test set-up: 8 simulated CPU devices (asserted, never skipped) and float64 available.

Every multi-device path runs in CI this way; a test that needs N devices never skips.

Fused multiply-add is switched off on x86 (``--xla_cpu_max_isa=AVX``): XLA contracts
``a * b + c`` into an FMA only where both land in the same compiled kernel, and kernels are cut
differently per engine, mesh and halo width, so with FMA the engines differ from ``single`` by one
rounding in a few cells. Without it every engine is bitwise equal to ``single`` (the tests assert
that); tests that also run with FMA on compare to 1e-14.

Tiers: ``pytest -m "not slow"`` is the fast tier (every model on every engine at small size);
``slow`` marks multi-process runs and long validation runs (pyproject.toml). Command-line tests
call ``simpar.cli.main([...])`` in this process where a subprocess adds nothing; every test
must leave the SIGINT/SIGTERM handlers as it found them (checked after each test).
"""

import os
import platform
import signal

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# command-line runs of the tests (in-process and subprocesses) keep no compiled programs in the
# user's cache directory (simpar.cli.compile_cache_dir); the cache's own test sets it per run
os.environ.setdefault("SIMPAR_NO_COMPILE_CACHE", "1")
if platform.machine().lower() in ("x86_64", "amd64") and "xla_cpu_max_isa" not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX").strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", True)

N_DEVICES = 8


def pytest_configure(config):
    n = len(jax.devices())
    assert n == N_DEVICES, f"tests need {N_DEVICES} CPU devices, JAX sees {n}: {jax.devices()}"


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """In-process ``simpar.cli.main`` runs restore the handlers they installed (checked)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    after = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    assert after == before, f"signal handlers left changed: {before} -> {after}"
