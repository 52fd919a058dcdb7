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


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'simpar' has no attribute {name!r}")
