"""``simpar.run``: the public entry points of the driver (the driver is ``simpar.drive``).

``run_config`` / ``run_file`` run any model through the one chunk loop of
``simpar.drive.loop``: a built-in or installed plugin model named by the config's
``[model] name`` (``simpar.models.lookup``), or a model object given directly
(``run_config(data, text, model=my_model)``). ``grid_setup`` builds a grid model's set-up
from its config.
"""

from __future__ import annotations

from simpar import config as cfgmod
from simpar import models
from simpar.config import Section
from simpar.drive import run_model
from simpar.drive.grid import BUILTIN as _GRID

GRID_MODELS = tuple(_GRID)
"""simpar's own grid models (a plugin adds its own through ``simpar.models``)."""

PARTICLE_MODELS = {"lj": "simpar.drive.lj", "nbody": "simpar.drive.nbody"}
"""Particle models and their driver modules (run them with ``run_config``)."""


def model_name(data: dict) -> str:
    """``[model] name`` of a config, checked against the available models (``ConfigError``)."""
    name = Section(data).section("model", required=True).get("name", kind=str)
    models.lookup(name)
    return name


def grid_setup(cfg: Section):
    """A grid model's ``GridSetup`` from its config (built-in or plugin ``[model] name``)."""
    name = cfg.section("model", required=True).get("name", kind=str)
    family = models.lookup(name, cfg.section("model").key("name"))
    if not hasattr(family, "setup"):
        from simpar.errors import ConfigError

        raise ConfigError("model.name", f"{name!r} is not a grid model")
    return family.setup(cfg)


def run_config(
    data: dict,
    config_text: str,
    *,
    model=None,
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
      model: a model object (``simpar.models``: e.g. ``simpar.models.grid_model(...)``);
        None: the one the config's ``[model] name`` names (a built-in or an installed
        plugin). With a model given, ``[model] name`` may be left out; when present it must
        be the model's name.
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
    if model is None:
        name = Section(data).section("model", required=True).get("name", kind=str)
        model = models.lookup(name)
    else:
        model = models.check_model(model, "model")
    return run_model(
        model, data, config_text, engine=engine, mesh=mesh, steps=steps, out=out,
        overwrite=overwrite, progress=progress, resume=resume, show_layout=show_layout,
        devices=devices,
    )  # fmt: skip


def run_file(path: str, overrides=(), unset=(), **kwargs) -> dict:
    """Load a TOML config, remove the ``--unset`` keys ``unset``, apply the ``--set``
    overrides and run it (see ``run_config``)."""
    data, text = cfgmod.load(path, overrides, unset)
    return run_config(data, text, **kwargs)


__all__ = [
    "GRID_MODELS",
    "PARTICLE_MODELS",
    "grid_setup",
    "model_name",
    "run_config",
    "run_file",
]
