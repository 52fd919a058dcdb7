"""Particle models; kernels are pure functions of arrays (docs/kernels.md).

``space``, ``potentials``, ``neighbors`` (cell and Verlet lists at fixed capacity),
``forces``, ``integrate``, ``lattice``, ``observables``; ``error_codes`` (the one error
bitmask and its messages); ``step`` (the one MD time step and regrow/redo loop, shared by
every engine); ``md`` (Lennard-Jones / Morse on ``single`` and ``sharded``), ``decomposed``
+ ``decomposed_sim`` (the same step spatially decomposed over a device grid); ``nbody``
(gravity, with ``make_engine`` over ``simpar.parallel.ring``); ``checkpoint`` (restart
files). Runs from a config go through the driver (``simpar.drive``: adapters ``lj`` and
``nbody``).
"""
