"""Output and input files; no device code and no models here.

Grid runs: ``netcdf`` (``GridWriter``: netCDF4-layout HDF5), its layout and plain-h5py readers
``nclayout`` and its ParaView sidecar ``xdmf``. Particle runs: ``h5md`` (H5MD 1.1 writer and
reader) and ``h5md_read`` (H5MD states from outside). ``checkpoint`` (restart files),
``files`` (safe creation and replacement of every output file), ``untrusted`` (checks on
HDF5 files from outside before reading), ``meta`` (run metadata and the run summary),
``plot`` (``simpar plot``), ``cavity_plot`` (lid-driven cavity against Ghia et al.).
"""
