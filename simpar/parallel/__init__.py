"""Everything that knows about devices; imports no model (kernels are passed in).

``topology`` (device grids) -> ``halo`` (the ``Comm`` layer: halo fill, shifts, sums) ->
``blocks`` (the one place that builds meshes, shardings, ``pmap``/``shard_map`` programs and
moves data between host and devices) -> thin engines: ``engines`` + ``grid_block`` (grid
models), ``ensemble`` (members on device groups), ``ring`` (all-pairs particle models),
``particles`` (particle sharding), ``domain`` (decomposed MD). ``distributed``: multi-process
runs; ``layout``: what lives where; ``hlo``: what the compiled programs move.
"""
