"""simpar: particle and grid simulations on JAX, partitioned across devices.

The public surface, importable from ``simpar`` directly (loaded lazily, so that the command
line can configure JAX's devices before JAX starts):

- ``run_file(path, overrides, **options)``: run an experiment TOML (what ``simpar run`` does).
- ``make_engine(name, model, shape, mesh, halo)``, ``ENGINES``: run a grid model on
  ``single``, ``pmap``, ``shard_map`` or ``sharded``.
- ``DeviceGrid``: device-grid topology (neighbour pairs, ``axis_index_groups``).
- ``ConfigError``, ``SimulationError``: invalid input / failed run.

Kernels live in ``simpar.grid`` (stencils, boundary conditions, models), ``simpar.particles``
(spaces, potentials, neighbour lists, integrators) and ``simpar.parallel`` (halo exchange,
engines, the ring all-pairs).
"""

__version__ = "0.1.0"

_EXPORTS = {
    "run_file": "simpar.run",
    "make_engine": "simpar.parallel.engines",
    "ENGINES": "simpar.parallel.engines",
    "DeviceGrid": "simpar.parallel.topology",
    "ConfigError": "simpar.errors",
    "SimulationError": "simpar.errors",
}

__all__ = ["__version__", *_EXPORTS]
# the kernel packages, importable as ``simpar.grid`` etc. (listed by ``dir(simpar)``)
_SUBPACKAGES = ("grid", "io", "parallel", "particles", "precision")


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'simpar' has no attribute {name!r}")


def __dir__():
    """The public API (the lazy exports and the kernel packages) plus what is loaded."""
    return sorted({*globals(), *__all__, *_SUBPACKAGES})
