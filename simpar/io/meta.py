"""Run metadata stored as attributes on every output file (DESIGN.md, CONTRACT: files)."""

from __future__ import annotations

import getpass
import platform
from collections.abc import Sequence

import jax
import numpy as np

import simpar


def run_metadata(
    config_text: str,
    *,
    engine: str,
    mesh: Sequence[int],
    dtype: str,
    seed: int | None = None,
    model: str = "",
) -> dict[str, object]:
    """The attributes every simpar output carries.

    Args:
      config_text: the full resolved config as TOML text.
      engine: ``single``, ``pmap``, ``shard_map`` or ``sharded``.
      mesh: device-grid shape, e.g. ``(2, 4)``; ``(1,)`` for ``single``.
      dtype: ``"float32"`` or ``"float64"``.
      seed: random seed used for initial conditions / thermostats (None if none).
      model: model name.

    Returns:
      Plain Python/NumPy values; writers convert strings to the attribute kind their
      readers need (NC_CHAR for netCDF files, vlen str for H5MD).
    """
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry in some containers
        user = "unknown"
    return {
        "simpar_version": simpar.__version__,
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "engine": engine,
        "model": model,
        "device_mesh": np.asarray(tuple(mesh), dtype=np.int32),
        "process_count": np.int32(jax.process_count()),
        "dtype": dtype,
        "seed": np.int64(-1 if seed is None else seed),
        "config": config_text,
        "host": platform.node(),
        "author": user,
    }
