"""Test set-up: 8 simulated CPU devices (asserted, never skipped) and float64 available.

Every multi-device path runs in CI this way; a test that needs N devices never skips.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", True)

N_DEVICES = 8


def pytest_configure(config):
    n = len(jax.devices())
    assert n == N_DEVICES, f"tests need {N_DEVICES} CPU devices, JAX sees {n}: {jax.devices()}"
