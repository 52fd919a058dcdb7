"""H5MD 1.1 trajectories (writer and reader) for particle runs.

Layout (README "Output files"; what MDAnalysis accepts is checked by tests/test_md.py):

```
/h5md                      version = [1, 1]; author/name; creator/name, version
/particles/trajectory      the only particles group (MDAnalysis reads this name)
    box                    dimension = 3, boundary = ["periodic" | "none"] * 3
    box/edges/{value [T,3], step, time}         time-dependent (MDAnalysis needs it)
    position/{value [T,N,3], step [T] int64, time [T] float64}
    velocity/{value [T,N,3], step, time}        optional
    force/{value [T,N,3], step, time}           optional
    mass [N], species [N] int32                 time-independent
/observables/<name>/{value [T], step, time}     every frame: temperature, pressure, and
                                                potential/kinetic/total energy per atom
/parameters                run metadata attributes (config TOML text, versions, engine,
                           mesh, dtype, seed, ...), ``unit_system`` and ``run_status``
                           (``running`` / ``complete`` / ``failed: <reason>``)
/parameters/rng_key/{value [T,2] uint32, step, time}   Langevin key per frame (optional)
```

``step``/``time`` of every element are hard links to ``position``'s. Values are stored in
the run's dtype, so a frame reads back bit for bit.

Continuing from a frame (LJ ``system.init = "h5md"``) is *not* bitwise equal to the
uninterrupted run: a frame holds positions, velocities and the RNG key, but not the
neighbour list, so the continuation builds a fresh one and recomputes the forces at the
frame in another summation order (rows list the same pairs in another order, and pairs in
the skin shell differ). The forces then differ by round-off (measured <= 3e-14
epsilon/sigma on forces of order 10-100, float64), and the chaotic dynamics amplifies it
by about e per 0.3 tau. Measured on 500 atoms at T = 1.44, dt = 0.005: positions differ
by 9e-16 sigma after 10 steps, 2e-15 after 50 and 1e-11 after 550 in float64; 1e-6 after
50 and 5e-3 after 550 in float32 (tests/test_md.py checks the float64 figure). Averages
are unaffected; for an exact continuation use ``simpar run --resume``, which restores the
neighbour-list state from the checkpoint (``simpar.particles.checkpoint``).

Units (decision, changed in 0.x: README "Output files", docs/migration.md): simpar works in
reduced units (Lennard-Jones: sigma, tau, epsilon, m; N-body: Henon units L, T, M), for which
neither H5MD nor MDAnalysis has a name. H5MD makes the ``unit`` attribute optional ("may
carry"), so position, velocity, force, time and box edges carry **no** ``unit``: nothing in
the file claims Angstrom or picoseconds (files before this change carried the compatibility
labels ``"A"`` / ``"ps"``; simpar's reader ignores ``unit`` and still reads them). The truth
is stated where tools look:

- ``/h5md/modules/units`` (the H5MD 1.1 units module): ``system`` (``"lj"`` or
  ``"nbody"``) and ``description`` (the unit symbols); ``/parameters`` repeats
  ``unit_system``;
- every element carries ``reduced_unit`` in the system's symbols (``"sigma"``,
  ``"sigma tau-1"``, ``"tau"``, ``"epsilon sigma-1"``; N-body ``"L"``, ``"L T-1"``, ``"T"``);
- observables carry their true ``unit`` (``"epsilon"``, ``"epsilon kB-1"``,
  ``"epsilon sigma-3"``; MDAnalysis reads observables without converting them);
- ``simpar plot`` labels axes with ``reduced_unit``; ``read_frame`` returns ``unit_system``.

A run may say what its reduced units are physically (LJ ``[units] style = "real"`` or
``"metal"`` with ``sigma`` in Angstrom, ``epsilon`` and ``mass`` in g/mol;
``simpar.io.meta.PhysicalUnits``). Its file then stores every value converted (positions in
Angstrom, time in ps, velocities in Angstrom/ps, energies in kcal/mol or eV, temperature
in K), each ``value``/``time`` with a ``unit`` MDAnalysis converts and the factor from the
reduced value in ``reduced_scale``; the units module's ``system`` is ``"real"``/``"metal"``
and its ``description`` gives sigma, epsilon, m and tau. ``MDAnalysis.Universe(path)``
opens such a file with no extra argument.

MDAnalysis (2.11, checked by tests/test_api.py) refuses a trajectory without units unless
told not to convert, and its ``Universe(path, convert_units=False)`` fails in its topology
step (the keyword reaches ``H5MDReader.parse_n_atoms``), so the call that opens a simpar file
and returns exactly the stored reduced numbers, with ``u.trajectory.units`` all None, is
``MDAnalysis.Universe(path, n_atoms=N, convert_units=False)`` with N =
``position/value.shape[1]`` (``MDANALYSIS_CALL``).

Crash safety: a frame is appended to every element first, then ``step`` and ``time`` are
written last (the commit marker) and the file is flushed, so a killed run leaves a
readable file with every completed frame. Default libver (not "latest").
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import h5py
import numpy as np

import simpar
from simpar.io.files import create_hdf5, ensure_space
from simpar.io.h5md_read import _particles_group
from simpar.io.h5md_read import check_box as check_box  # the reader, re-exported
from simpar.io.h5md_read import n_frames as n_frames
from simpar.io.h5md_read import read_frame as read_frame
from simpar.io.meta import author

# element -> (unit, reduced_unit): no ``unit`` for reduced quantities (H5MD: optional)
UNITS = {
    "position": ("", "sigma"),
    "velocity": ("", "sigma tau-1"),
    "force": ("", "epsilon sigma-1"),
    "edges": ("", "sigma"),
    "time": ("", "tau"),
}
#: how MDAnalysis opens a simpar H5MD file (values unconverted, in the file's reduced units)
MDANALYSIS_CALL = (
    "MDAnalysis.Universe(path, n_atoms=h5py.File(path)['particles/trajectory/position/value']"
    ".shape[1], convert_units=False)"
)
OBS_UNITS = {  # true units of the LJ observables (energies per atom, as LAMMPS prints)
    "temperature": "epsilon kB-1",
    "potential_energy": "epsilon",
    "kinetic_energy": "epsilon",
    "total_energy": "epsilon",
    "pressure": "epsilon sigma-3",
}
UNIT_SYSTEMS = {
    "lj": "Lennard-Jones reduced units: length sigma, energy epsilon, mass m, time "
    "tau = sigma sqrt(m / epsilon), temperature epsilon / kB. Position, velocity, force, "
    "time and box carry no 'unit' (they are not in any physical unit): each element's "
    "reduced_unit gives sigma, sigma tau-1, epsilon sigma-1 and tau. Open with " + MDANALYSIS_CALL,
    "nbody": "N-body (Henon) units: G = 1, total mass M = 1, total energy -1/4 for the "
    "Plummer sphere (virial radius L = 1), time T = sqrt(L^3 / (G M)). Position, "
    "velocity, time and box carry no 'unit': each element's reduced_unit gives L, L T-1 "
    "and T. Open with " + MDANALYSIS_CALL,
}


def _attr(value):
    """Attribute value as h5py wants it (str stays vlen str, lists become arrays)."""
    if isinstance(value, str | np.ndarray | np.generic | int | float | bool):
        return value
    if isinstance(value, Sequence):
        return np.asarray(value)
    return str(value)


class H5MDWriter:
    """Append-only H5MD 1.1 writer (one frame per ``append``, flushed each time).

    Args:
      path: output file (``.h5md``).
      n_atoms: number of particles N.
      boundary: ``"periodic"`` or ``"none"`` per axis.
      dtype: float dtype of position/velocity/force/box values.
      velocity, force: whether those elements are written.
      observables: names of scalar observables written each frame.
      rng_key: whether ``/parameters/rng_key`` is written each frame.
      mass: float[N] masses (optional), species: int[N] (default zeros).
      attrs: run metadata written as ``/parameters`` attributes.
      chunk_frames: frames per chunk of step/time/observables datasets.
      overwrite: replace an existing file (built beside it, then renamed over it);
        otherwise the file is created exclusively (``ConfigError`` if it exists).
      extra: ``extra(writer)`` adds to the layout before the file is published (N-body
        vector observables).
      key: the option or config key named in errors about ``path``.
      unit_system: ``"lj"`` or ``"nbody"`` (``UNIT_SYSTEMS``), written to the H5MD units
        module and ``/parameters``.
      units: a :class:`simpar.io.meta.PhysicalUnits` (LJ ``[units]``): every value given
        in reduced units is stored converted, with a ``unit`` MDAnalysis reads (Angstrom, ps,
        ...) and the factor in the ``reduced_scale`` attribute; no ``reduced_unit``. The
        units module's ``system`` is then ``units.style`` (``"real"``/``"metal"``).

    Raises:
      ConfigError: ``path`` exists (or appeared meanwhile) and ``overwrite`` is false.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        n_atoms: int,
        *,
        boundary: Sequence[str] = ("periodic",) * 3,
        dtype="float64",
        velocity: bool = True,
        force: bool = False,
        observables: Sequence[str] = (),
        rng_key: bool = False,
        mass=None,
        species=None,
        attrs: Mapping[str, object] | None = None,
        chunk_frames: int = 256,
        overwrite: bool = False,
        extra=None,
        key: str = "--out",
        unit_system: str = "lj",
        units=None,
    ):
        self.path = os.fspath(path)
        scales = units.scales() if units is not None else {}
        if units is not None:
            unit_system = units.style
            units_description = units.description()

        def labels(name):  # (unit, reduced_unit) and the factor from reduced values
            if name in scales:
                unit, factor = scales[name]
                return (unit, ""), factor
            return UNITS.get(name, ("", "")), None

        self.n = int(n_atoms)
        self.dtype = np.dtype(dtype)
        self.frames = 0
        self.elements: dict[str, h5py.Dataset] = {}

        def build(f: h5py.File) -> None:
            self.file = f
            h = f.create_group("h5md")
            h.attrs["version"] = np.array([1, 1], np.int32)
            # H5MD requires an author name; no login name is written unless asked for
            f.create_group("h5md/author").attrs["name"] = author() or "anonymous"
            c = f.create_group("h5md/creator")
            c.attrs["name"] = "simpar"
            c.attrs["version"] = simpar.__version__
            unit_group = f.create_group("h5md/modules/units")
            unit_group.attrs["version"] = np.array([1, 0], np.int32)
            unit_group.attrs["system"] = unit_system
            unit_group.attrs["description"] = (
                UNIT_SYSTEMS.get(unit_system, unit_system) if not scales else units_description
            )
            g = self.group = f.create_group("particles/trajectory")
            box = g.create_group("box")
            box.attrs["dimension"] = np.int32(3)
            box.attrs["boundary"] = [str(b) for b in boundary]
            n = self.n
            pos = g.create_group("position")
            self._value(pos, "position", (n, 3), self.dtype, *labels("position"))
            self.step = pos.create_dataset(
                "step", (0,), maxshape=(None,), chunks=(chunk_frames,), dtype="i8"
            )
            self.time = pos.create_dataset(
                "time", (0,), maxshape=(None,), chunks=(chunk_frames,), dtype="f8"
            )
            (t_unit, t_reduced), t_factor = labels("time")
            if t_unit:
                self.time.attrs["unit"] = t_unit
            if t_reduced:
                self.time.attrs["reduced_unit"] = t_reduced
            if t_factor is not None:
                self.time.attrs["reduced_scale"] = t_factor
            self._link(pos)
            if velocity:
                self._element(g, "velocity", (n, 3), self.dtype, *labels("velocity"))
            if force:
                self._element(g, "force", (n, 3), self.dtype, *labels("force"))
            self._element(box, "edges", (3,), self.dtype, *labels("edges"))
            obs = f.create_group("observables")
            for name in observables:
                if name in scales:
                    self._element(obs, name, (), "f8", *labels(name))
                    continue
                unit = OBS_UNITS.get(name, "") if unit_system == "lj" else ""
                self._element(obs, name, (), "f8", (unit, unit))
            params = f.create_group("parameters")
            params.attrs["unit_system"] = unit_system
            for name, value in (attrs or {}).items():
                if value is not None:
                    params.attrs[name] = _attr(value)
            params.attrs["run_status"] = "running"
            if rng_key:
                self._element(params, "rng_key", (2,), "u4", ("", ""))
            if mass is not None:
                (m_unit, _), m_factor = labels("mass")
                if m_factor is None:
                    g.create_dataset("mass", data=np.asarray(mass, self.dtype))
                else:
                    m = np.asarray(mass, np.float64) * m_factor
                    g.create_dataset("mass", data=m.astype(self.dtype)).attrs["unit"] = m_unit
            sp = np.zeros(n, np.int32) if species is None else np.asarray(species, np.int32)
            g.create_dataset("species", data=sp)
            if extra is not None:
                extra(self)

        # exclusive creation; with overwrite built beside the old file and renamed over it
        self.file = create_hdf5(self.path, build, overwrite=overwrite, key=key)

    def _value(self, group, name, shape, dtype, units, factor=None):
        chunks = (1,) + shape if shape else (256,)
        v = group.create_dataset(
            "value", (0,) + shape, maxshape=(None,) + shape, chunks=chunks, dtype=dtype
        )
        unit, reduced = units
        if unit:
            v.attrs["unit"] = unit  # vlen str: MDAnalysis compares with Python str
        if reduced:
            v.attrs["reduced_unit"] = reduced
        if factor is not None:  # stored = factor * reduced value (LJ [units], meta.PhysicalUnits)
            v.attrs["reduced_scale"] = float(factor)
        self.elements[name] = v
        return v

    def _element(self, parent, name, shape, dtype, units, factor=None):
        grp = parent.create_group(name)
        self._value(grp, name, shape, dtype, units, factor)
        self._link(grp)

    def _link(self, grp):
        if "step" not in grp:
            grp["step"] = self.step  # hard links (H5MD: shared step/time)
            grp["time"] = self.time

    def append(
        self,
        step: int,
        time: float,
        position,
        *,
        box,
        velocity=None,
        force=None,
        observables: Mapping[str, float] | None = None,
        rng_key=None,
    ) -> None:
        """Write one frame; ``step``/``time`` last, then flush.

        Args:
          step: integer time step; time: simulation time (tau).
          position: float[N, 3]; velocity, force: float[N, 3] when enabled.
          box: float[3] edge lengths (sigma).
          All in reduced units; a writer with ``units`` stores them converted.
          observables: scalar values for every observable named at construction.
          rng_key: uint32[2] when enabled.
        """
        k = self.frames
        data = {"position": position, "edges": box, "velocity": velocity, "force": force}
        data.update(observables or {})
        if "rng_key" in self.elements:
            data["rng_key"] = rng_key
        values = {}
        for name, ds in self.elements.items():
            value = data.get(name)
            if value is None:
                raise ValueError(f"frame {k}: no value given for H5MD element {name!r}")
            scale = self._scales().get(name)
            if scale is not None:  # a physical-units file: stored = factor * reduced
                value = np.asarray(value, np.float64) * scale
            value = np.asarray(value, ds.dtype)
            if value.shape != ds.shape[1:]:
                raise ValueError(f"{name}: shape {value.shape}, expected {ds.shape[1:]}")
            values[name] = value
        # refuse a frame that cannot fit before touching the file: earlier frames stay intact
        ensure_space(self.path, sum(v.nbytes for v in values.values()))
        for name, ds in self.elements.items():
            ds.resize(k + 1, axis=0)
            ds[k] = values[name]  # the dataset objects stay open: the file flush below
            # writes their chunks and raises on a write error (not a destructor, where h5py
            # only prints HDF5 errors)
        self.step.resize(k + 1, axis=0)
        self.time.resize(k + 1, axis=0)
        self.step[k] = int(step)
        self.time[k] = float(time) * self._scales().get("time", 1.0)
        self.frames = k + 1
        self.file.flush()

    def _scales(self) -> dict[str, float]:
        """Element name -> ``reduced_scale`` (read once from the file, so a writer reopened
        by :meth:`open_existing` converts as the first one did); ``"time"`` for the times."""
        if getattr(self, "_scale_cache", None) is None:
            self._scale_cache = {
                name: float(ds.attrs["reduced_scale"])
                for name, ds in self.elements.items()
                if "reduced_scale" in ds.attrs
            }
            if "reduced_scale" in self.time.attrs:
                self._scale_cache["time"] = float(self.time.attrs["reduced_scale"])
        return self._scale_cache

    @classmethod
    def open_existing(cls, path: str | os.PathLike, *, step: int, like=None) -> H5MDWriter:
        """Reopen a file written by ``H5MDWriter`` to append frames after ``step`` (restart).

        Frames cut short by a kill (values without a ``step``) and every frame with a step
        greater than ``step`` are dropped, so the file ends with the frame of the checkpoint
        taken at ``step`` and the resumed run appends without duplicated or missing frames.
        Every time-dependent element (a group with a ``value`` dataset whose first axis is
        unlimited: position, velocity, force, box edges, observables, ``rng_key``) is kept
        in step.

        Args:
          path: an existing H5MD file of this writer.
          step: the step of the checkpoint; the last kept frame must have this step.
          like: ``like(path) -> H5MDWriter`` writing the new file of this run: the file
            must have its layout (``simpar.io.untrusted.check_layout``); None checks less.

        Returns:
          A writer positioned after that frame (``run_status``, where present, is set to
          ``"running"``).

        Raises:
          ConfigError (``--resume``): not such a file, no frame at ``step``, or it fails the
            checks of a file from outside (links, storage, layout), before it is opened for
            writing; also when it cannot be opened for appending.
        """
        from simpar.io.h5md_read import check_h5md_output
        from simpar.io.untrusted import open_appendable

        check_h5md_output(path, step=step, like=like)
        f = open_appendable(path)
        try:
            g = _particles_group(f, None, "--resume")
            pos = g["position"]
            total = min(pos["value"].shape[0], pos["step"].shape[0])
            steps = pos["step"][:total]
            keep = int(np.count_nonzero(steps <= step))
            if keep == 0 or int(steps[keep - 1]) != step or np.any(np.diff(steps[:keep]) <= 0):
                last = int(steps[keep - 1]) if keep else None
                raise ValueError(
                    f"{os.fspath(path)} has no frame at step {step} to continue from "
                    f"(last frame at or before it: {last})"
                )
            self = cls.__new__(cls)
            self.path, self.file, self.group = os.fspath(path), f, g
            self.step, self.time = pos["step"], pos["time"]
            self.elements = {}

            def visit(name, obj):
                if (
                    isinstance(obj, h5py.Dataset)
                    and name.endswith("/value")
                    and obj.maxshape[0] is None
                ):
                    self.elements[name.split("/")[-2]] = obj

            for top in ("particles", "observables", "parameters"):
                if top in f:
                    f[top].visititems(visit)
            self.n = int(pos["value"].shape[1])
            self.dtype = pos["value"].dtype
            for ds in [*self.elements.values(), self.step, self.time]:
                if ds.shape[0] > keep:
                    ds.resize(keep, axis=0)
            if "run_status" in f["parameters"].attrs:
                f["parameters"].attrs["run_status"] = "running"
            self.frames = keep
            f.flush()
            return self
        except BaseException:
            f.close()
            raise

    def set_status(self, status: str) -> None:
        """Set ``/parameters`` ``run_status`` (``running``, ``complete``, ``failed: ...``)."""
        if self.file:
            self.file["parameters"].attrs["run_status"] = str(status)
            self.file.flush()

    def close(self) -> None:
        """Close the file (frames already appended are on disk)."""
        if self.file:
            self.file.close()
            self.file = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and self.file:
            # an error inside the with block: the file says why the run stopped
            self.set_status(
                f"failed: {exc}" if isinstance(exc, Exception) else "failed: interrupted"
            )
        self.close()
