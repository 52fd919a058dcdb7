"""The netCDF4-on-HDF5 layout of grid files: reserved names, attribute text, plain readers.

Shared by the writer (:class:`simpar.io.netcdf.GridWriter`, which documents the layout) and
its XDMF sidecar (:mod:`simpar.io.xdmf`); the readers need only h5py. Text attributes are
fixed-length (NC_CHAR): vlen strings break ParaView's CF reader; ASCII text is stored as
``np.bytes_``, text with non-ASCII characters as a fixed-length string with the UTF-8
character set, so that h5netcdf decodes it correctly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from simpar.errors import ConfigError
from simpar.io.files import GRID_SUFFIXES, check_grid_path

__all__ = [
    "ENSEMBLE",
    "GRID_SUFFIXES",
    "RESERVED",
    "STEP",
    "TIME",
    "attr_value",
    "EXTRA_DIM_ATTR",
    "EXTRA_DIM_VALUE",
    "check_extra_dims",
    "check_grid_path",
    "check_variables",
    "chunk_shape",
    "decode_attr",
    "n_committed",
    "open_frames",
    "read_attrs",
    "set_attrs",
    "text_attr",
    "variable_dims",
]

TIME = "time"
STEP = "step"
ENSEMBLE = "ensemble"  # optional member dimension, right after time
RESERVED = (TIME, STEP, ENSEMBLE)
# What a grid run writes to: netCDF-4 (.nc, .nc4) or plain HDF5 (.h5, .hdf5); particle runs
# write H5MD and need ``.h5md`` (the suffix by which MDAnalysis recognises it).
# Marks the coordinate variable of a non-spatial dimension (``GridWriter(extra_dims=...)``),
# so that a reopened file keeps it out of the spatial axes (the XDMF mesh).
EXTRA_DIM_ATTR = "simpar_dimension"
EXTRA_DIM_VALUE = "non-spatial"


def text_attr(value: str) -> np.ndarray | np.bytes_:
    """A fixed-length (NC_CHAR) string attribute value for ``value``."""
    data = value.encode("utf-8")
    if value.isascii():
        return np.bytes_(data)
    # Fixed-length with the UTF-8 cset: still NC_CHAR, and h5netcdf decodes it right.
    return np.array(data, dtype=h5py.string_dtype("utf-8", max(len(data), 1)))


def attr_value(key: str, value: Any) -> Any:
    """Convert a Python/NumPy metadata value to what goes into an HDF5 attribute."""
    if isinstance(value, str):
        return text_attr(value)
    if isinstance(value, bytes | np.bytes_):
        return np.bytes_(value)
    if isinstance(value, bool | np.bool_):
        return np.int8(value)  # netCDF has no boolean type
    if isinstance(value, int | np.integer):
        return np.int64(value)
    if isinstance(value, float | np.floating):
        return np.float64(value)
    if isinstance(value, Path):
        return text_attr(str(value))
    if isinstance(value, list | tuple | np.ndarray):
        arr = np.asarray(value)
        if arr.dtype.kind in "US":
            return text_attr(", ".join(str(v) for v in arr.ravel()))
        if arr.dtype.kind == "b":
            return arr.astype(np.int8)
        if arr.dtype.kind in "iuf" and arr.ndim <= 1:
            return arr
    raise ValueError(
        f"attribute {key!r}: cannot store {type(value).__name__} {value!r}; use a "
        "string, a number or a 1-D numeric array"
    )


def decode_attr(value: Any) -> Any:
    """Attribute value as read by h5py -> ``str`` for text, NumPy otherwise."""
    if isinstance(value, bytes | np.bytes_):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value).decode("latin-1")
    if isinstance(value, np.ndarray) and value.dtype.kind in "SO" and value.ndim == 0:
        return decode_attr(value[()])
    return value


def set_attrs(obj: h5py.HLObject, attrs: Mapping[str, Any]) -> None:
    """Store ``attrs`` on ``obj`` (a file, group or dataset) with :func:`attr_value`;
    ``None`` values are skipped."""
    for key, value in attrs.items():
        if value is None:
            continue
        obj.attrs[key] = attr_value(key, value)


def check_ensemble_coords(
    coords: Mapping[str, Mapping[str, Any]] | None, members: int | None, taken: list[str]
) -> dict[str, dict[str, Any]]:
    """Validate ``GridWriter``'s ``ensemble_coords``: 1-D numbers, one per member, names not
    taken."""
    if not coords:
        return {}
    if members is None:
        raise ValueError("ensemble_coords needs ensemble=<number of members>")
    out = {}
    for name, spec in coords.items():
        data = np.asarray(spec["data"])
        if name in RESERVED or name in taken or "/" in name or not name:
            raise ValueError(f"ensemble coordinate name {name!r} is reserved or taken")
        if data.shape != (members,) or data.dtype.kind not in "fiu":
            raise ValueError(f"ensemble coordinate {name!r}: {members} numbers expected")
        out[name] = {**spec, "data": data}
    return out


_MAX_CHUNK_BYTES = 64 * 2**20  # split the slowest axes of bigger frames (4 GiB limit)


def chunk_shape(spatial_shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Chunk shape ``(1, *spatial)`` of a ``[T, *spatial]`` variable, with the slowest axes
    halved while a chunk is over 64 MiB."""
    chunk = [1, *spatial_shape]
    axis = 1
    while math.prod(chunk) * itemsize > _MAX_CHUNK_BYTES and axis < len(chunk):
        if chunk[axis] > 1:
            chunk[axis] = (chunk[axis] + 1) // 2
        else:
            axis += 1
    return tuple(chunk)


def check_extra_dims(
    extra: Mapping[str, Mapping[str, Any]] | None, taken: list[str]
) -> dict[str, dict[str, Any]]:
    """Validate ``GridWriter``'s ``extra_dims``: non-empty 1-D numbers, names not taken.

    Args:
      extra: name -> ``{"data": (n,) numbers, "units": str, "long_name": str}``.
      taken: names already used (spatial axes, ensemble coordinates).

    Returns:
      Copies of the specs with ``data`` as a NumPy array.

    Raises:
      ValueError: a reserved or taken name, data not a non-empty 1-D numeric array.
    """
    out = {}
    for name, spec in (extra or {}).items():
        data = np.asarray(spec["data"])
        if name in RESERVED or name in taken or "/" in name or not name:
            raise ValueError(f"extra dimension name {name!r} is reserved or taken")
        if data.ndim != 1 or data.size < 1 or data.dtype.kind not in "fiu":
            raise ValueError(f"extra dimension {name!r}: data must be 1-D numbers")
        out[name] = {**spec, "data": data}
    return out


def check_variables(
    variables: Mapping[str, Mapping[str, Any]],
    axes: list[str],
    ensemble: bool = False,
    extra: tuple[str, ...] = (),
) -> dict[str, dict[str, Any]]:
    """Validate :class:`~simpar.io.netcdf.GridWriter` variable specs.

    Args:
      variables: name -> spec (``"dims"``, optional ``"dtype"``, see ``GridWriter``).
      axes: the spatial axis names in C order, e.g. ``["y", "x"]``.
      ensemble: whether ``"ensemble"`` may follow ``"time"``.
      extra: non-spatial dimension names, in order, that may follow ``"time"`` (and
        ``"ensemble"``), before the spatial dims.

    Returns:
      Copies of the specs with ``dims`` as tuples and ``dtype`` a ``np.dtype``.

    Raises:
      ValueError: a reserved or invalid name, dims out of order, a non-numeric dtype.
    """
    if not variables:
        raise ValueError("variables must name at least one variable")
    out = {}
    for name, spec in variables.items():
        if name in RESERVED or name in axes:
            raise ValueError(f"variable name {name!r} is reserved")
        if "/" in name or not name:
            raise ValueError(f"invalid variable name {name!r}")
        dims = tuple(spec.get("dims", ()))
        spatial = dims[2:] if ensemble and dims[1:2] == (ENSEMBLE,) else dims[1:]
        lead = 0  # the non-spatial dims come first
        while lead < len(spatial) and spatial[lead] in extra:
            lead += 1
        named, spatial = list(spatial[:lead]), spatial[lead:]
        order = [axes.index(d) for d in spatial if d in axes]
        in_order = order == sorted(set(order)) and named == [d for d in extra if d in named]
        if not dims or dims[0] != TIME or len(order) != len(spatial) or not in_order:
            raise ValueError(
                f"variable {name!r}: dims {dims} must be 'time', then any of {extra} in "
                f"that order, then spatial dims in the order {tuple(axes)} (any subset)"
            )
        dtype = np.dtype(spec.get("dtype", "float32"))
        if dtype.kind not in "fiu":
            raise ValueError(f"variable {name!r}: dtype {dtype} is not numeric")
        out[name] = {**spec, "dims": dims, "dtype": dtype}
    return out


def variable_dims(ds: h5py.Dataset) -> tuple[str, ...]:
    """Dimension names of an h5py dataset, from its attached dimension scales.

    Args:
      ds: a dataset of a netCDF4-style HDF5 file.

    Returns:
      One name per axis (``"time"``, ``"y"``, ``"x"`` ...); ``""`` for an axis without
      an attached scale.
    """
    names = []
    for dim in ds.dims:
        if len(dim):
            names.append(dim[0].name.rsplit("/", 1)[-1])
        else:
            names.append("")
    return tuple(names)


def n_committed(f: h5py.File) -> int:
    """Number of complete frames: rows of ``time`` up to the first NaN."""
    t = f[TIME][...]
    bad = np.flatnonzero(~np.isfinite(t))
    return int(bad[0]) if bad.size else int(t.shape[0])


def open_frames(
    path: str | os.PathLike,
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Read every complete frame of a grid file with plain h5py.

    Args:
      path: a file written by :class:`GridWriter`.

    Returns:
      ``(times, steps, values)``: times float64 ``[T]``, steps int64 ``[T]`` and
      ``{name: array [T, *spatial]}`` for every variable with time as its first dim.
      ``T`` counts complete frames only (a frame cut short by a crash is left out).
    """
    with h5py.File(path, "r") as f:
        n = min(n_committed(f), f[STEP].shape[0])
        times = f[TIME][:n]
        steps = f[STEP][:n]
        values = {}
        for name, ds in f.items():
            if name in RESERVED or not isinstance(ds, h5py.Dataset):
                continue
            if variable_dims(ds)[:1] == (TIME,):
                values[name] = ds[:n]
    return times, steps, values


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """Global attributes of an HDF5 file, text decoded to ``str``.

    Args:
      path: any HDF5 file.

    Returns:
      Attribute name -> value (``str`` for text, NumPy scalars/arrays otherwise).
    """
    with h5py.File(path, "r") as f:
        return {k: decode_attr(v) for k, v in f.attrs.items()}


def check_grid_output(path, *, step: int | None, like=None, key: str = "--resume") -> None:
    """Refuse a grid output (``simpar.io.netcdf``) that ``--resume`` must not append to.

    Args:
      path: the output file.
      step: the checkpoint's step (a frame must sit there); None: no restart step.
      like: ``like(path) -> GridWriter``: the writer of a new file of this run (the
        expected layout), or None (then only the generic checks).
      key: the option named in errors.

    Raises:
      ConfigError: naming the file and the dataset.
    """
    from simpar.io import untrusted

    with untrusted._checked(path, like, key) as (f, datasets, tmpl):
        for name in (TIME, STEP):
            if f.get(name, getlink=True) is None:
                raise ConfigError(key, f"{os.fspath(path)} is not a simpar grid file (no /{name})")
        time = untrusted.child(f, TIME, path, key)
        steps = untrusted.child(f, STEP, path, key)
        untrusted.check_dataset(time, path, key, shape=(None,), dtype="float64")
        untrusted.check_dataset(steps, path, key, shape=(None,), dtype="int64")
        untrusted.check_size(16 * time.shape[0], time.name, path, key)
        timed = []
        for ds in datasets.values():
            dims = variable_dims(ds)
            if tmpl is not None and ds.name in tmpl and variable_dims(tmpl[ds.name]) != dims:
                raise ConfigError(key, f"{os.fspath(path)}: dataset {ds.name} has dimensions "
                                  f"{dims}; expected {variable_dims(tmpl[ds.name])}")  # fmt: skip
            if dims[:1] == (TIME,):
                untrusted._appendable(path, ds, key)
                timed.append(ds)
        total = min(n_committed(f), steps.shape[0])
        keep = untrusted._steps(path, steps, total, step, key)
        untrusted._rows(path, timed, keep, key)
