"""Models: the one protocol every model implements, ours and a user's package's alike.

A **model** is an object with

- ``name: str``: the ``[model] name`` of its configs, stored in its outputs;
- ``description: str``: one line for ``simpar run --help``;
- ``plan(cfg, opts, config_text) -> Plan``: its config schema. It reads and validates every
  key of its own from ``cfg`` (a ``simpar.config.Section`` over the whole config; a bad
  value is a ``ConfigError`` naming the key), takes the options every model shares from
  ``read_options(cfg, opts, default_path=...)`` and the device grid from
  ``device_mesh(common)``, and builds the initial state on the host. Nothing is placed on
  the devices yet.

The ``Plan`` (``simpar.drive.loop.Plan``) gives ``build(checkpoint) -> Run``: the state on
the devices, the per-block program compiled. The ``Run`` (``simpar.drive.loop.Run``) is
what the one chunk loop drives: ``advance(n)``, ``observe()`` (diagnostics), ``problem``,
``snapshot()``, ``open_writer`` / ``write_frame`` (outputs: every writer has
``append(step, time, ...)`` and ``frames``) and ``checkpoint_state`` (``--resume``).

A grid model needs none of that by hand: :func:`grid_model` turns
``from_config(cfg) -> GridSetup`` (a per-block ``GridModel.update`` plus the initial state,
params and outputs) into a model that runs on every engine with frames, checkpoints,
``--resume``, XDMF, ensembles, ``initial.kind = "file"`` and ``simpar plot``. This is how
``heat``, ``wave``, ``advection``, ``gray_scott`` and ``lbm`` are made.

**Plugins.** A package that declares an entry point in the group ``simpar.models``
(``[project.entry-points."simpar.models"] allen_cahn = "allen_cahn:model"``) makes its model
runnable by name: ``[model] name = "allen_cahn"``. Installation is the trust boundary: a
config only ever names a model, never a module or a path to import. ``simpar.run.run_config``
also takes a model object directly (``model=...``) for scripts.

This module imports neither JAX nor any model: ``simpar run --help`` lists the models from
here (built-in names and installed entry points, none of them loaded).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib import metadata
from typing import Any, Protocol, runtime_checkable

from simpar.drive import BUILTIN, builtin
from simpar.errors import ConfigError

ENTRY_POINT_GROUP = "simpar.models"
"""The entry-point group a plugin package declares its models in."""




@runtime_checkable
class Model(Protocol):
    """What the driver needs of a model (see the module docstring)."""

    name: str
    description: str

    def plan(self, cfg, opts, config_text: str) -> Any:
        """Read and validate the config; returns a ``simpar.drive.loop.Plan``."""
        ...


def _entry_points() -> dict[str, metadata.EntryPoint]:
    """Installed plugin models: name -> entry point (not loaded)."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def available() -> dict[str, str]:
    """Every model name ``[model] name`` accepts -> a one-line description.

    Built-ins first, then installed plugins (described by their distribution; nothing is
    imported). A plugin cannot take a built-in's name.
    """
    out = {name: desc for name, (_, desc) in BUILTIN.items()}
    for name, ep in sorted(_entry_points().items()):
        if name not in out:
            dist = getattr(ep, "dist", None)
            out[name] = f"plugin {ep.value}" + (f" ({dist.name})" if dist is not None else "")
    return out


def check_model(obj: Any, where: str) -> Model:
    """``obj`` if it implements the model protocol, else a ``ConfigError`` naming ``where``."""
    missing = [a for a in ("name", "plan") if not hasattr(obj, a)]
    if missing or not callable(obj.plan) or not isinstance(obj.name, str):
        raise ConfigError(
            where,
            f"{obj!r} is not a simpar model: it needs a str 'name' and a method "
            "'plan(cfg, opts, config_text)' (see simpar.models)",
        )
    return obj


def lookup(name: str, key: str = "model.name") -> Model:
    """The model registered as ``name``: a built-in, else an installed plugin.

    Args:
      name: the ``[model] name`` of a config.
      key: the config key named in errors.

    Raises:
      ConfigError: no such model (the message lists the available ones), or a plugin's
        entry point that fails to load or is not a model (names the entry point).
    """
    if name in BUILTIN:
        return builtin(name)
    eps = _entry_points()
    if name not in eps:
        raise ConfigError(
            key,
            f"unknown model {name!r}; available: {', '.join(available())} (a plugin model "
            f"is installed with its package, which declares it in the entry-point group "
            f"{ENTRY_POINT_GROUP!r})",
        )
    ep = eps[name]
    try:
        obj = ep.load()
    except Exception as err:  # a broken plugin: one line, not a traceback
        raise ConfigError(
            key, f"the plugin model {name!r} ({ep.value}) failed to load: {err!r}"
        ) from None
    obj = check_model(obj, key)
    if obj.name != name:
        raise ConfigError(
            key, f"the entry point {name!r} ({ep.value}) gives a model named {obj.name!r}"
        )
    return obj


def grid_model(name: str, from_config: Callable | str, description: str = "a grid model") -> Model:
    """A model from a grid set-up: ``from_config(cfg: Section) -> simpar.grid.model.GridSetup``.

    Args:
      name: the ``[model] name``; the ``GridModel`` it returns must carry the same name.
      from_config: reads ``[grid]``, ``[boundary]``, ``[physics]``, ``[initial]``,
        ``[time]`` (or any keys of its own) and returns the set-up; a callable, or for
        simpar's own models a ``"module:function"`` string imported on first use.
      description: one line for ``simpar run --help``.

    Returns:
      A model (``simpar.drive.grid.GridFamily``) running on every engine, with netCDF
      frames, XDMF, checkpoints, ``--resume``, ensembles, ``initial.kind = "file"`` and
      ``simpar plot`` as the built-in grid models.
    """
    from simpar.drive.grid import GridFamily

    return GridFamily(name, from_config, description)


_PROTOCOL = {
    "Plan": "simpar.drive.loop",
    "Run": "simpar.drive.loop",
    "Options": "simpar.drive.loop",
    "Common": "simpar.drive.loop",
    "read_options": "simpar.drive.loop",
    "device_mesh": "simpar.drive.loop",
    "rate": "simpar.drive.loop",
    "GridModel": "simpar.grid.model",
    "GridSetup": "simpar.grid.model",
}


def __getattr__(name: str):  # the protocol's classes, imported on first use (they need JAX)
    if name in _PROTOCOL:
        return getattr(importlib.import_module(_PROTOCOL[name]), name)
    raise AttributeError(f"module 'simpar.models' has no attribute {name!r}")


__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "Model",
    "available",
    "check_model",
    "grid_model",
    "lookup",
    *_PROTOCOL,
]
