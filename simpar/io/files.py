"""Creating and replacing output files safely (every writer goes through here).

Guarantees (issue 10):

- **Exclusive creation.** A new output is created with ``O_CREAT | O_EXCL`` (h5py mode
  ``"x"``): if the file appeared after the up-front existence check (a second run on the same
  ``--out``), creation fails with a ``ConfigError`` instead of two runs sharing one file.
- **Replace, never truncate.** With ``--overwrite`` the new file is built beside the old one
  under a temporary name and moved over it with ``os.replace`` once its layout is written: a
  reader (or a process that has the old file open) never sees a truncated file; the old inode
  stays intact for whoever holds it.
- **No symlink following.** Temporary files are created with ``O_EXCL`` (h5py ``"x"`` or
  ``os.open(..., O_EXCL | O_NOFOLLOW)``), which fails on any pre-planted name, symlink or
  not; ``os.replace`` replaces a symlink at the target instead of writing through it.
- **No debris.** A temporary file is removed when building it fails; temporary names carry
  the writer's process id, and leftovers of processes that no longer run (killed between
  creation and rename) are removed by the next writer of the same path.
- **No plugin code.** :func:`no_plugins` switches HDF5's filter-plugin loading off while a
  file from outside is read (``simpar.io.untrusted``), and restores it after.
- **Write errors.** :func:`ensure_space` refuses a write that would not fit on the file
  system (``OSError(ENOSPC)`` naming the path) before the file is touched, so earlier frames
  stay intact; :func:`write_error` turns any ``OSError`` of a writer into a
  ``SimulationError`` naming the path and the OS error.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import h5py

from simpar.errors import ConfigError, SimulationError

NAME_MAX = 255  # bytes in one path component (Linux, macOS)
_TMP_RE = re.compile(r"\.(\d+)\.simpar-tmp$")


OUTPUT_KINDS = ("netcdf", "h5md")
"""Kinds of output file (``simpar.drive.loop.read_options``'s ``output``)."""


GRID_SUFFIXES = (".nc", ".nc4", ".h5", ".hdf5")


def check_grid_path(path, key: str) -> None:
    """Refuse a grid output path whose suffix is not one of :data:`GRID_SUFFIXES`.

    Raises:
      ConfigError: on ``key`` (``--out`` / ``output.path``), naming the allowed suffixes
        (``.h5md`` is the particle format, ``.xdmf`` the sidecar, ``.toml`` a config).
    """
    suffix = Path(path).suffix
    if suffix.lower() not in GRID_SUFFIXES:
        why = {
            ".h5md": "H5MD is the particle runs' format",
            ".xdmf": "the .xdmf sidecar is written next to the file",
            ".toml": "that is a config",
        }.get(suffix.lower(), f"suffix {suffix!r}" if suffix else "no suffix")
        raise ConfigError(
            key,
            f"a grid run writes netCDF-4/HDF5: the path must end in {', '.join(GRID_SUFFIXES)} "
            f"({why}), got {str(path)!r}",
        )


def check_output_name(path: str | os.PathLike, key: str, kind: str) -> None:
    """The one naming rule of output files (every model's output goes through it).

    Args:
      path: the output path; key: the option or config key named in errors.
      kind: ``"netcdf"`` (a grid file: ``GRID_SUFFIXES``) or ``"h5md"`` (a particle trajectory: must end in ``.h5md``, which
        MDAnalysis recognises H5MD by).

    Raises:
      ConfigError: a name the rule refuses; ValueError: an unknown ``kind``.
    """
    p = Path(os.fspath(path))
    if kind == "h5md":
        if p.suffix != ".h5md":
            raise ConfigError(
                key, f"must end in .h5md (MDAnalysis recognises H5MD by it), got {str(p)!r}"
            )
    elif kind == "netcdf":
        check_grid_path(p, key)  # .nc, .nc4, .h5 or .hdf5; never .h5md, .xdmf, .toml
    else:
        raise ValueError(f"output kind {kind!r}; one of {OUTPUT_KINDS}")


def check_output_path(path: str | os.PathLike, key: str = "--out") -> Path:
    """Validate an output path before anything is computed or written.

    Args:
      path: the output file path.
      key: the option or config key named in errors (``"--out"``, ``"output.path"``).

    Returns:
      The path as a ``Path``.

    Raises:
      ConfigError: empty path, a component longer than 255 bytes, a directory at the path,
        a parent that is a file, or a parent directory that cannot be written.
    """
    text = os.fspath(path)
    if not text or not text.strip():
        raise ConfigError(key, "the output path is empty; give a file name such as run.nc")
    p = Path(text)
    for part in p.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ConfigError(
                key,
                f"{text!r}: the name {part[:40]!r}... is {len(os.fsencode(part))} bytes; "
                f"file systems allow at most {NAME_MAX} bytes per name",
            )
    if p.is_dir():
        raise ConfigError(key, f"{text!r} is a directory; give a file path")
    parent = p.parent
    while not parent.exists():  # mkdir -p creates the rest
        if parent == parent.parent:
            break
        if parent.is_symlink():  # dangling symlink
            raise ConfigError(key, f"{text!r}: {str(parent)!r} is a broken symbolic link")
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(key, f"{text!r}: {str(parent)!r} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(key, f"{text!r}: directory {str(parent)!r} is not writable")
    try:
        st = os.statvfs(parent)
    except OSError:
        return p
    if st.f_flag & os.ST_RDONLY:
        raise ConfigError(key, f"{text!r}: {str(parent)!r} is on a read-only file system")
    if st.f_blocks == 0:  # /proc, /sys: no storage, creating files there fails
        raise ConfigError(key, f"{text!r}: {str(parent)!r} cannot hold files (e.g. /proc)")
    return p


def temp_path(path: str | os.PathLike) -> Path:
    """This process's temporary name for building ``path`` (same directory, hidden)."""
    p = Path(path)
    suffix = f".{os.getpid()}.simpar-tmp"
    stem = "." + p.name
    room = NAME_MAX - len(suffix)
    while len(os.fsencode(stem)) > room:
        stem = stem[:-1]
    return p.with_name(stem + suffix)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(path: str | os.PathLike) -> list[Path]:
    """Remove temporary files of ``path`` left by processes that no longer run.

    Only regular files named like :func:`temp_path` whose process id is not alive are
    removed (symbolic links and other files are left alone).

    Returns:
      The removed paths.
    """
    p = Path(path)
    prefix = temp_path(p).name.rsplit(".", 2)[0]  # "." + name, shortened like temp_path
    removed = []
    try:
        entries = list(os.scandir(p.parent if str(p.parent) else "."))
    except OSError:
        return removed
    for e in entries:
        m = _TMP_RE.search(e.name)
        if not m or not e.name.startswith(prefix + "."):
            continue
        if e.name[len(prefix) : m.start()] != "":
            continue
        if not e.is_file(follow_symlinks=False) or _pid_alive(int(m.group(1))):
            continue
        try:
            os.unlink(e.path)
            removed.append(Path(e.path))
        except OSError:
            pass
    return removed


def _exists_error(path: Path, key: str) -> ConfigError:
    return ConfigError(
        key,
        f"output file {str(path)!r} already exists (created by another run?); pass "
        "--overwrite to replace it, or choose another --out path",
    )


def create_hdf5(
    path: str | os.PathLike,
    build: Callable[[h5py.File], None],
    *,
    overwrite: bool = False,
    key: str = "--out",
    **kwargs,
) -> h5py.File:
    """Create an HDF5 output exclusively (or replace one by rename) and return it open.

    Args:
      path: the output file.
      build: writes the layout (groups, datasets, attributes) into the new file; it is
        flushed before the file becomes visible under ``path`` when replacing.
      overwrite: replace an existing ``path``: the new file is built under
        :func:`temp_path` and moved over ``path`` with ``os.replace`` (the old file is
        never truncated).
      key: option named in errors.
      **kwargs: passed to ``h5py.File`` (e.g. ``track_order=True``).

    Returns:
      The open file, in append mode, at ``path``.

    Raises:
      ConfigError: ``path`` exists and ``overwrite`` is false (also when it appeared
        meanwhile), or it cannot be created.
      OSError: a write error while building (the new file is removed).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            key, f"cannot create directory {str(path.parent)!r}: {_reason(e)}"
        ) from None
    remove_stale_temps(path)
    target = temp_path(path) if overwrite else path
    try:
        f = h5py.File(target, "x", **kwargs)
    except FileExistsError:
        if overwrite:  # our own leftover (same pid): cannot happen twice in one process
            raise ConfigError(key, f"temporary file {str(target)!r} exists; remove it") from None
        raise _exists_error(path, key) from None
    except OSError as e:
        if e.errno == errno.EEXIST:
            raise _exists_error(path, key) from None
        # O_EXCL succeeded before the failure (e.g. a full disk): the empty file is ours
        Path(target).unlink(missing_ok=True)
        raise ConfigError(key, f"cannot create output file {str(path)!r}: {_reason(e)}") from None
    try:
        build(f)
        f.flush()
        if overwrite:
            os.replace(target, path)
    except BaseException:
        try:
            f.close()
        finally:
            Path(target).unlink(missing_ok=True)
        raise
    return f


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through an exclusive temporary file + rename.

    Raises:
      OSError: the write failed (no temporary file is left).
    """
    path = Path(path)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_hdf5_atomic(path: str | os.PathLike, build: Callable[[h5py.File], None]) -> None:
    """Write a small HDF5 file whole: exclusive temporary file, fsync, ``os.replace``.

    A kill at any moment leaves either the previous file or the new one (and at most a
    temporary file that the next call removes).

    Raises:
      OSError: the write failed (no temporary file is left).
    """
    path = Path(path)
    remove_stale_temps(path)
    tmp = temp_path(path)
    f = h5py.File(tmp, "x")  # fails on any pre-planted name (never removed: not ours)
    try:
        with f:
            build(f)
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def ensure_space(path: str | os.PathLike, nbytes: int, margin: int = 256 << 10) -> None:
    """Refuse a write of about ``nbytes`` that would not fit on ``path``'s file system.

    Args:
      path: the file about to grow.
      nbytes: bytes about to be written (uncompressed size; an upper bound).
      margin: extra bytes kept free for HDF5 metadata and the status attribute.

    Raises:
      OSError: ``ENOSPC`` naming ``path``, before anything is written.
    """
    try:
        st = os.statvfs(Path(path).parent)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if free < nbytes + margin:
        raise OSError(
            errno.ENOSPC,
            f"{os.strerror(errno.ENOSPC)} (the next frame needs about "
            f"{(nbytes + margin) / 2**20:.1f} MiB, {free / 2**20:.1f} MiB free)",
            os.fspath(path),
        )


def _reason(err: BaseException) -> str:
    """The OS error of an ``OSError`` or of an HDF5 error (h5py puts errno text inside)."""
    text = str(err)
    m = re.search(r"errno = (\d+)", text)
    if m:
        return os.strerror(int(m.group(1)))
    return getattr(err, "strerror", None) or text


def write_error(err: BaseException, path: str | os.PathLike, step: int, last_good: str):
    """A ``SimulationError`` for a failed write of ``path`` (naming the OS error)."""
    reason = _reason(err)
    return SimulationError(
        step,
        f"cannot write {os.fspath(path)}: {reason}",
        hint="free disk space or choose another --out, then run again (grid runs: --resume)",
        checkpoint=last_good,
    )


def final_status(writer, status: str | None) -> None:
    """Set a writer's ``run_status`` (None: only close it) without masking the error that
    is being raised: after a write error the disk may still be full."""
    try:
        if status is not None:
            writer.set_status(status)
        else:
            writer.close()
    except Exception:
        pass


@contextlib.contextmanager
def status_on_exit(writer):
    """Close ``writer`` when the block ends; an exception first sets ``run_status`` to
    ``"failed: <reason>"`` (``err.reason`` of a ``SimulationError`` or a signal)."""
    try:
        yield
    except BaseException as err:
        reason = getattr(err, "reason", None) or f"{type(err).__name__}: {err}"
        final_status(writer, f"failed: {reason}")
        raise
    finally:
        final_status(writer, None)


def set_status_or_fail(writer, status: str, path, step: int, last_good: str) -> None:
    """``writer.set_status(status)``; a failed write becomes :func:`write_error`."""
    try:
        writer.set_status(status)
    except (OSError, RuntimeError) as err:
        raise write_error(err, path, step, last_good) from None


@contextlib.contextmanager
def raise_dealloc_errors():
    """Raise HDF5 errors that h5py meets while freeing objects inside the block.

    A chunk of a dataset is written when h5py closes the dataset object; an error there
    (``No space left on device``) is only passed to ``sys.unraisablehook`` and printed.
    Within the block those errors are collected, and the first is raised when it ends.
    """
    errors = []
    previous = sys.unraisablehook, sys.excepthook
    sys.unraisablehook = lambda hook_args: errors.append(hook_args.exc_value)
    sys.excepthook = lambda *exc_info: None  # Cython prints the traceback through it first
    try:
        yield
    finally:
        sys.unraisablehook, sys.excepthook = previous
    if errors:
        raise errors[0]


def _hdf5_library():
    """ctypes handle of the HDF5 library h5py uses (the same one already loaded), or None."""
    candidates = []
    try:
        with open("/proc/self/maps") as fh:
            candidates = [line.split()[-1] for line in fh if "libhdf5" in line]
    except OSError:
        pass
    for lib in dict.fromkeys(candidates):
        base = os.path.basename(lib)
        if "_hl" in base or not os.path.isfile(lib):
            continue
        try:
            handle = ctypes.CDLL(lib)
            handle.H5PLset_loading_state  # noqa: B018 (exists)
            return handle
        except (OSError, AttributeError):
            continue
    return None


_LIB: list = []


def _plugin_state_fns():
    """(get, set) of HDF5's plugin loading state, or None where not reachable."""
    setter = getattr(getattr(h5py, "h5pl", None), "set_loading_state", None)
    getter = getattr(getattr(h5py, "h5pl", None), "get_loading_state", None)
    if setter is not None and getter is not None:
        return getter, setter
    if not _LIB:
        _LIB.append(_hdf5_library())
    lib = _LIB[0]
    if lib is None:
        return None

    def get() -> int:
        mask = ctypes.c_uint()
        if lib.H5PLget_loading_state(ctypes.byref(mask)) < 0:
            raise OSError("H5PLget_loading_state failed")
        return int(mask.value)

    def set_(mask: int) -> None:
        if lib.H5PLset_loading_state(ctypes.c_uint(mask)) < 0:
            raise OSError("H5PLset_loading_state failed")

    return get, set_


def plugin_loading_state() -> int | None:
    """HDF5's plugin loading mask now (0: off), None where it cannot be read."""
    fns = _plugin_state_fns()
    return None if fns is None else fns[0]()


@contextlib.contextmanager
def no_plugins():
    """HDF5 plugin loading switched off while reading a file from outside, restored after.

    A dataset naming a filter that is not built in would make HDF5 search its plugin
    directory (``HDF5_PLUGIN_PATH``) and load code from it; with loading off, reading such a
    dataset fails instead (and :func:`check_storage` refuses it before any read). Where the
    state cannot be reached (h5py without ``h5pl.set_loading_state`` and no loaded
    ``libhdf5`` to call), the block runs unchanged.
    """
    fns = _plugin_state_fns()
    if fns is None:
        yield
        return
    get, set_ = fns
    before = get()
    set_(0)
    try:
        yield
    finally:
        set_(before)
