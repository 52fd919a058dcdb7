"""Particle models: ``space``, ``potentials``, ``neighbors``, ``integrate``, ``lattice``,
``observables`` and ``md`` (Lennard-Jones MD); ``nbody`` (gravity). Kernels are pure functions
of arrays; see README "Using the particle kernels". Runs from a config go through the driver
(``simpar.drive``: adapters ``lj`` and ``nbody``).
"""
