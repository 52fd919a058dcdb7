"""N-body output layout (H5MD) of ``[model] name = "nbody"`` runs.

The run itself goes through the driver (``simpar.drive``; the N-body adapter with the config
keys is ``simpar.drive.nbody``). This module keeps what is N-body specific in the file:

Output: written with ``simpar.io.h5md.H5MDWriter`` (the particle writer shared with the
LJ runs), with open boundaries (``boundary = "none"``, zero box edges), velocities, the
masses, and observables at every frame: ``kinetic_energy``, ``potential_energy``,
``total_energy``, ``virial_ratio`` ``[T]`` and ``momentum``, ``angular_momentum``
``[T, 3]`` (whole-system totals). Run metadata and physics parameters are attributes of
``/parameters`` (with ``run_status``: running / complete / failed: <reason>).

With ``physics.force = "pm"`` (``simpar.drive.nbody_pm``) the box is periodic
(``boundary = "periodic"``, the box edges with every frame) and the observables are
:data:`PM_OBSERVABLES` (no angular momentum or virial ratio in a periodic box).

Units are N-body units (G = M = 1, E = -1/4 for the Plummer sphere). Position, velocity,
time and box carry no ``unit`` attribute (reduced units, see ``simpar.io.h5md``);
``/h5md/modules/units`` ``system = "nbody"``, ``reduced_unit`` attributes (``L``,
``L T-1``, ``T``) and the observables' ``unit`` say what they are.

Restart: with each frame the whole state (positions, velocities, accelerations, masses,
step; ``simpar.particles.checkpoint``) is written atomically to ``<path>.ckpt``;
``resume=True`` (``simpar run --resume``) continues from it, appending to the same file, bit
for bit equal to an uninterrupted run on the same engine and device count (to round-off on
another: the state is stored in global particle order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simpar.drive.loop import Run
from simpar.io.h5md import H5MDWriter
from simpar.particles.nbody import Observables

__all__ = ["PM_OBSERVABLES", "BodiesRun", "observable_values", "open_output"]

_OBSERVABLES = (
    "kinetic_energy",
    "potential_energy",
    "total_energy",
    "momentum",
    "angular_momentum",
    "virial_ratio",
)
PM_OBSERVABLES = (
    "kinetic_energy",
    "potential_energy",
    "total_energy",
    "momentum",
    "density_contrast",
)
"""Observables of ``physics.force = "pm"`` runs (periodic box): energies (``W`` is the mesh
potential energy with the mean density removed), total momentum ``[T, 3]`` and
``density_contrast`` = largest node density of the PM mesh / mean density."""


def observable_values(obs: Observables) -> dict[str, np.ndarray]:
    """The observables of one frame as float64 host values (whole-system totals).

    Returns:
      ``kinetic_energy``, ``potential_energy``, ``total_energy``, ``virial_ratio`` (scalars)
      and ``momentum``, ``angular_momentum`` (``(3,)``), in N-body units.
    """
    kin, pot = float(obs.kinetic), float(obs.potential)
    return {
        "kinetic_energy": np.float64(kin),
        "potential_energy": np.float64(pot),
        "total_energy": np.float64(kin + pot),
        "momentum": np.asarray(obs.momentum, np.float64),
        "angular_momentum": np.asarray(obs.angular_momentum, np.float64),
        "virial_ratio": np.float64(kin / abs(pot) if pot else np.nan),
    }


# N-body units (symbols of ``simpar.io.h5md.UNIT_SYSTEMS["nbody"]``): ``reduced_unit`` of
# every element; observables also carry them as their ``unit`` (MDAnalysis does not convert
# observables). Energies and momenta are whole-system totals.
_NBODY_UNITS = {
    "position": "L",
    "velocity": "L T-1",
    "edges": "L",
    "kinetic_energy": "M L+2 T-2",
    "potential_energy": "M L+2 T-2",
    "total_energy": "M L+2 T-2",
    "virial_ratio": "1",
    "momentum": "M L T-1",
    "angular_momentum": "M L+2 T-1",
    "density_contrast": "1",
}
_VECTORS = ("momentum", "angular_momentum")


def open_output(
    path: Path,
    n: int,
    dtype: str,
    mass,
    attrs: dict,
    overwrite: bool = False,
    key="--out",
    periodic: bool = False,
    names: tuple[str, ...] = _OBSERVABLES,
) -> H5MDWriter:
    """An H5MD writer (``simpar.io.h5md``) set up for an N-body run.

    Layout differences from an LJ run: ``boundary = "none"`` on every axis and zero box
    edges (MDAnalysis then reports no box, so no periodic images are used) unless
    ``periodic`` (the PM force: ``boundary = "periodic"``, the box edges written with each
    frame); vector observables (``momentum``, ``angular_momentum``) ``[T, 3]``;
    ``unit_system = "nbody"`` and N-body ``reduced_unit`` labels; energies are totals, not
    per atom.

    Args:
      names: the observables (``_OBSERVABLES`` for the all-pairs force,
        :data:`PM_OBSERVABLES` for PM).
    """
    vectors = tuple(v for v in _VECTORS if v in names)

    def extra(writer: H5MDWriter) -> None:
        obs = writer.file["observables"]
        for name in vectors:
            grp = obs.create_group(name)
            writer.elements[name] = grp.create_dataset(
                "value", (0, 3), maxshape=(None, 3), chunks=(256, 3), dtype="f8"
            )
            grp["step"], grp["time"] = writer.step, writer.time  # hard links
        for name, ds in writer.elements.items():
            ds.attrs["reduced_unit"] = _NBODY_UNITS[name]
            if name in names:
                ds.attrs["unit"] = _NBODY_UNITS[name]
        writer.time.attrs["reduced_unit"] = "T"  # crossing time 2 sqrt(2) T

    return H5MDWriter(
        path,
        n,
        boundary=("periodic" if periodic else "none",) * 3,
        dtype=dtype,
        velocity=True,
        observables=[o for o in names if o not in vectors],
        mass=mass,
        attrs=attrs,
        overwrite=overwrite,
        extra=extra,
        key=key,
        unit_system="nbody",
    )


class BodiesRun(Run):
    """What the all-pairs and the particle-mesh N-body runs share: observables held between
    frames, the energy/momentum tracking at each frame and the non-finite check.

    Subclasses set ``_obs`` (the last observables), ``prev``/``step`` (the chunk's first and
    last step), ``_HINT`` (the setting to change) and ``_track(obs)``.
    """

    _HINT = "reduce time.dt"

    def observe(self) -> dict:
        return self._obs

    def at_frame(self, step, obs, first) -> None:
        self._track(obs)

    def _nonfinite(self, obs) -> str | None:
        values = np.concatenate([np.atleast_1d(v) for v in obs.values()])
        if np.all(np.isfinite(values)):
            return None
        where = f"between steps {self.prev} and {self.step}" if self.step > self.prev else (
            f"at step {self.step}")  # fmt: skip
        return f"non-finite energy or momentum {where} (NaN/inf in positions or velocities)"

    def problem(self, obs, step):
        why = self._nonfinite(obs)
        return (why, self._HINT) if why else None

    _OUTPUT: dict = {}  # extra ``nbody_output.open_output`` keywords of the subclass

    def file_attrs(self) -> dict:
        """The model's ``/parameters`` attributes beyond the run metadata."""
        raise NotImplementedError

    def open_writer(self, path, *, resume_step, overwrite, key):
        from simpar.io.h5md import H5MDWriter
        from simpar.io.meta import run_metadata

        p = self.plan
        meta = run_metadata(
            p.config_text, engine=p.engine, mesh=p.mesh, dtype=p.dtype, seed=p.seed,
            model="nbody",
        )  # fmt: skip
        new = lambda path, **kw: open_output(  # noqa: E731
            path, p.n, p.dtype, self.mass, meta | self.file_attrs(), **kw, **self._OUTPUT
        )
        if resume_step is not None:  # the old file must have the layout of a new one
            return H5MDWriter.open_existing(path, step=resume_step, like=new)
        return new(path, overwrite=overwrite, key=key)
