"""Initial fields from a file (``initial.kind = "file"``), checked against the run's plan.

A grid or spectral run can start from

- a netCDF4 (HDF5) file, e.g. the output of an earlier ``simpar run``: one variable per
  field, named as the field, stored ``(time, [z,] y, x)`` (or ``([z,] y, x)`` without a
  time axis), frame ``initial.frame`` (default: the last complete one; negative values count
  from the end);
- a ``.npy`` file holding one field (models with a single state field): ``([z,] y, x)`` or
  ``(time, [z,] y, x)``.

Files store the *reverse* of the Python axis order (``u[x, y]`` in memory is
``u(time, y, x)`` in the file, as every simpar output), so a field read here is transposed
back. The file is untrusted input, as for ``--resume``: names, shapes, dtypes, storage
(no links, external or virtual datasets) and the memory needed are checked from the metadata
(``simpar.io.untrusted``) before one frame is read; a ``.npy`` is opened without pickles and
its header checked before its data is read. Every refusal is one ``ConfigError`` naming the
key, the file and what was expected.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from simpar.errors import ConfigError

KINDS = (".nc", ".nc4", ".h5", ".hdf5", ".npy")
"""File name endings ``initial.path`` accepts."""


def _shape(s) -> str:
    return "(" + ", ".join(map(str, s)) + ")"


def _check(name: str, shape, dtype, want_shape, want_dtype, where: str, key: str) -> None:
    """A frame's shape (file order) and dtype against the plan's (Python order)."""
    file_order = tuple(reversed(want_shape))
    if tuple(shape) != file_order:
        if tuple(shape) == tuple(want_shape):
            raise ConfigError(
                key,
                f"{where}: {name} is {_shape(shape)}, the transpose of the run's field: "
                f"files store (time, [z,] y, x), i.e. {_shape(file_order)} here; transpose it",
            )
        raise ConfigError(
            key,
            f"{where}: {name} is {_shape(shape)} per frame; the run needs {_shape(file_order)} "
            "(file order: [z,] y, x; check grid.shape)",
        )
    if np.dtype(dtype) != np.dtype(want_dtype):
        raise ConfigError(
            key,
            f"{where}: {name} is {np.dtype(dtype)}; the run's field is {np.dtype(want_dtype)} "
            "(grid.dtype): convert the file or set grid.dtype",
        )


def _frame(n: int, frame: int | None, where: str, key: str) -> int:
    if n == 0:
        raise ConfigError(key, f"{where} holds no complete frame")
    k = n - 1 if frame is None else frame
    k = k + n if k < 0 else k
    if not 0 <= k < n:
        raise ConfigError(key, f"{where} holds {n} frames (0 .. {n - 1}); got frame {frame}")
    return k


def _read_npy(path: Path, frame, expected: dict, keys) -> dict:
    path_key, frame_key = keys
    if len(expected) != 1:
        raise ConfigError(
            path_key,
            f"{path}: a .npy file holds one array; this model has the fields "
            f"{', '.join(expected)}: give a netCDF file with one variable per field",
        )
    ((name, (shape, dtype)),) = expected.items()
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)  # the header only
    except (OSError, ValueError) as err:
        raise ConfigError(path_key, f"{path}: not a readable .npy file ({err})") from None
    if (
        not isinstance(arr, np.ndarray)
        or arr.dtype.fields is not None
        or arr.dtype.kind not in "fiub"
    ):
        raise ConfigError(path_key, f"{path}: holds {arr.dtype}; expected plain numbers")
    if arr.ndim == len(shape) + 1:
        k = _frame(arr.shape[0], frame, str(path), frame_key)
        arr = arr[k]
    elif frame is not None and frame not in (0, -1):
        raise ConfigError(frame_key, f"{path} holds one frame ({_shape(arr.shape)}); got {frame}")
    _check(name, arr.shape, arr.dtype, shape, dtype, str(path), path_key)
    return {name: np.ascontiguousarray(np.asarray(arr).T)}


def _read_hdf5(path: Path, frame, expected: dict, keys) -> dict:
    import h5py

    from simpar.io import untrusted
    from simpar.io.nclayout import n_committed

    path_key, frame_key = keys
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise ConfigError(path_key, f"{path}: cannot open as netCDF4/HDF5 ({err})") from None
    with f:
        timed = {}
        for name in expected:
            if f.get(name, getlink=True) is None:
                have = sorted(k for k in f if isinstance(f.get(k), h5py.Dataset))
                raise ConfigError(
                    path_key,
                    f"{path}: no variable {name!r} (the run's fields: "
                    f"{', '.join(expected)}; the file has: {', '.join(have) or 'none'})",
                )
            ds = untrusted.child(f, name, path, path_key)
            untrusted.check_dataset(ds, path, path_key)
            timed[name] = ds.ndim == len(expected[name][0]) + 1
        n = None
        if any(timed.values()):
            n = n_committed(f) if "time" in f else min(f[k].shape[0] for k, t in timed.items() if t)
            k = _frame(n, frame, str(path), frame_key)
        elif frame is not None and frame not in (0, -1):
            raise ConfigError(frame_key, f"{path} holds one frame (no time axis); got {frame}")
        total = 0
        for name, (shape, dtype) in expected.items():
            ds = f[name]
            _check(
                name, ds.shape[1:] if timed[name] else ds.shape, ds.dtype, shape, dtype,
                str(path), path_key,
            )  # fmt: skip
            total += int(np.prod(shape)) * ds.dtype.itemsize
        untrusted.check_size(total, next(iter(expected)), path, path_key)
        out = {}
        for name in expected:
            ds = f[name]
            a = ds[k] if timed[name] else ds[...]
            out[name] = np.ascontiguousarray(np.asarray(a).T)
    return out


def read_fields(path, frame: int | None, expected: dict, keys=("initial.path", "initial.frame")):
    """Read one frame of the run's fields from ``path``, checked against ``expected``.

    Args:
      path: a netCDF4/HDF5 file or a ``.npy`` file (see the module docstring).
      frame: the frame (None: the last; negative: from the end).
      expected: field name -> (shape in Python order ``([lead,] n_x, n_y[, n_z])``, dtype),
        from the run's plan.
      keys: the config keys named in errors (path, frame).

    Returns:
      field name -> NumPy array of exactly the expected shape and dtype (Python order).

    Raises:
      ConfigError: a missing or unreadable file, an unknown kind, a missing variable, another
        shape (the transpose named as such) or dtype, a frame out of range, or a file
        failing the untrusted-input checks; one line naming the key and the file.
    """
    p = Path(os.fspath(path))
    if not p.is_file():
        raise ConfigError(keys[0], f"{p}: no such file")
    if p.suffix.lower() == ".npy":
        return _read_npy(p, frame, expected, keys)
    with open(p, "rb") as fh:
        magic = fh.read(8)
    if magic.startswith(b"CDF"):
        raise ConfigError(
            keys[0],
            f"{p} is a classic (netCDF3) file; give a netCDF4 file (nccopy -k nc4 {p.name} "
            "out.nc) or a .npy",
        )
    if magic != b"\x89HDF\r\n\x1a\n":
        raise ConfigError(
            keys[0], f"{p}: not a netCDF4/HDF5 or .npy file (allowed: {', '.join(KINDS)})"
        )
    return _read_hdf5(p, frame, expected, keys)


def from_config(ini) -> tuple[str, int | None]:
    """``initial.path`` and ``initial.frame`` of a ``[initial] kind = "file"`` table.

    Args:
      ini: the ``[initial]`` ``simpar.config.Section`` (``kind`` is marked as read).

    Returns:
      (path, frame or None for the last).
    """
    ini.get("kind", kind=str, choices=("file",))
    path = ini.get("path", kind=str)
    frame = ini.get("frame", None, kind=int)
    return path, frame


__all__ = ["KINDS", "from_config", "read_fields"]
