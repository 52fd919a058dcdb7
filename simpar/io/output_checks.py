"""Checks of the output file a ``--resume`` appends to, made before anything is appended.

The output (grid netCDF4 or H5MD) is a file from outside like the checkpoint is
(``simpar.io.untrusted``): a crafted one could name another file's data through an external
link, a soft link, external storage or a virtual dataset, and appending would then write
there. So before ``GridWriter.open_existing`` / ``H5MDWriter.open_existing`` open it for
appending, with HDF5 plugin loading off and the file opened read-only:

1. every link in the file is a hard link, and no dataset is virtual, externally stored or
   filtered by a plugin (``untrusted.check_links``);
2. the groups and datasets are exactly those this run writes into a new file (a template
   built by the writer itself in a temporary directory: names, order, dtypes, shapes,
   maxshape, chunking; :func:`check_layout`);
3. the frames are consistent with the checkpoint: the steps increase, a frame sits exactly at
   the checkpoint's step, every time-dependent dataset holds at least the frames kept, and
   the H5MD elements share ``position``'s ``step``/``time``.

Each refusal is a ``ConfigError`` (exit 2) naming the file and the dataset; nothing is
written.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import h5py
import numpy as np

from simpar.errors import ConfigError
from simpar.io import untrusted

KEY = "--resume"


def _layout(f: h5py.File) -> dict[str, tuple]:
    """Every link name (a dataset shared by hard links is listed under each name) -> (kind,
    member order) of a group, (kind, dtype, shape, maxshape, chunked) of a dataset; the
    file's links are hard links (``untrusted.check_links`` passed, or the template)."""
    out: dict[str, tuple] = {"": ("group", tuple(f))}

    def visit(name, link):
        obj = f[name]
        if isinstance(obj, h5py.Dataset):
            out[name] = ("dataset", obj.dtype, obj.shape, obj.maxshape, obj.chunks is not None)
        else:
            out[name] = ("group", tuple(obj))

    f.visititems_links(visit)
    return out


def _shape_text(shape) -> str:
    return "(" + ", ".join("any" if s is None else str(s) for s in shape) + ")"


def check_layout(f: h5py.File, template: h5py.File, path, key: str) -> None:
    """Compare a file's groups and datasets with a template written by the same writer.

    ``template`` is what this run would write as a new file (no frames); ``f`` (already
    through :func:`check_links`) must hold exactly its groups and datasets, in the same
    order, with the same dtypes and maxshapes, chunked where it is, and the same shape
    except along an unlimited (appendable) axis. Attributes are not compared.

    Raises:
      ConfigError: a missing, unexpected or different member; names the file and member.
    """
    want, have = _layout(template), _layout(f)
    where = lambda name: f"{os.fspath(path)}: /{name}"  # noqa: E731
    extra = sorted(set(have) - set(want))
    if extra:
        raise ConfigError(key, f"{where(extra[0])} is not in the output this run writes "
                          "(another run's file, or altered?)")  # fmt: skip
    for name, spec in sorted(want.items(), key=lambda item: item[1][0] == "group"):
        got = have.get(name)
        if got is None:
            raise ConfigError(key, f"{where(name)} is missing (not this run's output?)")
        if got[0] != spec[0]:
            raise ConfigError(key, f"{where(name)} is a {got[0]}; expected a {spec[0]}")
        if spec[0] == "group":  # datasets first: a recreated dataset is named, not its group
            if got[1] != spec[1]:
                at = next(i for i, (a, b) in enumerate(zip(got[1], spec[1], strict=True)) if a != b)
                member = f"{name}/{got[1][at]}" if name else got[1][at]
                raise ConfigError(key, f"{where(member)} is "
                                  f"member {at} of its group; this run writes "
                                  f"{spec[1][at]} there (order {list(spec[1])})")  # fmt: skip
            continue
        _, dtype, shape, maxshape, chunked = spec
        fixed = tuple(s if m is not None else None for s, m in zip(shape, maxshape, strict=True))
        ok = (
            got[1] == dtype
            and len(got[2]) == len(shape)
            and all(w is None or w == g for w, g in zip(fixed, got[2], strict=True))
            and got[3] == maxshape
            and got[4] == chunked
        )
        if not ok:
            raise ConfigError(
                key,
                f"{where(name)} is {got[1]} {got[2]} (maxshape {got[3]}"
                f"{', chunked' if got[4] else ', contiguous'}); this run appends to {dtype} "
                f"{_shape_text(fixed)} (maxshape {maxshape}{', chunked' if chunked else ''})",
            )


@contextlib.contextmanager
def template(like):
    """The file a new run would write (``like(path)`` returns an open writer with a
    ``close()``), built in a temporary directory and opened read-only; None without
    ``like``."""
    import tempfile

    if like is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="simpar-layout-") as tmp:
        target = Path(tmp) / "layout.h5"
        try:
            like(target).close()
        except OSError as err:
            raise ConfigError("--resume", f"cannot build the expected output layout in {tmp} "
                              f"to check the file against ({err})") from None  # fmt: skip
        with h5py.File(target, "r") as t:
            yield t


def _steps(path, ds: h5py.Dataset, total: int, step: int | None, key: str) -> int:
    """The frames kept for a restart at ``step``: those up to it, which must increase and
    end exactly at ``step`` (the checkpoint's frame); reads ``total`` steps (checked to fit)."""
    untrusted.check_size(8 * total, ds.name, path, key)
    steps = ds[:total]
    keep = total if step is None else int(np.count_nonzero(steps <= step))
    where = f"{os.fspath(path)}: dataset {ds.name}"
    if np.any(np.diff(steps[:keep]) <= 0) or (keep and steps[0] < 0):
        raise ConfigError(key, f"{where}: the steps of the frames do not increase")
    if step is not None and (keep == 0 or int(steps[keep - 1]) != step):
        last = int(steps[keep - 1]) if keep else None
        raise ConfigError(
            key, f"{where} has no frame at the checkpoint's step {step} (last frame at or "
            f"before it: {last}); not the output of this checkpoint",
        )  # fmt: skip
    return keep


def _rows(path, datasets, keep: int, key: str) -> None:
    for ds in datasets:
        if ds.shape[0] < keep:
            raise ConfigError(key, f"{os.fspath(path)}: dataset {ds.name} holds "
                              f"{ds.shape[0]} frames; the other datasets hold {keep}")  # fmt: skip


def _appendable(path, ds: h5py.Dataset, key: str) -> None:
    if ds.chunks is None or ds.maxshape[0] is not None or ds.maxshape[1:] != ds.shape[1:]:
        raise ConfigError(key, f"{os.fspath(path)}: dataset {ds.name} cannot be appended to "
                          f"(shape {ds.shape}, maxshape {ds.maxshape}, chunks {ds.chunks})")  # fmt: skip


@contextlib.contextmanager
def _checked(path, like, key):
    """The file opened read-only with plugins off, its links and storage checked and (with
    ``like``) its layout compared with the template."""
    with untrusted.no_plugins(), template(like) as tmpl:
        f = untrusted.open_readonly(path, key)
        try:
            datasets = untrusted.check_links(f, path, key)
            if tmpl is not None:
                check_layout(f, tmpl, path, key)
            yield f, datasets, tmpl
        except ConfigError:
            raise
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
            raise ConfigError(key, f"{os.fspath(path)} is unreadable or damaged ({err})") from None
        finally:
            f.close()


def check_grid_output(path, *, step: int | None, like=None, key: str = KEY) -> None:
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
    from simpar.io.nclayout import STEP, TIME, n_committed, variable_dims

    with _checked(path, like, key) as (f, datasets, tmpl):
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
                _appendable(path, ds, key)
                timed.append(ds)
        total = min(n_committed(f), steps.shape[0])
        keep = _steps(path, steps, total, step, key)
        _rows(path, timed, keep, key)


def check_h5md_output(path, *, step: int | None, like=None, key: str = KEY) -> None:
    """Refuse an H5MD output (``simpar.io.h5md``) that ``--resume`` must not append to.

    Every time-dependent element (a ``value`` with an unlimited first axis under
    ``/particles``, ``/observables`` or ``/parameters``) must be appendable, share
    ``position``'s ``step`` and ``time`` (hard links to the same datasets) and hold the kept
    frames. Arguments as :func:`check_grid_output` (``like(path) -> H5MDWriter``).

    Raises:
      ConfigError: naming the file and the dataset.
    """
    with _checked(path, like, key) as (f, datasets, _):
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
                _appendable(path, ds, key)
                parent = ds.parent
                for member, oid in ids.items():
                    other = parent.get(member)
                    if not isinstance(other, h5py.Dataset) or other.id != oid:
                        raise ConfigError(key, f"{os.fspath(path)}: {parent.name}/{member} "
                                          f"is not the shared {grp.name}/{member}")  # fmt: skip
                elements.append(ds)
        if value.maxshape[:1] != (None,):
            _appendable(path, value, key)
        total = min(value.shape[0], steps.shape[0])
        keep = _steps(path, steps, total, step, key)
        _rows(path, [*elements, time], keep, key)


def open_appendable(path, key: str = KEY) -> h5py.File:
    """``h5py.File(path, "a")`` of a checked output; an error opening it (another process
    holding HDF5's lock, a read-only file) is a ConfigError naming the file."""
    try:
        return h5py.File(path, "a")
    except OSError as err:
        raise ConfigError(
            key,
            f"cannot open {os.fspath(path)!r} for appending ({str(err).splitlines()[0]}); is "
            "another process (a viewer, an h5py session, another run) holding it open?",
        ) from None


def check_output(path, *, step: int | None, key: str = KEY) -> None:
    """The checks of :func:`check_grid_output` or :func:`check_h5md_output` that need no
    template (links, storage, frames at ``step``), whichever the file is (a grid file has a
    root ``time``): made as soon as ``--resume`` is read, before the run compiles anything.

    Raises:
      ConfigError: a missing, unreadable or crafted file, naming it and the dataset.
    """
    if not os.path.isfile(path):
        raise ConfigError(key, f"output file {os.fspath(path)!r} does not exist")
    with untrusted.no_plugins(), untrusted.open_readonly(path, key) as f:
        grid = f.get("time", getlink=True) is not None
    (check_grid_output if grid else check_h5md_output)(path, step=step, key=key)
