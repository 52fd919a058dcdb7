"""Output files: ``netcdf`` (grid runs, netCDF4-layout HDF5 + XDMF), ``h5md`` (particle
runs, H5MD 1.1), ``checkpoint`` (restart files), ``meta`` (run metadata and the run summary),
``plot`` (``simpar plot``).
"""
