"""Engines of a spatially decomposed particle run. The block mapping is
``simpar.parallel.mapping.Mapping`` with the ``SLOTS`` layout (per-device buffers on a leading
device axis; ``pmap`` over a flat axis, ``shard_map`` over a named mesh, or one device with
``LocalComm``).

The decomposed MD model itself lives in ``simpar.particles.decomposed`` (the block step) and
``simpar.particles.decomposed_sim`` (``DomainSimulation``, ``make_domain_simulation``); the
ghost exchange and migration in ``simpar.parallel.ghosts``; capacity sizing in
``simpar.parallel.capacity``. This module knows nothing of particles: block functions are
passed in.
"""

from __future__ import annotations

from simpar.parallel.capacity import check_mesh, min_sub_box
from simpar.parallel.mapping import PER_BLOCK

ENGINES = ("local", *PER_BLOCK)  # "local": one device through LocalComm (tests, benches)
__all__ = ["ENGINES", "check_mesh", "min_sub_box"]
