"""The driver: one chunk loop for every model (``simpar run`` and ``simpar.run.run_config``).

- ``simpar.drive.loop``: options resolved once, the default mesh, the chunk loop (frames,
  checkpoints, signals, progress, ``run_status``, the summary).
- ``simpar.drive.grid``, ``.lj``, ``.nbody``, ``.spectral``: the model adapters (a *plan*:
  the validated config, nothing on the devices; a *run*: advance, observe, snapshot,
  checkpoint, problems).

Adding a model family means adding an adapter module and a line in ``ADAPTERS``.
"""

from __future__ import annotations

import importlib

from simpar import config as cfgmod
from simpar.config import Section
from simpar.drive.loop import Options, drive
from simpar.errors import ConfigError

GRID_MODELS = ("heat", "wave", "advection", "gray_scott", "lbm")
ADAPTERS = {
    **{name: "simpar.drive.grid" for name in GRID_MODELS},
    "lj": "simpar.drive.lj",
    "nbody": "simpar.drive.nbody",
    "spectral_ns": "simpar.drive.spectral",
}
"""``[model] name`` -> the adapter module (``plan(cfg, options, config_text)``)."""


def model_name(data: dict) -> str:
    """``[model] name`` of a config, checked against the known models (``ConfigError``)."""
    return (
        Section(data).section("model", required=True).get("name", kind=str, choices=tuple(ADAPTERS))
    )


def run_model(name: str | None, data: dict, config_text: str, **options) -> dict:
    """Run a config through the driver; ``name`` (if given) is the model it must hold.

    Args:
      name: the expected ``[model] name`` (the model-specific entry points), or None.
      data: the parsed config (``--set`` overrides applied).
      config_text: the resolved config as TOML text, stored in the output.
      **options: the fields of ``simpar.drive.loop.Options``.

    Returns:
      The run summary (``simpar.io.meta.SUMMARY_KEYS``).
    """
    if name is not None:
        Section(data).section("model", required=True).get("name", kind=str, choices=(name,))
    model = model_name(data)
    opts = Options(**options)
    if opts.show_layout and ADAPTERS[model] != "simpar.drive.grid":
        raise ConfigError("--show-layout", f"grid models only; not {model!r}")
    return drive(importlib.import_module(ADAPTERS[model]), data, config_text, opts)


def run_config(
    data: dict,
    config_text: str,
    *,
    engine: str | None = None,
    mesh: tuple[int, ...] | None = None,
    steps: int | None = None,
    out: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    resume: bool = False,
    show_layout: bool = False,
    devices: int | None = None,
) -> dict:
    """Run the experiment described by a parsed config (any model).

    Args:
      data: the TOML table (``--set`` overrides applied).
      config_text: the resolved config as TOML text, stored in the output.
      engine, mesh, steps, out: command-line overrides of ``parallel.engine``,
        ``parallel.mesh``, ``time.steps`` and ``output.path``.
      overwrite: replace an existing output file.
      progress: show progress.
      resume: continue from the checkpoint next to the output (``<out>.ckpt``); the final
        state equals that of an uninterrupted run.
      show_layout: print which device holds which block before the run (grid models).
      devices: ``--devices`` (the default mesh spans this many devices; None: all).

    Returns:
      The run summary, with the same keys for every model (``simpar.io.meta.SUMMARY_KEYS``:
      path, model, engine, mesh, dtype, steps, frames (in the output file), run_status,
      wall time, rate, initial and final observables, model-specific ``details``).

    Raises:
      ConfigError: invalid input (nothing written).
      SimulationError: the run failed (the output holds every frame before the failure).
    """
    return run_model(
        None, data, config_text, engine=engine, mesh=mesh, steps=steps, out=out,
        overwrite=overwrite, progress=progress, resume=resume, show_layout=show_layout,
        devices=devices,
    )  # fmt: skip


def run_file(path: str, overrides=(), unset=(), **kwargs) -> dict:
    """Load a TOML config, remove the ``--unset`` keys ``unset``, apply the ``--set``
    overrides and run it (see ``run_config``)."""
    data, text = cfgmod.load(path, overrides, unset)
    return run_config(data, text, **kwargs)


__all__ = [
    "ADAPTERS",
    "GRID_MODELS",
    "Options",
    "model_name",
    "run_config",
    "run_file",
    "run_model",
]
