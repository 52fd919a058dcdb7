"""Physical units of a Lennard-Jones run (as LAMMPS's ``units real`` / ``units metal``).

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
from dataclasses import dataclass

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


__all__ = ["PhysicalUnits", "STYLES"]
