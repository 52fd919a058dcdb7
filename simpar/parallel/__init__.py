"""Everything that knows about devices; imports no model (kernels are passed in).

``topology`` (device grids) -> ``halo`` (the ``Comm`` layer: halo fill, shifts, sums) ->
``blocks`` (the one place that builds meshes, shardings, ``pmap``/``shard_map`` programs and
moves data between host and devices) -> thin users of it: ``engines`` + ``grid_block`` (grid
models), ``ensemble`` (members on device groups), ``fft`` + ``spectral_engine`` (distributed
FFTs, spectral models), ``ring`` (all-pairs sums on a device ring; the N-body model is in
``simpar.particles.nbody``), ``particles`` (particle sharding), ``capacity`` + ``ghosts`` +
``domain`` (spatially decomposed MD: buffer sizes, ghost exchange and migration, block
mapping; the MD step itself is in ``simpar.particles``). ``distributed``: multi-process runs;
``layout``: what lives where; ``hlo``: what the compiled programs move.
"""
