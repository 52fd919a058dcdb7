"""Names of the spatial axes, shared by the models (``simpar.grid``) and the device grids
(``simpar.parallel``) without either importing the other.

``AXIS_NAMES[a]`` names spatial axis ``a`` of a field (``x``, ``y``, ``z``), the matching
axis of a device grid and mesh, and the coordinate of an output file.
"""

AXIS_NAMES = ("x", "y", "z")
