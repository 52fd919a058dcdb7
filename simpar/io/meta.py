"""Run metadata stored as attributes on every output file, and the run summary of every model."""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import numpy as np

import simpar
from simpar.memory import peak_memory_mib


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
      (``author`` only when ``$SIMPAR_AUTHOR`` is set; no login or host names.)
      Plain Python/NumPy values; writers convert strings to the attribute kind their
      readers need (NC_CHAR for netCDF files, vlen str for H5MD).
    """
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
        "author": author(),
    }


def author() -> str | None:
    """The author written into outputs: ``$SIMPAR_AUTHOR`` if set, else None (not written).

    Login and host names are never written unless asked for this way (files get shared).
    """
    return os.environ.get("SIMPAR_AUTHOR") or None


SUMMARY_KEYS = (
    "model",
    "path",
    "run_status",
    "engine",
    "mesh",
    "dtype",
    "steps",
    "frames",
    "resumed_from",
    "wall_s",
    "peak_memory_mib",
    "rate",
    "rate_unit",
    "initial",
    "final",
    "details",
)
"""Keys of the summary every model's run returns (and ``simpar run`` prints as JSON)."""


def _plain(value):
    """JSON-ready value: NumPy/JAX scalars -> Python numbers, arrays -> lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    arr = np.asarray(value)
    return arr.tolist()


def run_summary(
    *,
    model: str,
    path,
    engine: str,
    mesh: Sequence[int],
    dtype: str,
    steps: int,
    frames: int,
    wall_s: float,
    rate: float,
    rate_unit: str,
    initial: dict,
    final: dict,
    details: dict,
    resumed_from: int | None = None,
    run_status: str = "complete",
) -> dict[str, object]:
    """The summary of a finished run, with the same keys (``SUMMARY_KEYS``) for every model.

    Args:
      model: model name (``heat``, ``lj``, ``nbody``, ...).
      path: the output file.
      engine: engine name; mesh: device-mesh shape.
      dtype: ``"float32"`` or ``"float64"``.
      steps: time steps asked for (``time.steps`` / ``--steps``); frames: frames written.
      wall_s: wall time of the stepping loop (s); ``peak_memory_mib`` (the process's peak
        resident memory, ``simpar.memory.peak_memory_mib``) is added.
      rate, rate_unit: the model's throughput and its unit (``"Mcell_updates/s"``,
        ``"atom_steps/s"``, ``"pair_interactions/s"``).
      initial, final: scalar (or small vector) observables at the first and last step
        (grid diagnostics, LJ thermo, N-body energies and momenta).
      details: model-specific figures (e.g. LJ ``energy_drift``, ``regrows``).
      resumed_from: the step a resumed run started at (None: not resumed).
      run_status: as the file's ``run_status`` attribute.

    Returns:
      A dict of plain JSON values.
    """
    values = dict(
        model=model, path=str(path), run_status=run_status, engine=engine, mesh=list(mesh),
        dtype=str(dtype), steps=int(steps), frames=int(frames), resumed_from=resumed_from,
        wall_s=float(wall_s), peak_memory_mib=peak_memory_mib(), rate=float(rate), rate_unit=rate_unit, initial=initial,
        final=final, details=details,
    )  # fmt: skip
    return {k: _plain(values[k]) for k in SUMMARY_KEYS}
