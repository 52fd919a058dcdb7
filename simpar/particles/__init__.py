"""Particle models: ``space``, ``potentials``, ``neighbors``, ``integrate``, ``lattice``,
``observables`` and ``md`` (Lennard-Jones MD, driver ``run``); ``nbody`` (gravity, driver
``nbody_run``). Kernels are pure functions of arrays; see README "Using the particle kernels".
"""
