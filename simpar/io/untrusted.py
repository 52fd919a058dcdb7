"""Checks on HDF5 files from outside (restart checkpoints, H5MD inputs), made before reading.

A file given to simpar (``--resume`` checkpoints, ``system.file`` H5MD states) may be damaged
or crafted. Everything here looks only at *metadata* (a dataset's shape, dtype, storage layout
and the kind of link that names it; an attribute's shape and dtype), so a check never reads the
data it guards: a dataset claiming 10^12 elements is refused without allocating them, and a
dataset stored in *another* file (HDF5 external storage, a virtual dataset, an external link)
is refused before HDF5 follows it. Each refusal is a ``ConfigError`` naming the file, the
dataset and what was expected (exit code 2 on the command line).

The output a ``--resume`` appends to is checked the same way before it is opened for writing
(``simpar.drive.loop.check_output`` as soon as the run starts, then ``GridWriter.open_existing`` /
``H5MDWriter.open_existing``): HDF5 plugin loading off, every link in the file a hard link, no
virtual, externally stored or plugin-filtered dataset (:func:`check_links`), exactly the
groups and datasets a new file of this run has (:func:`check_layout` against a template the
run's own writer builds in a temporary directory: names, order, dtypes, shapes, maxshape,
chunking), and frames consistent with the checkpoint (a frame at its step, increasing steps,
every time-dependent dataset holding the kept frames, H5MD elements sharing ``position``'s
``step``/``time``: ``nclayout.check_grid_output``, ``h5md_read.check_h5md_output``).
"""

from __future__ import annotations

import contextlib
import math
import os

import h5py
import numpy as np

from simpar.errors import ConfigError
from simpar.io.files import no_plugins as no_plugins  # re-exported
from simpar.io.files import plugin_loading_state as plugin_loading_state

#: dtype kinds a numeric state array may have: float, signed/unsigned int, bool.
NUMERIC = "fiub"
#: fixed-length byte strings (``np.bytes_`` tags such as a checkpoint's ``layout``) are
#: allowed where a caller adds ``"S"``; variable-length strings and objects never are.
MAX_BYTES_STRING = 4096


#: HDF5 filters built into the library (deflate, shuffle, fletcher32, szip, nbit,
#: scaleoffset) and LZF, which h5py registers itself: reading one never loads a plugin.
BUILTIN_FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32", 4: "szip", 5: "nbit",
                   6: "scaleoffset", 32000: "lzf"}  # fmt: skip


def _name(obj) -> str:
    return obj.name if getattr(obj, "name", None) else "/"


def _refuse_link(path, where: str, link, key: str) -> None:
    """``ConfigError`` naming the file and the member ``where`` unless ``link`` is a hard
    link (a soft or external link could point simpar at another file's data)."""
    if not isinstance(link, h5py.HardLink):
        kind = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
        raise ConfigError(
            key,
            f"{os.fspath(path)}: {where} is {kind}; links are refused (a file from outside "
            "could point simpar at another file's data)",
        )


def child(group: h5py.Group, name: str, path, key: str, *, dataset: bool | None = True):
    """``group[name]`` after checking that it is a hard link (never followed outside the file).

    Args:
      group: an open group of the file.
      name: the member's name in ``group``.
      path: the file (named in errors).
      key: the option or config key named in errors (``"--resume"``, ``"system.file"``).
      dataset: whether the member must be a dataset (True), a group (False) or either
        (None).

    Returns:
      The ``h5py.Dataset`` or ``h5py.Group``.

    Raises:
      ConfigError: missing, a soft or external link, or not a dataset/group.
    """
    where = f"{_name(group).rstrip('/')}/{name}"
    link = group.get(name, getlink=True)
    if link is None:
        raise ConfigError(key, f"{os.fspath(path)}: no {where}")
    _refuse_link(path, where, link, key)
    obj = group[name]
    if dataset is None:
        return obj
    want = h5py.Dataset if dataset else h5py.Group
    if not isinstance(obj, want):
        raise ConfigError(
            key, f"{os.fspath(path)}: {where} is not a {'dataset' if dataset else 'group'}"
        )
    return obj


def check_dataset(
    ds: h5py.Dataset,
    path,
    key: str,
    *,
    shape: tuple | None = None,
    dtype=None,
    kinds: str = NUMERIC,
    ndim: int | None = None,
) -> int:
    """Check a dataset's storage, dtype and shape from its metadata, before reading it.

    Args:
      ds: the dataset (opened through :func:`child`).
      path: the file (named in errors).
      key: the option or config key named in errors.
      shape: the exact shape expected; an entry ``None`` accepts any length on that axis.
      dtype: the exact dtype expected (``None``: any dtype whose kind is in ``kinds``).
      kinds: allowed ``numpy.dtype.kind`` letters when ``dtype`` is None (default
        ``"fiub"``: float, int, unsigned, bool; add ``"S"`` for short fixed byte strings).
      ndim: the number of axes expected when ``shape`` is None.

    Returns:
      The dataset's size in bytes once read (elements x itemsize).

    Raises:
      ConfigError: external storage or a virtual dataset (data living in other files), a
        compound, string or object dtype not allowed, or another shape/dtype.
    """
    where = f"{os.fspath(path)}: dataset {ds.name}"
    check_storage(ds, path, key)
    dt = ds.dtype
    got = f"{dt} {ds.shape}"
    if dt.fields is not None or dt.subdtype is not None or dt.kind == "O":
        raise ConfigError(key, f"{where} has dtype {dt}; expected plain numbers")
    if dtype is not None:
        if dt != np.dtype(dtype):
            raise ConfigError(key, f"{where} is {got}; expected dtype {np.dtype(dtype)}")
    elif dt.kind not in kinds or (dt.kind == "S" and dt.itemsize > MAX_BYTES_STRING):
        raise ConfigError(key, f"{where} is {got}; expected a numeric array (kinds {kinds})")
    if shape is not None:
        ok = len(ds.shape) == len(shape) and all(
            want is None or int(want) == have for want, have in zip(shape, ds.shape, strict=True)
        )
        if not ok:
            want = "(" + ", ".join("any" if s is None else str(int(s)) for s in shape) + ")"
            raise ConfigError(key, f"{where} has shape {ds.shape}; expected {want}")
    elif ndim is not None and len(ds.shape) != ndim:
        raise ConfigError(key, f"{where} has shape {ds.shape}; expected {ndim} axes")
    return math.prod(ds.shape) * dt.itemsize


def filters(ds: h5py.Dataset) -> list[int]:
    """The filter ids of ``ds``'s pipeline, in order (from the creation property list)."""
    plist = ds.id.get_create_plist()
    return [int(plist.get_filter(i)[0]) for i in range(plist.get_nfilters())]


def check_storage(ds: h5py.Dataset, path, key: str) -> None:
    """Refuse a dataset whose data lives outside the file or needs a filter plugin.

    Raises:
      ConfigError: a virtual dataset, HDF5 external storage, or a filter that is not built
        into HDF5 (:data:`BUILTIN_FILTERS`; reading it would make HDF5 search its plugin
        directory for code to load).
    """
    where = f"{os.fspath(path)}: dataset {ds.name}"
    if ds.is_virtual:
        raise ConfigError(key, f"{where} is a virtual dataset (its data lives in other files)")
    if ds.external:
        raise ConfigError(
            key, f"{where} uses HDF5 external storage ({ds.external[0][0]!r}); refused"
        )
    unknown = [code for code in filters(ds) if code not in BUILTIN_FILTERS]
    if unknown:
        raise ConfigError(
            key, f"{where} uses HDF5 filter {unknown[0]}, which is not built into HDF5 "
            f"(allowed: {', '.join(sorted(BUILTIN_FILTERS.values()))}); refused",
        )  # fmt: skip


def check_links(f: h5py.File, path, key: str) -> dict[str, h5py.Dataset]:
    """Check every link of the whole file, then the storage of every dataset it names.

    Nothing is followed outside the file: a soft link (which can point at another member)
    or an external link anywhere in the file is refused, then every dataset, reached
    through hard links only, goes through :func:`check_storage`.

    Args:
      f: the open file (read-only is enough).
      path: the file (named in errors); key: the option or config key named in errors.

    Returns:
      name -> dataset of every dataset in the file (hard links, nothing read).

    Raises:
      ConfigError: a soft or external link, a virtual or externally stored dataset, or a
        filter needing a plugin; the message names the file and the member.
    """
    links: list[tuple[str, object]] = []
    f.visititems_links(lambda name, link: links.append((name, link)))
    for name, link in links:
        _refuse_link(path, f"/{name}", link, key)
    out = {}
    for name, _ in links:
        obj = f[name]
        if isinstance(obj, h5py.Dataset):
            check_storage(obj, path, key)
            out[name] = obj
    return out


def open_readonly(path, key: str) -> h5py.File:
    """``h5py.File(path, "r")``; a missing, truncated or non-HDF5 file is a ConfigError."""
    try:
        return h5py.File(path, "r")
    except OSError as err:
        raise ConfigError(
            key, f"{os.fspath(path)} is not a readable HDF5 file ({str(err).splitlines()[0]})"
        ) from None


def check_size(total: int, biggest: str, path, key: str) -> None:
    """Refuse reading ``total`` bytes that do not fit the memory available to this process.

    Args:
      total: bytes the read would allocate.
      biggest: the largest dataset, named in the error.
      path: the file; key: the option or config key named in errors.

    Raises:
      ConfigError: ``total`` exceeds ``simpar.memory.available_bytes()`` (the smallest of
        free RAM, the cgroup limit and RLIMIT_AS).
    """
    from simpar.memory import GIB, available_bytes

    avail = available_bytes()
    if avail is not None and total > avail:
        raise ConfigError(
            key,
            f"{os.fspath(path)}: reading {biggest} and the rest needs {total / GIB:.3g} GiB; "
            f"{avail / GIB:.3g} GiB are available (damaged or not this run's file?)",
        )


def attr(obj, name: str, path, key: str, *, kinds: str, required: bool = True):
    """A scalar attribute, its shape and dtype checked before its value is read.

    Args:
      obj: the file, group or dataset holding the attribute.
      name: the attribute's name.
      path: the file; key: the option or config key named in errors.
      kinds: allowed dtype kinds: ``"iu"`` for an integer, ``"T"`` for text (a
        variable-length or fixed-length string, returned as ``str``).
      required: raise when it is missing (else return None).

    Returns:
      ``int`` for integer kinds, ``str`` for text, None when missing and not required.

    Raises:
      ConfigError: missing (when required), not a scalar, or of another kind.
    """
    where = f"{os.fspath(path)}: attribute {name!r} of {_name(obj)}"
    if name not in obj.attrs:
        if required:
            raise ConfigError(key, f"{where} is missing")
        return None
    aid = h5py.h5a.open(obj.id, name.encode())
    dt, shape = aid.dtype, aid.shape
    text = dt.kind == "S" or h5py.check_string_dtype(dt) is not None
    ok = shape in ((), (1,)) and (
        (text and "T" in kinds) or (dt.kind in kinds and dt.fields is None)
    )
    if not ok:
        want = "text" if kinds == "T" else "an integer"
        raise ConfigError(key, f"{where} is {dt} of shape {shape}; expected {want}")
    value = obj.attrs[name]
    value = value.reshape(()) if isinstance(value, np.ndarray) else value
    if text:
        value = value.item() if isinstance(value, np.ndarray) else value
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return int(value)


def check_group(
    group: h5py.Group,
    path,
    key: str,
    expected: dict,
    optional=(),
) -> dict[str, h5py.Dataset]:
    """Check every member of ``group`` against ``expected`` from the metadata alone.

    Names, shapes and dtypes are checked before any data is read: each expected member must
    be present (unless in ``optional``) as a dataset of this file with exactly that shape and
    dtype, no other member may be present, and the members together must fit the memory
    available (:func:`check_size`).

    Args:
      group: an open group (e.g. a checkpoint's ``/state``).
      path: the file (named in errors); key: the option or config key named in errors.
      expected: name -> (shape, dtype); a shape entry ``None`` accepts any length; the dtype
        ``"S"`` means a short fixed-length byte string (``MAX_BYTES_STRING`` bytes at most).
      optional: names that may be absent.

    Returns:
      name -> the checked ``h5py.Dataset`` (present members only; nothing read).

    Raises:
      ConfigError: a missing, unexpected, linked, externally stored or virtual member, or
        another shape or dtype; the message names the file and the dataset.
    """
    unknown = sorted(set(group) - set(expected))
    if unknown:
        where = f"{_name(group).rstrip('/')}/{unknown[0]}"
        raise ConfigError(
            key,
            f"{os.fspath(path)}: unexpected dataset {where} (this run's checkpoint holds "
            f"only {', '.join(sorted(expected))})",
        )
    out, total, biggest = {}, 0, (0, "")
    for name, (shape, dtype) in expected.items():
        if name in optional and group.get(name, getlink=True) is None:
            continue
        ds = child(group, name, path, key)
        if isinstance(dtype, str) and dtype == "S":
            size = check_dataset(ds, path, key, shape=shape, kinds="S")
        else:
            size = check_dataset(ds, path, key, shape=shape, dtype=dtype)
        out[name] = ds
        total += size
        biggest = max(biggest, (size, ds.name))
    check_size(total, biggest[1], path, key)
    return out


# ----------------------------------------------------------- the output --resume appends to
def _layout(f: h5py.File) -> dict[str, tuple]:
    """Every link name (a dataset shared by hard links is listed under each name) -> (kind,
    member order) of a group, (kind, dtype, shape, maxshape, chunked) of a dataset; the
    file's links are hard links (``check_links`` passed, or the template)."""
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
        target = os.path.join(tmp, "layout.h5")
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
    check_size(8 * total, ds.name, path, key)
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
    with no_plugins(), template(like) as tmpl:
        f = open_readonly(path, key)
        try:
            datasets = check_links(f, path, key)
            if tmpl is not None:
                check_layout(f, tmpl, path, key)
            yield f, datasets, tmpl
        except ConfigError:
            raise
        except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
            raise ConfigError(key, f"{os.fspath(path)} is unreadable or damaged ({err})") from None
        finally:
            f.close()


def open_appendable(path, key: str = "--resume") -> h5py.File:
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
