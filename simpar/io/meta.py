"""Run metadata stored as attributes on every output file, the run summary of every model,
and the physical units an LJ run may state (:class:`PhysicalUnits`).

Physical units of a Lennard-Jones run (as LAMMPS's ``units real`` / ``units metal``).

simpar integrates in reduced units (length sigma, energy epsilon, mass m, time
``tau = sigma sqrt(m / epsilon)``). A config may say what those are physically (``[units]``
in ``simpar.drive.lj_config``)::

    [units]
    style = "real"       # "real": kcal/mol energies; "metal": eV energies
    sigma = 3.405        # Angstrom: one reduced length          (argon)
    epsilon = 0.2381     # kcal/mol ("real") or eV ("metal"): one reduced energy (= 119.8 K kB)
    mass = 39.948        # g/mol: one reduced mass

The run itself is unchanged (still reduced); the H5MD writer (``simpar.io.h5md``) multiplies
each stored value by its factor (:meth:`PhysicalUnits.scales`) and labels it with a unit
MDAnalysis converts, so ``MDAnalysis.Universe(path)`` opens the file with no extra argument:

===========================  ======================  =================================
element / observable         unit                    factor (value of one reduced unit)
===========================  ======================  =================================
position, box edges          ``Angstrom``            sigma
time                         ``ps``                  tau = sigma sqrt(m / epsilon)
velocity                     ``Angstrom ps-1``       sigma / tau
force ("real")               ``kcal mol-1 A-1``      epsilon / sigma
force ("metal")              ``kJ mol-1 Angstrom-1`` epsilon / sigma (MDAnalysis knows no
                                                     eV-based force unit; 1 eV = 96.485 kJ/mol)
energies (per atom)          ``kcal mol-1`` / ``eV`` epsilon
temperature                  ``K``                   epsilon / kB
pressure                     ``atm`` / ``bar``       epsilon / sigma^3 (LAMMPS's choice)
mass                         ``g mol-1``             m
===========================  ======================  =================================

Constants: CODATA 2018 exact SI values (``N_A``, ``kB``, ``e``), thermochemical calorie.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np

import simpar
from simpar.memory import peak_memory_mib


def run_metadata(
    config_text: str,
    *,
    engine: str,
    mesh: Sequence[int],
    dtype: str,
    seed: int | None = None,
    model: str = "",
) -> dict[str, object]:
    """The attributes every simpar output carries.

    Args:
      config_text: the full resolved config as TOML text.
      engine: ``single``, ``pmap``, ``shard_map`` or ``sharded``.
      mesh: device-grid shape, e.g. ``(2, 4)``; ``(1,)`` for ``single``.
      dtype: ``"float32"`` or ``"float64"``.
      seed: random seed used for initial conditions / thermostats (None if none).
      model: model name.

    Returns:
      (``author`` only when ``$SIMPAR_AUTHOR`` is set; no login or host names.)
      Plain Python/NumPy values; writers convert strings to the attribute kind their
      readers need (NC_CHAR for netCDF files, vlen str for H5MD).
    """
    return {
        "simpar_version": simpar.__version__,
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "engine": engine,
        "model": model,
        "device_mesh": np.asarray(tuple(mesh), dtype=np.int32),
        "process_count": np.int32(jax.process_count()),
        "dtype": dtype,
        "seed": np.int64(-1 if seed is None else seed),
        "config": config_text,
        "author": author(),
    }


def author() -> str | None:
    """The author written into outputs: ``$SIMPAR_AUTHOR`` if set, else None (not written).

    Login and host names are never written unless asked for this way (files get shared).
    """
    return os.environ.get("SIMPAR_AUTHOR") or None


SUMMARY_KEYS = (
    "model",
    "path",
    "run_status",
    "engine",
    "mesh",
    "dtype",
    "steps",
    "frames",
    "resumed_from",
    "wall_s",
    "peak_memory_mib",
    "rate",
    "rate_unit",
    "initial",
    "final",
    "details",
)
"""Keys of the summary every model's run returns (and ``simpar run`` prints as JSON)."""


def _plain(value):
    """JSON-ready value: NumPy/JAX scalars -> Python numbers, arrays -> lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    arr = np.asarray(value)
    return arr.tolist()


def run_summary(
    *,
    model: str,
    path,
    engine: str,
    mesh: Sequence[int],
    dtype: str,
    steps: int,
    frames: int,
    wall_s: float,
    rate: float,
    rate_unit: str,
    initial: dict,
    final: dict,
    details: dict,
    resumed_from: int | None = None,
    run_status: str = "complete",
) -> dict[str, object]:
    """The summary of a finished run, with the same keys (``SUMMARY_KEYS``) for every model.

    Args:
      model: model name (``heat``, ``lj``, ``nbody``, ...).
      path: the output file.
      engine: engine name; mesh: device-mesh shape.
      dtype: ``"float32"`` or ``"float64"``.
      steps: time steps asked for (``time.steps`` / ``--steps``); frames: frames written.
      wall_s: wall time of the stepping loop (s); ``peak_memory_mib`` (the process's peak
        resident memory, ``simpar.memory.peak_memory_mib``) is added.
      rate, rate_unit: the model's throughput and its unit (``"Mcell_updates/s"``,
        ``"atom_steps/s"``, ``"pair_interactions/s"``).
      initial, final: scalar (or small vector) observables at the first and last step
        (grid diagnostics, LJ thermo, N-body energies and momenta).
      details: model-specific figures (e.g. LJ ``energy_drift``, ``regrows``).
      resumed_from: the step a resumed run started at (None: not resumed).
      run_status: as the file's ``run_status`` attribute.

    Returns:
      A dict of plain JSON values.
    """
    values = dict(
        model=model, path=str(path), run_status=run_status, engine=engine, mesh=list(mesh),
        dtype=str(dtype), steps=int(steps), frames=int(frames), resumed_from=resumed_from,
        wall_s=float(wall_s), peak_memory_mib=peak_memory_mib(), rate=float(rate), rate_unit=rate_unit, initial=initial,
        final=final, details=details,
    )  # fmt: skip
    return {k: _plain(values[k]) for k in SUMMARY_KEYS}


# ------------------------------------------------- physical units of an LJ run


N_A = 6.02214076e23  # 1/mol
KB = 1.380649e-23  # J/K
EV = 1.602176634e-19  # J
KCAL = 4184.0  # J (thermochemical kilocalorie)
ATM = 101325.0  # Pa
BAR = 1.0e5  # Pa

STYLES = ("real", "metal")
#: energy unit of each style: (CF/H5MD spelling, joules per atom for one unit per mole or one eV)
ENERGY = {"real": ("kcal mol-1", KCAL / N_A), "metal": ("eV", EV)}
PRESSURE = {"real": ("atm", ATM), "metal": ("bar", BAR)}


@dataclass(frozen=True)
class PhysicalUnits:
    """What one reduced unit is physically.

    Attributes:
      style: ``"real"`` (energies in kcal/mol) or ``"metal"`` (energies in eV).
      sigma: one reduced length, Angstrom.
      epsilon: one reduced energy, kcal/mol (``real``) or eV (``metal``).
      mass: one reduced mass, g/mol.
    """

    style: str
    sigma: float
    epsilon: float
    mass: float

    @property
    def epsilon_joule(self) -> float:
        """epsilon per atom, J."""
        return self.epsilon * ENERGY[self.style][1]

    @property
    def tau_ps(self) -> float:
        """The reduced time unit ``sigma sqrt(m / epsilon)``, ps."""
        m_kg = self.mass * 1e-3 / N_A
        return self.sigma * 1e-10 * math.sqrt(m_kg / self.epsilon_joule) * 1e12

    def scales(self) -> dict[str, tuple[str, float]]:
        """Element or observable name -> ``(unit, factor)``: ``value_in_unit = factor *
        value_in_reduced_units`` (see the module table)."""
        energy, _ = ENERGY[self.style]
        p_unit, pascal = PRESSURE[self.style]
        if self.style == "real":
            force = ("kcal mol-1 A-1", self.epsilon / self.sigma)
        else:
            force = ("kJ mol-1 Angstrom-1", self.epsilon * EV * N_A / 1e3 / self.sigma)
        return {
            "position": ("Angstrom", self.sigma),
            "edges": ("Angstrom", self.sigma),
            "time": ("ps", self.tau_ps),
            "velocity": ("Angstrom ps-1", self.sigma / self.tau_ps),
            "force": force,
            "potential_energy": (energy, self.epsilon),
            "kinetic_energy": (energy, self.epsilon),
            "total_energy": (energy, self.epsilon),
            "temperature": ("K", self.epsilon_joule / KB),
            "pressure": (p_unit, self.epsilon_joule / (self.sigma * 1e-10) ** 3 / pascal),
            "mass": ("g mol-1", self.mass),
        }

    def description(self) -> str:
        """One line for the H5MD units module: the reduced units and their values."""
        energy, _ = ENERGY[self.style]
        return (
            f"LAMMPS-style '{self.style}' units: positions Angstrom, time ps, velocities "
            f"Angstrom/ps, energies {energy} per atom, temperature K, converted from a "
            f"Lennard-Jones run in reduced units with sigma = {self.sigma:g} Angstrom, "
            f"epsilon = {self.epsilon:g} {energy} (= {self.epsilon_joule / KB:.6g} K kB), "
            f"m = {self.mass:g} g/mol, tau = sigma sqrt(m / epsilon) = {self.tau_ps:.6g} ps"
        )
