"""Grid models and their pieces: ``domain`` (the box, ``[grid]``), ``boundary`` (wall
conditions), ``stencils``, ``model`` (the ``GridModel`` contract) and the models ``heat``,
``wave``, ``advection``, ``gray_scott`` and ``lbm``. No device code here (``simpar.parallel``).
"""
