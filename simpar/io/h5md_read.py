"""Reading H5MD files from outside (``system.file`` states to continue from), checked first.

``read_frame`` returns one frame of an H5MD 1.1 file (simpar's, see ``simpar.io.h5md``, or
another code's) as NumPy arrays. The file is untrusted (``simpar.io.untrusted``): every element
is checked from its metadata before any data is read, and ``check_box`` refuses box edges a
run cannot use. Every refusal is a ``ConfigError`` naming the file and the dataset.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

from simpar.errors import ConfigError
from simpar.io import untrusted


def _particles_group(f: h5py.File, group: str | None, key: str = "system.file"):
    path = f.filename
    if f.get("particles", getlink=True) is None:
        raise ConfigError(key, f"{path}: no /particles group (not an H5MD file?)")
    parts = untrusted.child(f, "particles", path, key, dataset=False)
    if not len(parts):
        raise ConfigError(key, f"{path}: no /particles group (not an H5MD file?)")
    if group is None:
        group = "trajectory" if "trajectory" in list(parts) else sorted(parts)[0]
    if group not in list(parts):  # names only: a membership test would follow links
        raise ConfigError(key, f"{path}: no particles group {group!r} ({sorted(parts)})")
    return untrusted.child(parts, group, path, key, dataset=False)


def n_frames(path: str | os.PathLike, group: str | None = None) -> int:
    """Number of complete frames (frames whose ``step`` was written)."""
    with h5py.File(path, "r") as f:
        pos = _particles_group(f, group)["position"]
        return min(pos["value"].shape[0], pos["step"].shape[0])


def _element(parent, name, path, key, *, shape, kinds, total=None):
    """An H5MD element of ``parent``: (value, step, time) datasets after the metadata checks
    (``simpar.io.untrusted``); a time-independent element (a bare dataset) gives
    (value, None, None). ``shape`` is the shape of one frame (``None`` entries: any)."""
    link = parent.get(name, getlink=True)
    if isinstance(link, h5py.HardLink) and isinstance(parent[name], h5py.Dataset):
        ds = untrusted.child(parent, name, path, key)
        untrusted.check_dataset(ds, path, key, shape=shape, kinds=kinds)
        return ds, None, None
    grp = untrusted.child(parent, name, path, key, dataset=False)
    value = untrusted.child(grp, "value", path, key)
    untrusted.check_dataset(value, path, key, shape=(None, *shape), kinds=kinds)
    out = [value]
    for sub, sub_kinds in (("step", "iu"), ("time", "fiu")):
        ds = untrusted.child(grp, sub, path, key)
        if ds.ndim != 0:
            untrusted.check_dataset(ds, path, key, shape=(None,), kinds=sub_kinds)
        else:
            untrusted.check_dataset(ds, path, key, shape=(), kinds=sub_kinds)
        out.append(ds)
    if total is not None and value.shape[0] < total:
        raise ConfigError(
            key, f"{path}: {value.name} has {value.shape[0]} frames; position has {total}"
        )
    return tuple(out)


def read_frame(
    path: str | os.PathLike,
    frame: int = -1,
    group: str | None = None,
    *,
    key: str = "system.file",
    cell_length: float | None = None,
) -> dict:
    """One frame of an H5MD file (ours or another code's), as NumPy arrays.

    The file is untrusted (``simpar.io.untrusted``): every element read is checked from its
    metadata first, so a crafted file is refused before any data is read: links (external
    or soft) and data stored outside the file (external storage, virtual datasets) are
    refused, values must be plain floats of shape [T, N, 3] (position, velocity, force),
    [T, 3] or [T, 3, 3] (box edges), [N] (mass), integer steps, and one frame must fit the
    memory available; box edges must be finite and >= 0.

    Args:
      path: the file.
      frame: frame index (negative counts from the last complete frame).
      group: particles group (default ``trajectory``, else the first one).
      key: the config key or option named in errors (default ``"system.file"``).
      cell_length: the interaction length (cutoff + skin, in the file's length unit) of
        the run the frame will start: when given, a periodic box is refused if its cell
        grid (``check_box``) cannot be built.

    Returns:
      dict with ``position`` [N,3], ``velocity`` [N,3] or None, ``force`` or None,
      ``box`` [3] (None without edges), ``boundary`` (list of str), ``step`` (int),
      ``time`` (float), ``mass`` [N] or None, ``rng_key`` uint32[2] or None, and
      ``observables`` (dict of floats at that frame), ``unit_system`` (``"lj"``,
      ``"nbody"``, ``"SI"``, ... or None). Values are not unit-converted.

    Raises:
      ConfigError (``key``): the file has no particles group, no position, not that frame,
        or a damaged or crafted element (the message names the file and the dataset).
    """
    path = os.fspath(path)
    with untrusted.no_plugins(), h5py.File(path, "r") as f:
        g = _particles_group(f, group, key)
        if g.get("position", getlink=True) is None:
            raise ConfigError(key, f"{path}: no position element in {g.name}")
        value, step, time = _element(g, "position", path, key, shape=(None, 3), kinds="f")
        if step is None:
            raise ConfigError(key, f"{path}: {g.name}/position is not time-dependent")
        total = min(value.shape[0], step.shape[0] if step.ndim else value.shape[0])
        if total == 0:
            raise ConfigError(key, f"{path}: no complete frame")
        k = frame + total if frame < 0 else frame
        if not 0 <= k < total:
            raise ConfigError(key, f"{path}: frame {frame} out of range (file has {total})")
        n = value.shape[1]
        frame_bytes = n * 3 * value.dtype.itemsize
        if n < 1:
            raise ConfigError(key, f"{path}: {value.name} holds no particles")
        untrusted.check_size(frame_bytes, value.name, path, key)  # before the other elements
        els = {"position": (value, step, time)}
        for name in ("velocity", "force"):
            if g.get(name, getlink=True) is not None:
                els[name] = _element(g, name, path, key, shape=(n, 3), kinds="f", total=total)
                frame_bytes += n * 3 * els[name][0].dtype.itemsize
        mass = None
        if g.get("mass", getlink=True) is not None:
            mass = _element(g, "mass", path, key, shape=(n,), kinds="fiu")[0]
            frame_bytes += n * mass.dtype.itemsize
        untrusted.check_size(frame_bytes, value.name, path, key)
        out = {
            "position": np.asarray(value[k]),
            "step": int(step[k]) if step.ndim else int(step[()]),
            "n_frames": total,
        }
        out["time"] = float(time[k]) if time.ndim else float(time[()]) * out["step"]
        for name in ("velocity", "force"):
            out[name] = np.asarray(els[name][0][k]) if name in els else None
        boundary = ["periodic"] * 3
        out["box"] = None
        if g.get("box", getlink=True) is not None:
            box = untrusted.child(g, "box", path, key, dataset=False)
            if "boundary" in box.attrs:
                boundary = _boundary(box, path, key)
            if box.get("edges", getlink=True) is not None:
                out["box"] = _edges(box, path, key, k, total)
                check_box(path, out["box"], boundary, cell_length, key)
        out["boundary"] = boundary
        out["mass"] = np.asarray(mass[()]) if mass is not None else None
        out["rng_key"] = None
        params = None
        if f.get("parameters", getlink=True) is not None:
            params = untrusted.child(f, "parameters", path, key, dataset=False)
            if params.get("rng_key", getlink=True) is not None:
                rk = _element(params, "rng_key", path, key, shape=(2,), kinds="u", total=total)
                out["rng_key"] = np.asarray(rk[0][k])
        obs = {}
        if f.get("observables", getlink=True) is not None:
            og = untrusted.child(f, "observables", path, key, dataset=False)
            for name in og:
                if not isinstance(og.get(name, getlink=True), h5py.HardLink):
                    continue  # never followed; observables are informative only
                el = og[name]
                if not isinstance(el, h5py.Group) or not isinstance(
                    el.get("value", getlink=True), h5py.HardLink
                ):
                    continue
                v = el["value"]
                if (
                    isinstance(v, h5py.Dataset)
                    and v.ndim == 1
                    and v.dtype.kind in "fiu"
                    and not v.is_virtual
                    and not v.external
                    and v.shape[0] > k
                ):
                    obs[name] = float(v[k])
        out["observables"] = obs
        system = None
        mod = f
        for part in ("h5md", "modules", "units"):  # hard links only, never followed out
            link = mod.get(part, getlink=True) if isinstance(mod, h5py.Group) else None
            mod = mod[part] if isinstance(link, h5py.HardLink) else None
        if isinstance(mod, h5py.Group):
            system = untrusted.attr(mod, "system", path, key, kinds="T", required=False)
        if system is None and params is not None:
            system = untrusted.attr(params, "unit_system", path, key, kinds="T", required=False)
        out["unit_system"] = system
        return out


def _edges(box, path, key, k, total) -> np.ndarray:
    """Box edges float[3] at frame ``k`` (time-dependent or not; a [3, 3] matrix gives its
    diagonal), checked from the metadata first."""
    untrusted.child(box, "edges", path, key, dataset=None)
    obj = box["edges"]
    if isinstance(obj, h5py.Dataset):
        shape = (3,) if obj.ndim <= 1 else (3, 3)
        edges = np.asarray(_element(box, "edges", path, key, shape=shape, kinds="f")[0][()])
    else:
        value = untrusted.child(obj, "value", path, key)
        shape = (3,) if value.ndim <= 2 else (3, 3)
        el = _element(box, "edges", path, key, shape=shape, kinds="f", total=total)
        edges = np.asarray(el[0][k])
    return np.diag(edges) if edges.ndim == 2 else edges


def _boundary(box, path, key) -> list[str]:
    """The ``boundary`` attribute of a box group: three of ``"periodic"`` / ``"none"``."""
    aid = h5py.h5a.open(box.id, b"boundary")
    text = aid.dtype.kind == "S" or h5py.check_string_dtype(aid.dtype) is not None
    if not text or aid.shape not in ((3,), (1,), ()):
        raise ConfigError(
            key,
            f"{path}: {box.name} attribute 'boundary' is {aid.dtype} {aid.shape}; "
            "expected 3 strings",
        )
    raw = np.atleast_1d(box.attrs["boundary"])
    out = [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in raw]
    out = out * 3 if len(out) == 1 else out
    bad = [b for b in out if b not in ("periodic", "none")]
    if bad:
        raise ConfigError(
            key,
            f"{path}: {box.name} attribute 'boundary' is {out}; each must be 'periodic' or 'none'",
        )
    return out


def check_box(path, edges, boundary, cell_length: float | None, key: str = "system.file"):
    """Refuse box edges a run cannot use, naming ``/particles/trajectory/box/edges/value``.

    Args:
      path: the file (named in errors).
      edges: float[3] edge lengths (in the file's length unit).
      boundary: ``"periodic"`` / ``"none"`` per axis.
      cell_length: cutoff + skin of the run (same unit), or None to check only that the
        edges are finite and >= 0. A periodic box is cut into cells of at least this
        length for the neighbour search: the cell count must stay below 2^31 (int32
        indices) and the cell grid (8 bytes a cell at least) must fit the memory available.
        Box edges of 1e12 with a cutoff of 2.5 give 6e34 cells: refused.
      key: the config key or option named in errors.

    Raises:
      ConfigError: edges not finite or negative, or a cell grid that cannot be built.
    """
    where = f"{os.fspath(path)}: /particles/trajectory/box/edges/value"
    e = np.asarray(edges, dtype=np.float64).reshape(-1)
    if e.shape != (3,) or not np.all(np.isfinite(e)) or np.any(e < 0):
        raise ConfigError(key, f"{where} must be 3 finite edge lengths >= 0, got {e.tolist()}")
    if cell_length is None or not all(b == "periodic" for b in boundary):
        return
    cells = 1.0
    for x in e:
        cells *= max(np.floor(x / float(cell_length)), 1.0)
    from simpar.memory import available_bytes

    avail = available_bytes()
    if cells >= 2**31 or (avail is not None and cells * 8 > avail):
        raise ConfigError(
            key,
            f"{where} is {e.tolist()}: a periodic box of {cells:.3g} neighbour cells of "
            f"{float(cell_length):g} (cutoff + skin); at most {2**31 - 1} cells fit "
            "int32 indices and the memory available (damaged file, or another unit?)",
        )


def check_h5md_output(path, *, step: int | None, like=None, key: str = "--resume") -> None:
    """Refuse an H5MD output (``simpar.io.h5md``) that ``--resume`` must not append to.

    Every time-dependent element (a ``value`` with an unlimited first axis under
    ``/particles``, ``/observables`` or ``/parameters``) must be appendable, share
    ``position``'s ``step`` and ``time`` (hard links to the same datasets) and hold the kept
    frames. Arguments as :func:`check_grid_output` (``like(path) -> H5MDWriter``).

    Raises:
      ConfigError: naming the file and the dataset.
    """
    with untrusted._checked(path, like, key) as (f, datasets, _):
        grp = f
        for name in ("particles", "trajectory", "position"):
            grp = untrusted.child(grp, name, path, key, dataset=False)
        value = untrusted.child(grp, "value", path, key)
        steps = untrusted.child(grp, "step", path, key)
        time = untrusted.child(grp, "time", path, key)
        untrusted.check_dataset(value, path, key, shape=(None, None, 3), kinds="f")
        untrusted.check_dataset(steps, path, key, shape=(None,), dtype="int64")
        untrusted.check_dataset(time, path, key, shape=(None,), dtype="float64")
        ids = {"step": steps.id, "time": time.id}
        elements = []
        for name, ds in datasets.items():
            top = name.split("/", 1)[0]
            if top in ("particles", "observables", "parameters") and name.endswith("/value") \
                    and ds.maxshape[:1] == (None,):  # fmt: skip
                untrusted._appendable(path, ds, key)
                parent = ds.parent
                for member, oid in ids.items():
                    other = parent.get(member)
                    if not isinstance(other, h5py.Dataset) or other.id != oid:
                        raise ConfigError(key, f"{os.fspath(path)}: {parent.name}/{member} "
                                          f"is not the shared {grp.name}/{member}")  # fmt: skip
                elements.append(ds)
        if value.maxshape[:1] != (None,):
            untrusted._appendable(path, value, key)
        total = min(value.shape[0], steps.shape[0])
        keep = untrusted._steps(path, steps, total, step, key)
        untrusted._rows(path, [*elements, time], keep, key)
