"""Lid-driven cavity against Ghia, Ghia & Shin (1982): reference data, deviations, a figure.

The reference tables (``data/reference/ghia1982_{u,v}_centerline.csv``) give ``u`` along the
vertical centre line ``x = 0.5`` and ``v`` along the horizontal one ``y = 0.5`` of the unit
cavity, normalised by the lid speed, at Re = 100, 400, 1000, 5000 (u) and 100, 1000 (v).

A simulation on a cell-centred ``nx x ny`` grid is sampled at the Ghia points by linear
interpolation: across the two cell columns (rows) next to the centre line, then along it, with
the wall values (0 at resting walls, 1 at the lid) appended at ``y = 0`` and ``y = 1``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import h5py
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

REFERENCE_DIR = Path(__file__).resolve().parents[2] / "data" / "reference"


def load_ghia(reynolds: int) -> dict[str, np.ndarray]:
    """Ghia et al. centre-line velocities at ``reynolds`` (100 or 1000; u also 400, 5000).

    Returns:
      ``{"y": (17,), "u": (17,), "x": (17,), "v": (17,)}``, float64, lengths in cavity sizes,
      velocities in lid speeds (``x``/``v`` absent when the table has no such column).

    Raises:
      ValueError: no column for this Reynolds number.
    """
    out = {}
    for name, coord, vel in (("u", "y", "u"), ("v", "x", "v")):
        path = REFERENCE_DIR / f"ghia1982_{name}_centerline.csv"
        lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
        header = lines[0].split(",")
        rows = np.array([[float(v) for v in ln.split(",")] for ln in lines[1:]])
        col = f"Re{int(reynolds)}"
        if col not in header:
            if name == "u":
                raise ValueError(
                    f"Ghia et al. give no data at Re = {reynolds}; columns: {header[2:]}"
                )
            continue
        order = np.argsort(rows[:, header.index(coord)])
        out[coord] = rows[order, header.index(coord)]
        out[vel] = rows[order, header.index(col)]
    return out


def centerlines(ux: np.ndarray, uy: np.ndarray, u_lid: float):
    """Centre-line profiles of a cell-centred cavity solution, normalised by ``u_lid``.

    Args:
      ux, uy: ``(nx, ny)`` velocity (any units, same as ``u_lid``).
      u_lid: lid speed.

    Returns:
      ``(y, u, x, v)``: cell-centre coordinates ``(ny,)``/``(nx,)`` in cavity sizes (wall
      points included: ``(ny + 2,)``, ``(nx + 2,)``), ``u(x = 0.5, y)`` and ``v(x, y = 0.5)``.
    """
    ux = np.asarray(ux, np.float64) / u_lid
    uy = np.asarray(uy, np.float64) / u_lid
    nx, ny = ux.shape

    def mid(a, axis):  # value on the centre plane of `axis`, linear between the two nearest cells
        n = a.shape[axis]
        pos = n / 2 - 0.5  # centre in cell-index coordinates
        i0 = int(np.floor(pos))
        t = pos - i0
        lo = np.take(a, i0, axis)
        hi = np.take(a, min(i0 + 1, n - 1), axis)
        return (1 - t) * lo + t * hi

    u = mid(ux, 0)  # (ny,)
    v = mid(uy, 1)  # (nx,)
    y = np.concatenate([[0.0], (np.arange(ny) + 0.5) / ny, [1.0]])
    x = np.concatenate([[0.0], (np.arange(nx) + 0.5) / nx, [1.0]])
    return y, np.concatenate([[0.0], u, [1.0]]), x, np.concatenate([[0.0], v, [0.0]])


def ghia_deviation(ux: np.ndarray, uy: np.ndarray, u_lid: float, reynolds: int) -> dict:
    """Max absolute deviation (in lid speeds) from Ghia et al. at their points.

    Returns:
      ``{"u_max_abs_dev": float, "v_max_abs_dev": float or None, "n_u": int, "n_v": int}``.
    """
    ref = load_ghia(reynolds)
    y, u, x, v = centerlines(ux, uy, u_lid)
    du = np.abs(np.interp(ref["y"], y, u) - ref["u"])
    out = {"u_max_abs_dev": float(du.max()), "n_u": int(du.size), "v_max_abs_dev": None, "n_v": 0}
    if "v" in ref:
        dv = np.abs(np.interp(ref["x"], x, v) - ref["v"])
        out.update(v_max_abs_dev=float(dv.max()), n_v=int(dv.size))
    return out


def _text(value) -> str:
    if isinstance(value, bytes | np.bytes_):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return _text(value.tobytes() if value.dtype.kind == "S" else value[()])
    return str(value)


def _config(h5file: h5py.File) -> dict:
    try:
        return tomllib.loads(_text(h5file.attrs["config"]))
    except (KeyError, tomllib.TOMLDecodeError):
        return {}


def _last_frame(h5file: h5py.File, name: str) -> np.ndarray:
    ds = h5file[name]
    t = h5file["time"][...]
    n = int(np.flatnonzero(np.isfinite(t))[-1]) if np.isfinite(t).any() else ds.shape[0] - 1
    return np.asarray(ds[min(n, ds.shape[0] - 1)], np.float64)


def plot_cavity(h5file: h5py.File, outdir: Path) -> list[Path]:
    """Centre-line profiles of a lid-driven cavity run against the Ghia et al. points.

    Needs 2-D ``ux`` and ``uy`` variables ``(time, y, x)`` and a ``config`` attribute with a
    ``lid`` wall; other ``lbm`` files (periodic, 3-D) give no figure.

    Args:
      h5file: an open simpar grid file of model ``lbm``.
      outdir: a folder, or the data file's path (the PNG then goes next to it).

    Returns:
      ``[<stem>_cavity_centerlines.png]``, or ``[]`` when the file is not a 2-D cavity.
    """
    if not {"ux", "uy"} <= set(h5file) or h5file["ux"].ndim != 3:
        return []
    cfg = _config(h5file)
    boundary = cfg.get("boundary", {})
    if "lid" not in str(boundary):
        return []
    ph = cfg.get("physics", {})
    u_lid = float(ph.get("u_lid", 0.1))
    shape = cfg.get("grid", {}).get("shape", [0])
    re = ph.get("reynolds")
    if re is None and "viscosity" in ph:
        re = u_lid * shape[0] / ph["viscosity"]
    ux = _last_frame(h5file, "ux").T  # stored (y, x) -> (x, y)
    uy = _last_frame(h5file, "uy").T
    y, u, x, v = centerlines(ux, uy, u_lid)
    outdir = Path(outdir)
    stem = Path(h5file.filename).stem
    out = (outdir.parent if outdir.suffix else outdir) / f"{stem}_cavity_centerlines.png"
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(u, y, "-", label=f"simpar lbm {ux.shape[0]}x{ux.shape[1]}")
    ax2.plot(x, v, "-", label=f"simpar lbm {ux.shape[0]}x{ux.shape[1]}")
    title = "lid-driven cavity"
    ref_re = None
    if re is not None:
        title += f", Re = {re:g}"
        for cand in (100, 400, 1000, 5000):
            if abs(re - cand) < 1e-6 * cand:
                ref_re = cand
    if ref_re is not None:
        ref = load_ghia(ref_re)
        ax1.plot(ref["u"], ref["y"], "o", mfc="none", label="Ghia et al. 1982")
        if "v" in ref:
            ax2.plot(ref["x"], ref["v"], "o", mfc="none", label="Ghia et al. 1982")
        dev = ghia_deviation(ux, uy, u_lid, ref_re)
        title += f" (max |dev|: u {dev['u_max_abs_dev']:.4f}"
        title += f", v {dev['v_max_abs_dev']:.4f})" if dev["v_max_abs_dev"] is not None else ")"
    ax1.set_xlabel("u / U  at x = 0.5")
    ax1.set_ylabel("y / L")
    ax2.set_xlabel("x / L")
    ax2.set_ylabel("v / U  at y = 0.5")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=100)
    return [out]
