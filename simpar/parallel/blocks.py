"""One way to put blocks on devices: engine names, the default-mesh rule, the device check.

This module is the single home of the engine names and of the rules that turn a requested
engine and mesh into a device grid. Every model family (grid engines, ensembles, the N-body
ring, decomposed MD) and the driver resolve their mesh here, so the default and the
"N devices requested, JAX sees M" message exist once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simpar.errors import ConfigError

ENGINES = ("single", "pmap", "shard_map", "sharded")


def check_engine(name: str, key: str = "--engine", allowed: Sequence[str] = ENGINES) -> str:
    """``name`` if it is one of ``allowed``, else a ``ConfigError`` on ``key`` listing them."""
    if name not in allowed:
        raise ConfigError(key, f"unknown engine {name!r}; choose one of {', '.join(allowed)}")
    return name


def default_mesh(
    engine: str, mesh: Sequence[int] | None, n_devices: int, members: int = 1
) -> tuple[int, ...]:
    """The device grid a run uses.

    Args:
      engine: one of ``ENGINES``.
      mesh: the requested device-grid shape (``--mesh`` / ``parallel.mesh``), or None.
      n_devices: devices JAX sees (``len(jax.devices())``, every process).
      members: ensemble members sharing the devices (the mesh is one member's).

    Returns:
      ``(1,)`` for ``single`` whatever the mesh (one command line serves a loop over every
      engine); the requested mesh; else every device along the first axis
      (``(n_devices // members,)``).
    """
    if engine == "single":
        return (1,)
    if mesh is not None:
        return tuple(int(m) for m in mesh)
    return (max(n_devices // max(members, 1), 1),)


def require_devices(
    mesh: Sequence[int], n_devices: int, key: str = "--mesh", members: int = 1
) -> None:
    """``ConfigError`` on ``key`` when ``members x prod(mesh)`` exceeds the ``n_devices``."""
    need = math.prod(mesh) * members
    if need > n_devices:
        shape = "x".join(map(str, mesh))
        times = f"{members} members x " if members > 1 else ""
        raise ConfigError(
            key,
            f"mesh {shape} needs {times}{math.prod(mesh)} = {need} devices but only "
            f"{n_devices} are available (on CPU, pass --devices {need})"
            if members > 1
            else f"mesh {shape} needs {need} devices but only {n_devices} are available "
            f"(on CPU, pass --devices {need})",
        )
