"""Grid models and their pieces; no device code here (that is ``simpar.parallel``).

``domain`` (the box, ``[grid]``), ``boundary`` (wall conditions as halo fills), ``stencils``,
``model`` (the ``GridModel`` contract: a per-block update plus what the engines need) and the
models ``heat``, ``wave``, ``advection``, ``gray_scott``, ``lbm`` (its config reader in
``lbm_config``), ``spectral_ns`` / ``spectral_ns3d`` (pseudo-spectral flow) and ``poisson``
(periodic Poisson solver). Per-block kernels are handed to ``simpar.parallel``'s engines.
"""
