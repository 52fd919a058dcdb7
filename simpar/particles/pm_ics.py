"""Initial conditions for particle-mesh gravity in a static periodic box (host NumPy).

Every generator starts from a uniform cubic lattice of ``n_0 x n_1 x n_2`` particles (one
per lattice site ``q = (i + 1/2) L / n``; ``N = n_0 n_1 n_2``), of total mass ``M`` (each
particle ``M / N``; mean density ``rho0 = M / (L_0 L_1 L_2)``), and displaces it:

- :func:`plane_wave`: the cold plane wave of the Jeans instability, ``x = q + A0 sin(k q_x)``
  along x at rest (``k = 2 pi / L_0``). Until shell crossing (``A k = 1``) the exact solution
  of the Lagrangian equations is ``A(t) = A0 cosh(omega t)``, ``omega = sqrt(4 pi G rho0)``.
- :func:`zeldovich`: Gaussian random displacements with a power-law spectrum (Zel'dovich
  approximation): ``delta_k`` Gaussian with ``P(k) ~ k^n`` up to the lattice's Nyquist
  wavenumber, ``Psi_k = i k delta_k / |k|^2`` (so ``delta = -div Psi``), ``x = q + Psi``.
  In a static box linear perturbations grow as ``exp(omega t)`` (growing mode) on every scale;
  ``velocity = "growing"`` gives ``v = omega Psi`` (that mode alone), ``"rest"`` gives ``v = 0``
  (``cosh``: half growing, half decaying).

Units: any consistent set (``G``, lengths, ``M``); the experiments use ``M = 1`` and choose
``G`` so that ``omega = 1``. All arrays are float64 ``(N, 3)`` positions (wrapped into
``[0, L)``) and velocities, in C order of the lattice (particle id = lattice index).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["growth_rate", "lattice", "plane_wave", "zeldovich"]


def growth_rate(G: float, total_mass: float, box: Sequence[float]) -> float:
    """``omega = sqrt(4 pi G rho0)`` (1 / time), the linear growth rate of a static box."""
    return math.sqrt(4 * math.pi * G * total_mass / math.prod(box))


def lattice(n: Sequence[int], box: Sequence[float]) -> np.ndarray:
    """Cell-centred lattice sites ``(N, 3)`` float64 (length), C order over ``n``."""
    axes = [(np.arange(n[a]) + 0.5) * (box[a] / n[a]) for a in range(3)]
    return np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)


def plane_wave(n: Sequence[int], box: Sequence[float], amplitude: float):
    """Cold plane wave along x at rest.

    Args:
      n: lattice sites per axis; box: ``(L_0, L_1, L_2)`` (length).
      amplitude: ``A0 k`` (dimensionless, ``0 < A0 k < 1``: before shell crossing).

    Returns:
      ``(pos, vel, q)``: positions and zero velocities ``(N, 3)`` float64, and the lattice
      sites ``q`` (the Lagrangian coordinates; the displacement is ``pos - q``).
    """
    q = lattice(n, box)
    k = 2 * math.pi / box[0]
    pos = q.copy()
    pos[:, 0] += (amplitude / k) * np.sin(k * q[:, 0])
    return np.mod(pos, box), np.zeros_like(pos), q


def zeldovich(
    n: Sequence[int],
    box: Sequence[float],
    seed: int,
    sigma: float,
    spectral_index: float = -2.0,
    omega: float = 1.0,
    velocity: str = "growing",
):
    """Gaussian random Zel'dovich displacements of a lattice (seeded, reproducible).

    Args:
      n: lattice sites per axis; box: ``(L_0, L_1, L_2)`` (length).
      seed: NumPy ``default_rng`` seed.
      sigma: rms linear density contrast ``delta = -div Psi`` on the lattice (dimensionless).
      spectral_index: ``P(k) ~ k^spectral_index`` for ``0 < |k| <= k_Nyquist`` (per axis).
      omega: growth rate (1 / time, :func:`growth_rate`).
      velocity: ``"growing"`` (``v = omega Psi``) or ``"rest"`` (``v = 0``).

    Returns:
      ``(pos, vel)``: ``(N, 3)`` float64 positions wrapped into the box, velocities
      (length / time).
    """
    n = tuple(int(m) for m in n)
    rng = np.random.default_rng(seed)
    white = rng.standard_normal(n)
    ks = [2 * math.pi * np.fft.fftfreq(n[a], box[a] / n[a]) for a in range(2)]
    ks.append(2 * math.pi * np.fft.rfftfreq(n[2], box[2] / n[2]))
    kx, ky, kz = np.meshgrid(*ks, indexing="ij")
    k2 = kx**2 + ky**2 + kz**2
    amp = np.where(k2 > 0, np.where(k2 > 0, k2, 1.0) ** (spectral_index / 4), 0.0)
    for a, kk in enumerate((kx, ky, kz)):  # drop the Nyquist planes (no real sine partner)
        if n[a] % 2 == 0:
            amp = np.where(np.isclose(np.abs(kk), math.pi * n[a] / box[a]), 0.0, amp)
    delta_k = np.fft.rfftn(white) * amp
    delta = np.fft.irfftn(delta_k, s=n, axes=(0, 1, 2))
    delta_k *= sigma / max(float(np.std(delta)), 1e-300)
    inv = np.where(k2 > 0, 1.0 / np.where(k2 > 0, k2, 1.0), 0.0)
    psi = np.stack(
        [np.fft.irfftn(1j * kk * inv * delta_k, s=n, axes=(0, 1, 2)) for kk in (kx, ky, kz)], -1
    ).reshape(-1, 3)
    q = lattice(n, box)
    vel = omega * psi if velocity == "growing" else np.zeros_like(psi)
    return np.mod(q + psi, box), vel
