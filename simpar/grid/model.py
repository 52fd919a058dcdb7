"""What a grid model is: a per-block update plus what the engines need to run it.

A model never sees devices. It gives:

- ``update(state, params) -> state``: ``state`` maps field names to blocks padded by ``k``
  halo cells (``k >= radius``) on the trailing ``ndim`` spatial axes; it returns the blocks
  padded by ``k - radius``. Engines fill the halo (boundary condition or neighbour exchange)
  and call ``update`` ``w // radius`` times per exchange of width ``w``.
- ``bcs``: per field, per spatial axis, the ``(lower, upper)`` boundary conditions
  (``simpar.grid.boundary``).
- ``local_sums(state, params) -> {name: scalar}`` (optional): block contributions to global
  diagnostics that the engine sums over devices; ``state`` is padded by ``radius``.

Fields are arrays ``(*lead, n_0, ..., n_{d-1})``; spatial axes last, in (x, y[, z]) order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jax

State = dict[str, jax.Array]
Params = dict[str, jax.Array]


@dataclass(frozen=True, eq=False)
class GridModel:
    """A grid model, as the engines see it.

    Attributes:
      name: model name (``heat``, ...), stored in outputs.
      ndim: number of spatial axes (2 or 3).
      radius: halo cells one ``update`` consumes per side.
      bcs: field name -> tuple over spatial axes of ``(lower, upper)`` boundary conditions.
      update: the per-block step (see module docstring).
      local_sums: optional per-block contributions to global diagnostics.
      units: field name -> CF ``units`` (UDUNITS spelling, e.g. ``"K"``, ``"m s-1"``;
        ``"1"`` only for a truly dimensionless quantity such as a mass fraction).
      long_names: field name -> description for outputs.
      diagnosed: fields whose sum, min, max and profile the engines report (``None``: every
        floating-point field). The non-finite check always covers every floating-point field.
      diagnostics: ``local_sums`` name -> ``(units, long_name)`` for outputs.
      param_units: config key -> CF units of a number a run may sweep
        (``{"physics.diffusivity": "m2 s-1"}``): the ``units`` of that key's coordinate in an
        ensemble's output. A key not listed gets no ``units`` attribute.
      halo_sides: field name -> per spatial axis ``(lower, upper)``: whether one ``update``
        reads that side of the field's radius-wide halo (LBM: a population reads only the
        faces it streams in from). When the engines exchange a halo of width ``radius`` (one
        update per exchange), a side no update reads is not sent across devices (filled from
        the block itself, never read); wider halos and fields not listed get every side.
      length_units, time_units: CF units of the coordinates and of ``time``. Grid configs
        are read in SI units (lengths in m, times in s, diffusivities in m2 s-1, ...);
        ``lbm`` runs in lattice units mapped to one cell = ``dx`` m, one step = ``dx`` s.
    """

    name: str
    ndim: int
    radius: int
    bcs: Mapping[str, tuple]
    update: Callable[[State, Params], State]
    local_sums: Callable[[State, Params], dict[str, jax.Array]] | None = None
    units: Mapping[str, str] = field(default_factory=dict)
    long_names: Mapping[str, str] = field(default_factory=dict)
    diagnosed: tuple[str, ...] | None = None
    diagnostics: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    length_units: str = "m"
    time_units: str = "s"
    param_units: Mapping[str, str] = field(default_factory=dict)
    halo_sides: Mapping[str, tuple] = field(default_factory=dict)

    @property
    def fields(self) -> tuple[str, ...]:
        """Names of the state fields (the keys of ``bcs``)."""
        return tuple(self.bcs)

    def diagnostic_attrs(self, name: str) -> tuple[str, str]:
        """CF ``(units, long_name)`` of a diagnostic reported by the engines' ``observe``.

        ``<field>_sum``, ``_min``, ``_max`` and ``_profile`` take the field's units; the
        model's own ``local_sums`` are described by ``diagnostics``.
        """
        if name in self.diagnostics:
            return tuple(self.diagnostics[name])
        what = {"_sum": "sum over all cells of", "_min": "minimum of", "_max": "maximum of"}
        for suffix in (*what, "_profile"):
            f = name[: -len(suffix)]
            if name.endswith(suffix) and f in self.bcs:
                long = self.long_names.get(f, f)
                if suffix == "_profile":
                    return self.units.get(f, "1"), f"{long} averaged over all axes but the last"
                return self.units.get(f, "1"), f"{what[suffix]} {long}"
        return "1", name

    @property
    def periodic(self) -> tuple[bool, ...]:
        """Per spatial axis; every field must agree (it fixes the device topology)."""
        per = None
        for name, axes in self.bcs.items():
            p = tuple(lo.periodic for lo, _ in axes)
            for a, (lo, hi) in enumerate(axes):
                if lo.periodic != hi.periodic:
                    raise ValueError(f"field {name}: axis {a} is periodic on one side only")
            if per is not None and p != per:
                raise ValueError("all fields must share the periodicity of each axis")
            per = p
        return per


@dataclass(eq=False)
class GridSetup:
    """Everything a grid run needs, as read from a config.

    Attributes:
      model: the grid model.
      domain: the box (``simpar.grid.domain.Domain``).
      params: array leaves, in the state dtype (differentiable, sweepable).
      state: initial fields, host arrays ``(*lead, n_0, ..., n_{d-1})``.
      dt: time step (time units).
      seed: random seed of the initial condition (None when none is used).
      output: field name -> function of the host state giving the array written to the file
        (default: the field itself); lets a model write derived fields (velocity, density).
    """

    model: GridModel
    domain: object
    params: Params
    state: dict
    dt: float
    seed: int | None = None
    output: dict | None = None
