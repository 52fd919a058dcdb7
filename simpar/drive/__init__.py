"""The driver: one chunk loop for every model (``simpar run`` and ``simpar.run.run_config``).

- ``simpar.drive.loop``: options resolved once, the default mesh, the chunk loop (frames,
  checkpoints, signals, progress, ``run_status``, the summary).
- ``simpar.drive.grid``, ``.spectral``, ``.lj``, ``.nbody`` (with ``.nbody_pm``): the
  built-in models, each an object of the one model protocol (``simpar.models``: ``name``,
  ``description``, ``plan(cfg, opts, config_text) -> Plan``; a *plan*: the validated config,
  nothing on the devices; a *run*: advance, observe, snapshot, checkpoint, problems).

Models are found by name in ``simpar.models`` (built-ins and installed plugins); the driver
itself takes a model object and knows no model by name.
"""

from __future__ import annotations

from simpar.config import Section
from simpar.drive.loop import Options, drive
from simpar.errors import ConfigError


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
    opts = Options(**options)
    if opts.show_layout and not getattr(model, "shows_layout", False):
        raise ConfigError("--show-layout", f"grid models only; not {model.name!r}")
    return drive(model, data, config_text, opts, cfg=sec)


__all__ = ["Options", "run_model"]
