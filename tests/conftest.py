"""Test set-up: 8 simulated CPU devices (asserted, never skipped) and float64 available.

Every multi-device path runs in CI this way; a test that needs N devices never skips.

Fused multiply-add is switched off on x86 (``--xla_cpu_max_isa=AVX``): XLA contracts
``a * b + c`` into an FMA only where both land in the same compiled kernel, and kernels are cut
differently per engine, mesh and halo width, so with FMA the engines differ from ``single`` by one
rounding in a few cells. Without it every engine is bitwise equal to ``single`` (the tests assert
that); tests that also run with FMA on compare to 1e-14.
"""

import os
import platform

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if platform.machine().lower() in ("x86_64", "amd64") and "xla_cpu_max_isa" not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX").strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", True)

N_DEVICES = 8


def pytest_configure(config):
    n = len(jax.devices())
    assert n == N_DEVICES, f"tests need {N_DEVICES} CPU devices, JAX sees {n}: {jax.devices()}"
