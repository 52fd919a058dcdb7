"""Everything that knows about devices: ``topology`` (device grids), ``halo`` (halo fill),
``engines`` (grid engines ``single``, ``pmap``, ``shard_map``, ``sharded``), ``ring``
(N-body all-pairs), ``particles`` (particle sharding), ``distributed`` (multi-process runs).
"""
