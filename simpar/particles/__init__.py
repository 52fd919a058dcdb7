"""Particle models; kernels are pure functions of arrays (docs/kernels.md).

``space``, ``potentials`` (pair potentials, an open family: ``potentials.pair(energy_fn,
cutoff, params)``; LJ and Morse are two of them), ``neighbors`` (cell and Verlet lists at
fixed capacity), ``forces``, ``integrate`` (``(init, step)`` pairs ``nve``, ``langevin``),
``lattice``, ``observables``; ``error_codes`` (the one error bitmask and its messages);
``step`` (the one MD time step and regrow/redo loop, shared by every engine); ``md`` (any
pair potential on ``single`` and ``sharded``), ``decomposed``
+ ``decomposed_sim`` (the same step spatially decomposed over a device grid); ``nbody``
(gravity, with ``make_engine`` over ``simpar.parallel.ring``); ``pm`` + ``pm_sim``
(particle-mesh gravity; overflows take the MD error path: ``error_codes``, ``step``);
``checkpoint`` (restart files). Runs from a config go through the driver (``simpar.drive``: adapters ``lj`` and
``nbody``).
"""
