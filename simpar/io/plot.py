"""Quick-look PNGs of an output file: ``simpar plot OUT.h5`` (the command line's ``plot``).

Grid files (written by :class:`simpar.io.netcdf.GridWriter`; recognised by a ``time``
dimension scale and variables whose first dim is ``time``) give, next to the file:

- ``<stem>_<field>.png`` per 2-D field: the last complete frame (imshow with a
  colorbar, axes extents from the cell-centre coordinates, title with field, time and
  step); for a 3-D field the middle slice along the slowest axis (z);
- signed fields (vorticity, velocities: negative and positive values) use the diverging
  ``RdBu_r`` map centred on 0, other fields ``viridis`` (:func:`color_scale`);
- ``<stem>_<profile>.png`` per profile ``(time, y)``: the last profile; a spectrum
  ``(time, k)`` over a non-spatial wavenumber axis is drawn on log-log axes (``k > 0``);
- ``<stem>_timeseries.png``: every scalar series ``(time,)`` in one figure.

Ensemble files (an ``ensemble`` dimension right after ``time``) show every member: one
panel per member (shared colour scale) for fields, one line per member for profiles and
series, labelled with the member's swept values (``diffusivity = 0.5``).

H5MD particle files (a ``/h5md`` or ``/particles`` group) give
``<stem>_observables.png`` (every ``/observables/*/value`` against time) and
``<stem>_positions.png`` (x-y scatter of the last ``position`` frame), labelled in the
file's true units (``reduced_unit``: sigma and tau for LJ, L and T for N-body; see
``simpar.io.h5md``), not in the Angstrom/ps compatibility labels MDAnalysis needs.
Particle-mesh N-body files (``force = "pm"`` in ``/parameters``) also give
``<stem>_density.png``: the projected density along z (:func:`projected_density`, a 2-D
histogram of the x-y positions normalised to mean 1, log colour scale) of the first and the
last frame side by side.

Models can add their own figures (e.g. lid-driven cavity against reference points):
register a function in :data:`PLOTTERS` under the model name that the file carries in
its ``model`` attribute; it runs in addition to the generic plots.

Figures are drawn with matplotlib's Agg canvas directly (no pyplot), so plotting never
changes the backend or global state of the caller's session.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simpar.errors import ConfigError
from simpar.io.cavity_plot import plot_cavity
from simpar.io.nclayout import EXTRA_DIM_ATTR, EXTRA_DIM_VALUE
from simpar.io.netcdf import variable_dims

__all__ = ["PLOTTERS", "color_scale", "plot_file", "projected_density", "register_plotter"]

Plotter = Callable[[h5py.File, Path], list[Path]]

#: Extra plots per model: ``PLOTTERS[model](file, path) -> written PNG paths``. The
#: function gets the open (read-only) h5py file and the data file's path, and writes
#: its PNGs next to that path (``path.with_name(f"{path.stem}_<what>.png")``).
PLOTTERS: dict[str, Plotter] = {"lbm": plot_cavity}


def register_plotter(model: str) -> Callable[[Plotter], Plotter]:
    """Decorator adding a function to :data:`PLOTTERS` under ``model``."""

    def deco(fn: Plotter) -> Plotter:
        PLOTTERS[model] = fn
        return fn

    return deco


def plot_file(path: str | os.PathLike) -> list[Path]:
    """Write quick-look PNGs of a simpar output file next to it.

    Args:
      path: a grid file (netCDF4-style HDF5) or an H5MD particle file.

    Returns:
      The PNG files written, in the order they were written.

    Raises:
      ConfigError: the file does not exist, cannot be opened (e.g. a running
        simulation still holds it), is neither a grid nor an H5MD file, or holds no
        complete frame yet.
    """
    path = Path(path)
    key = str(path)
    if not path.is_file():
        raise ConfigError(key, "file does not exist")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ConfigError(
            key,
            f"cannot open as HDF5 ({e}); if a run is still writing it, wait for the "
            "run to finish (HDF5 locks files that are open for writing)",
        ) from e
    with f:
        if _is_grid(f):
            written = _plot_grid(f, path)
        elif "h5md" in f or "particles" in f:
            written = _plot_h5md(f, path)
        else:
            raise ConfigError(
                key,
                "neither a simpar grid file (a 'time' dimension with fields) nor an "
                "H5MD particle file (an '/h5md' or '/particles' group)",
            )
        model = _model_name(f)
        if model in PLOTTERS:
            written += list(PLOTTERS[model](f, path))
    return written


def projected_density(pos, box, bins) -> np.ndarray:
    """Surface density along z of particles in a periodic box, relative to its mean.

    Args:
      pos: ``(N, 3)`` positions in ``[0, L)`` (length); box: ``(L_x, L_y, ...)``.
      bins: ``(n_x, n_y)`` histogram cells.

    Returns:
      ``(n_x, n_y)`` float64 counts per cell / mean count (equal-mass particles).
    """
    pos = np.asarray(pos, np.float64)
    h, _, _ = np.histogram2d(
        pos[:, 0], pos[:, 1], bins=bins, range=[[0.0, float(box[0])], [0.0, float(box[1])]]
    )
    return h / max(h.mean(), 1e-300)


@register_plotter("nbody")
def _plot_pm_density(f: h5py.File, path: Path) -> list[Path]:
    par = f.get("parameters")
    if par is None or _text(par.attrs.get("force", "")) != "pm":
        return []
    pos = f["particles/trajectory/position"]
    n = min(pos["value"].shape[0], pos["step"].shape[0])
    if n == 0:
        return []
    box = np.asarray(par.attrs["box"], np.float64)
    bins = tuple(int(b) for b in np.asarray(par.attrs["pm_mesh"])[:2])
    fig = Figure(figsize=(11, 5), layout="constrained")
    frames = [(0, fig.add_subplot(1, 2, 1)), (n - 1, fig.add_subplot(1, 2, 2))]
    maps = [projected_density(pos["value"][i], box, bins) for i, _ in frames]
    top = max(float(m.max()) for m in maps)
    for (i, ax), m in zip(frames, maps, strict=True):
        im = ax.imshow(
            np.log10(np.maximum(m, 1e-2)).T, origin="lower", cmap="magma",
            extent=(0, box[0], 0, box[1]), vmin=-1.0, vmax=np.log10(max(top, 10.0)),
        )  # fmt: skip
        t = float(pos["time"][i])
        ax.set_title(f"t = {t:.3g}, step {int(pos['step'][i])}: max/mean {m.max():.3g}")
        ax.set_xlabel("x")
        ax.set_ylabel("y")
    fig.colorbar(im, ax=[ax for _, ax in frames], label="log10 projected density / mean")
    fig.suptitle(f"{path.name}: projected density along z")
    return [_save(fig, path.with_name(f"{path.stem}_density.png"))]


# --------------------------------------------------------------------------- helpers
def _text(value) -> str:
    if isinstance(value, bytes | np.bytes_):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return _text(value[()])
    return str(value)


def _model_name(f: h5py.File) -> str:
    for obj in (f, f.get("parameters")):
        if obj is not None and "model" in obj.attrs:
            return _text(obj.attrs["model"])
    return ""


def _save(fig: Figure, out: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=100)
    return out


def _units(ds: h5py.Dataset) -> str:
    u = _text(ds.attrs["units"]) if "units" in ds.attrs else ""
    return "" if u in ("", "1") else f" [{u}]"


def _is_grid(f: h5py.File) -> bool:
    t = f.get("time")
    if not isinstance(t, h5py.Dataset) or t.ndim != 1 or not t.is_scale:
        return False
    return any(_time_vars(f))


def _time_vars(f: h5py.File) -> dict[str, tuple[str, ...]]:
    out = {}
    for name, ds in f.items():
        if name in ("time", "step") or not isinstance(ds, h5py.Dataset):
            continue
        dims = variable_dims(ds)
        if dims[:1] == ("time",):
            out[name] = dims
    return out


def _edges(c: np.ndarray) -> tuple[float, float]:
    """Outer cell edges of cell-centre coordinates."""
    d = float(c[1] - c[0]) if c.size > 1 else 1.0
    return float(c[0]) - d / 2, float(c[-1]) + d / 2


# --------------------------------------------------------------------------- grid
def _member_labels(f: h5py.File) -> list[str]:
    """One label per ensemble member, from the swept values stored as coordinates on the
    ``ensemble`` dimension (``diffusivity = 0.5``), else ``member m``."""
    n = f["ensemble"].shape[0]
    swept = [
        name
        for name, ds in f.items()
        if name != "ensemble" and isinstance(ds, h5py.Dataset) and ds.ndim == 1
        and variable_dims(ds) == ("ensemble",) and ds.dtype.kind in "fiu"
    ]  # fmt: skip
    values = {name: f[name][()] for name in swept}
    return [
        ", ".join(f"{k} = {v[m]:g}" for k, v in values.items()) or f"member {m}" for m in range(n)
    ]


def _image_extent(f: h5py.File, spatial: tuple[str, ...]) -> tuple[float, float, float, float]:
    x0, x1 = _edges(f[spatial[-1]][...])
    y0, y1 = _edges(f[spatial[-2]][...])
    return x0, x1, y0, y1


def _plot_grid(f: h5py.File, path: Path) -> list[Path]:
    """Last frame of every field / profile and every scalar series; an ensemble file
    (an ``ensemble`` dimension after ``time``) shows every member: one panel per member
    for fields, one line per member for profiles and series."""
    t = f["time"][...]
    bad = np.flatnonzero(~np.isfinite(t))
    n = int(bad[0]) if bad.size else t.size
    if "step" in f:
        n = min(n, f["step"].shape[0])
    if n == 0:
        raise ConfigError(str(path), "the grid file holds no complete frame yet")
    k = n - 1
    time = float(t[k])
    step = int(f["step"][k]) if "step" in f else k
    tunits = _units(f["time"])
    stamp = f"t = {time:.6g}{tunits}, step {step}"
    labels = _member_labels(f) if isinstance(f.get("ensemble"), h5py.Dataset) else None

    written: list[Path] = []
    series: list[str] = []
    for name, dims in _time_vars(f).items():
        ds = f[name]
        ens = labels is not None and dims[1:2] == ("ensemble",)
        spatial = dims[2:] if ens else dims[1:]
        label = name + _units(ds)
        if not spatial:
            series.append(name)
            continue
        out = path.with_name(f"{path.stem}_{name}.png")
        frame = np.asarray(ds[k], dtype=np.float64)  # ([members,] *spatial)
        panels = list(frame) if ens else [frame]
        names = labels if ens else [None]
        if len(spatial) == 1:
            (ax_name,) = spatial
            c = f[ax_name][...]
            fig = Figure(figsize=(6, 4), layout="constrained")
            ax = fig.add_subplot()
            spectrum = _is_spectral_axis(f[ax_name])
            for prof, who in zip(panels, names, strict=True):
                if spectrum:  # a spectrum over wavenumber: log-log, k > 0 and values > 0
                    keep = c > 0
                    pos = np.where(prof[keep] > 0, prof[keep], np.nan)
                    ax.loglog(c[keep], pos, marker="." if c.size < 50 else None, label=who)
                else:
                    ax.plot(c, prof, marker="." if c.size < 50 else None, label=who)
            if ens:
                ax.legend(fontsize=8)
            ax.set_xlabel(ax_name + _units(f[ax_name]))
            ax.set_ylabel(label)
            ax.set_title(f"{name}, {stamp}")
            ax.grid(True, alpha=0.3)
            written.append(_save(fig, out))
            continue
        title = f"{name}, {stamp}"
        if len(spatial) == 3:  # 3-D: middle slice along the slowest axis
            mid = ds.shape[-3] // 2
            panels = [p[mid] for p in panels]
            title = f"{name} at {spatial[0]} = {f[spatial[0]][mid]:.4g}, {stamp}"
        written.append(_images(f, spatial, panels, names, label, title, out))

    if series:
        written.append(
            _plot_series(
                {name: (t[:n], f[name][:n]) for name in series},
                {name: _units(f[name]) for name in series},
                "time" + tunits,
                path.with_name(f"{path.stem}_timeseries.png"),
                f"{path.name}: {n} frames, last {stamp}",
                labels,
            )
        )
    return written


def _is_spectral_axis(ds: h5py.Dataset) -> bool:
    """A non-spatial dimension (``GridWriter(extra_dims=...)``, e.g. the wavenumber ``k`` of
    an energy spectrum) with positive values past the first: drawn on log-log axes."""
    if EXTRA_DIM_ATTR not in ds.attrs or _text(ds.attrs[EXTRA_DIM_ATTR]) != EXTRA_DIM_VALUE:
        return False
    c = np.asarray(ds[()], dtype=np.float64)
    return c.size > 1 and bool(np.all(c[1:] > 0))


def color_scale(panels) -> tuple[str, float, float]:
    """Colormap and limits shared by image panels: ``(cmap, vmin, vmax)``.

    A signed field (negative and positive values, e.g. vorticity or a velocity component)
    gets the diverging ``"RdBu_r"`` centred on 0 (``vmin = -vmax``, 0 white); any other
    field the sequential ``"viridis"`` over its range. Non-finite values are ignored.
    """
    finite = [p[np.isfinite(p)] for p in panels]
    lo = min((float(v.min()) for v in finite if v.size), default=0.0)
    hi = max((float(v.max()) for v in finite if v.size), default=1.0)
    if lo < 0 < hi:
        m = max(-lo, hi)
        return "RdBu_r", -m, m
    return "viridis", lo, hi


def _images(f, spatial, panels, names, label, title, out: Path) -> Path:
    """One imshow panel per member (a shared colour scale, :func:`color_scale`), 4 panels a
    row at most."""
    x0, x1, y0, y1 = _image_extent(f, spatial)
    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    aspect = (y1 - y0) / max(x1 - x0, 1e-300)
    width = 6.5 if cols == 1 else 3.2 * cols + 1.0
    height = rows * float(np.clip(width / cols * aspect * 0.85, 2.0, 9.0)) + 0.6
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    cmap, lo, hi = color_scale(panels)
    im = None
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.set_visible(False)
            continue
        im = ax.imshow(
            panels[i], origin="lower", extent=(x0, x1, y0, y1), interpolation="nearest",
            aspect="equal", vmin=lo, vmax=hi, cmap=cmap,
        )  # fmt: skip
        ax.set_xlabel(spatial[-1] + _units(f[spatial[-1]]))
        ax.set_ylabel(spatial[-2] + _units(f[spatial[-2]]))
        if names[i] is not None:
            ax.set_title(names[i], fontsize=9)
    fig.colorbar(im, ax=axes, label=label)
    if len(panels) > 1:
        fig.suptitle(title, fontsize=10)
    else:
        axes[0, 0].set_title(title, fontsize=10)
    return _save(fig, out)


def _plot_series(
    data: dict[str, tuple[np.ndarray, np.ndarray]],
    units: dict[str, str],
    xlabel: str,
    out: Path,
    title: str,
    labels: list[str] | None = None,
) -> Path:
    """One subplot per series, shared x axis; a ``[T, k]`` value gives k lines (labelled
    ``labels[j]``, e.g. the ensemble members, when there are k of them)."""
    m = len(data)
    fig = Figure(figsize=(7, 1.0 + 2.0 * m), layout="constrained")
    axes = fig.subplots(m, 1, sharex=True, squeeze=False)[:, 0]
    for ax, (name, (x, y)) in zip(axes, data.items(), strict=True):
        y = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
        for j in range(y.shape[1]):
            lbl = f"{name}[{j}]" if y.shape[1] > 1 else None
            if labels is not None and len(labels) == y.shape[1] > 1:
                lbl = labels[j]
            ax.plot(x, y[:, j], marker="." if len(x) < 50 else None, label=lbl)
        if y.shape[1] > 1:
            ax.legend(fontsize=8)
        ax.set_ylabel(name + units.get(name, ""))
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel(xlabel)
    axes[0].set_title(title, fontsize=10)
    return _save(fig, out)


# --------------------------------------------------------------------------- H5MD
def _h5md_unit(ds: h5py.Dataset) -> str:
    """Axis-label suffix: the true unit (``reduced_unit`` where simpar wrote MDAnalysis
    compatibility labels such as "A" for sigma), else ``unit``; none for "1"."""
    for key in ("reduced_unit", "unit"):
        if key in ds.attrs:
            u = _text(ds.attrs[key])
            return f" [{u}]" if u and u != "1" else ""
    return ""


def _plot_h5md(f: h5py.File, path: Path) -> list[Path]:
    written: list[Path] = []
    obs = f.get("observables")
    data, units = {}, {}
    xlabel = "time"
    if isinstance(obs, h5py.Group):
        for name, g in obs.items():
            if not isinstance(g, h5py.Group) or "value" not in g:
                continue
            v = g["value"]
            if v.ndim == 0:
                continue  # time-independent
            if "time" in g and g["time"].ndim == 1:
                x = g["time"][...]
                xlabel = "time" + _h5md_unit(g["time"])
            elif "step" in g and g["step"].ndim == 1:
                x = g["step"][...]
                xlabel = "step"
            else:
                x = np.arange(v.shape[0])
                xlabel = "frame"
            n = min(len(x), v.shape[0])
            if n == 0:
                continue
            data[name] = (x[:n], v[:n])
            units[name] = _h5md_unit(v)
    if data:
        written.append(
            _plot_series(
                data,
                units,
                xlabel,
                path.with_name(f"{path.stem}_observables.png"),
                f"{path.name}: observables",
            )
        )

    parts = f.get("particles")
    if isinstance(parts, h5py.Group):
        for gname, g in parts.items():
            pos = g.get("position") if isinstance(g, h5py.Group) else None
            if not isinstance(pos, h5py.Group) or "value" not in pos:
                continue
            v = pos["value"]
            n = v.shape[0]
            if "step" in pos and pos["step"].ndim == 1:
                n = min(n, pos["step"].shape[0])
            if "time" in pos and pos["time"].ndim == 1:
                n = min(n, pos["time"].shape[0])
            if n == 0 or v.ndim != 3 or v.shape[2] < 2:
                continue
            xy = np.asarray(v[n - 1, :, :2], dtype=np.float64)
            stamp = f"frame {n - 1}"
            if "time" in pos and pos["time"].ndim == 1:
                stamp = f"t = {float(pos['time'][n - 1]):.6g}" + _h5md_unit(pos["time"])
            if "step" in pos and pos["step"].ndim == 1:
                stamp += f", step {int(pos['step'][n - 1])}"
            colour = None
            species = g.get("species")
            if isinstance(species, h5py.Dataset) and species.shape == (xy.shape[0],):
                colour = species[...]
            fig = Figure(figsize=(6, 6), layout="constrained")
            ax = fig.add_subplot()
            ax.scatter(
                xy[:, 0], xy[:, 1], s=4, c=colour, cmap="tab10" if colour is not None else None
            )
            edges = g.get("box/edges/value")
            if isinstance(edges, h5py.Dataset) and edges.shape[0] >= n and edges.ndim == 2:
                # simpar boxes span [0, L); the outline shows it, limits stay auto.
                lx, ly = (float(e) for e in edges[n - 1, :2])
                ax.plot([0, lx, lx, 0, 0], [0, 0, ly, ly, 0], "k-", lw=0.8)
            ax.set_aspect("equal")
            unit = _h5md_unit(v)
            ax.set_xlabel("x" + unit)
            ax.set_ylabel("y" + unit)
            ax.set_title(f"{gname}: {xy.shape[0]} particles, {stamp}", fontsize=10)
            written.append(_save(fig, path.with_name(f"{path.stem}_positions.png")))
            break  # one particle group (simpar writes "trajectory")
    if not written:
        raise ConfigError(str(path), "the H5MD file holds no observables and no position frame yet")
    return written
