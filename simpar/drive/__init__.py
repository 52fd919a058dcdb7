"""The driver: one chunk loop for every model (``simpar run`` and ``simpar.run.run_config``).

- ``simpar.drive.loop``: options resolved once, the default mesh, the chunk loop (frames,
  checkpoints, signals, progress, ``run_status``, the summary).
- ``simpar.drive.grid``, ``.spectral``, ``.lj``, ``.nbody`` (with ``.nbody_pm``): the
  built-in models, each an object of the one model protocol (``simpar.models``: ``name``,
  ``description``, ``plan(cfg, opts, config_text) -> Plan``; a *plan*: the validated config,
  nothing on the devices; a *run*: advance, observe, snapshot, checkpoint, problems).

``BUILTIN`` names simpar's own model objects (nothing is imported until one is asked for:
``simpar run --help`` lists them without starting JAX); ``simpar.models`` finds a model by
name among them and the installed plugins. The chunk loop itself takes a model object.
"""

from __future__ import annotations

import importlib

from simpar.config import Section
from simpar.errors import ConfigError

BUILTIN: dict[str, tuple[str, str]] = {
    "heat": ("simpar.drive.grid:heat", "diffusion (explicit finite differences)"),
    "wave": ("simpar.drive.grid:wave", "the wave equation (leapfrog)"),
    "advection": ("simpar.drive.grid:advection", "upwind / MUSCL advection of a scalar"),
    "gray_scott": ("simpar.drive.grid:gray_scott", "Gray-Scott reaction-diffusion"),
    "lbm": (
        "simpar.drive.grid:lbm",
        "lattice Boltzmann D2Q9 / D3Q19 (lid-driven cavity, shear waves)",
    ),
    "spectral_ns": (
        "simpar.drive.spectral:model",
        "pseudo-spectral incompressible flow, 2-D / 3-D (distributed FFT)",
    ),
    "lj": ("simpar.drive.lj:model", "Lennard-Jones / Morse molecular dynamics (H5MD output)"),
    "nbody": (
        "simpar.drive.nbody:model",
        "gravitational N-body, Plummer sphere (H5MD output); direct sum, or particle-mesh "
        'with physics.force = "pm" (experiments/pm_plane_wave.toml, pm_cosmic_web.toml)',
    ),
}
"""Built-in ``[model] name`` -> (``module:attribute`` of its model object, description)."""


def builtin(name: str):
    """simpar's own model object named ``name`` (imported on first use; ``KeyError`` if none)."""
    module, _, attr = BUILTIN[name][0].partition(":")
    return getattr(importlib.import_module(module), attr)


def run_model(model, data: dict, config_text: str, **options) -> dict:
    """Run a config through the driver with ``model`` (an object of the model protocol).

    Args:
      model: the model (``simpar.models.lookup(name)`` or a user's object); the config's
        ``[model] name``, when given, must be its name.
      data: the parsed config (``--set`` overrides applied).
      config_text: the resolved config as TOML text, stored in the output.
      **options: the fields of ``simpar.drive.loop.Options``.

    Returns:
      The run summary (``simpar.io.meta.SUMMARY_KEYS``).
    """
    sec = Section(data)
    if "model" in data:  # read (and checked) here: the model's plan need not read it
        sec.section("model").get("name", kind=str, choices=(model.name,))
    from simpar.drive.loop import Options, drive

    opts = Options(**options)
    if opts.show_layout and not getattr(model, "shows_layout", False):
        raise ConfigError("--show-layout", f"grid models only; not {model.name!r}")
    return drive(model, data, config_text, opts, cfg=sec)


__all__ = ["BUILTIN", "builtin", "run_model"]
