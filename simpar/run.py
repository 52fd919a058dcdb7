"""``simpar.run``: the public entry points of the driver (kept; the driver is ``simpar.drive``).

``run_config`` / ``run_file`` run any model through the one chunk loop of
``simpar.drive.loop``; ``grid_setup`` builds a grid model's set-up from its config.
"""

from __future__ import annotations

from simpar.drive import GRID_MODELS, model_name, run_config, run_file
from simpar.drive.grid import grid_setup

PARTICLE_MODELS = {"lj": "simpar.drive.lj", "nbody": "simpar.drive.nbody"}
"""Particle models and their driver adapters (run them with ``run_config``)."""

__all__ = ["GRID_MODELS", "PARTICLE_MODELS", "grid_setup", "model_name", "run_config", "run_file"]
