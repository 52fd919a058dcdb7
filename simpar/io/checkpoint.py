"""Restart checkpoints: the complete state of a run, written atomically.

A checkpoint is a small HDF5 file ``<output>.ckpt`` holding every state array (global, host
NumPy), the step, the resolved config text and the model name. It is written to a temporary
file, fsync'ed and moved into place with ``os.replace``, so a kill at any moment leaves either
the previous checkpoint or the new one, never a half-written file (the write-then-rename
recipe of ``simpar.io.files``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import h5py
import numpy as np

from simpar.errors import ConfigError
from simpar.io import untrusted
from simpar.io.files import write_hdf5_atomic


def checkpoint_path(output: str | os.PathLike) -> Path:
    """The restart checkpoint of an output file: ``<output>.ckpt``."""
    return Path(str(output) + ".ckpt")


def save(
    path: str | os.PathLike, state: dict[str, np.ndarray], step: int, config_text: str, model: str
) -> None:
    """Write ``state`` at ``step`` atomically to ``path``.

    The file is built under an exclusive temporary name (a pre-planted file or symlink makes
    it fail instead of being followed), fsync'ed and renamed over ``path``
    (``simpar.io.files.write_hdf5_atomic``); a failed write leaves no temporary file.

    Raises:
      OSError: the write failed (e.g. no space left on the device).
    """

    def build(f):
        f.attrs["step"] = np.int64(step)
        f.attrs["config"] = config_text
        f.attrs["model"] = model
        g = f.create_group("state")
        for name, value in state.items():
            g.create_dataset(name, data=np.asarray(value))

    write_hdf5_atomic(path, build)


def config_matches(text_a: str, text_b: str) -> bool:
    """Whether two resolved config texts agree in everything but ``time.steps`` (the only
    setting a resumed run may change)."""
    import tomllib

    def without_steps(text):
        data = tomllib.loads(text)
        data.get("time", {}).pop("steps", None)
        return data

    return without_steps(text_a) == without_steps(text_b)


def expected_of(state: Mapping[str, object]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The ``expected`` argument of :func:`load` for a run whose initial state is ``state``.

    Args:
      state: name -> array (NumPy or JAX) of the state the resumed run will continue.

    Returns:
      name -> (shape, dtype) of every array.
    """
    return {k: (tuple(np.shape(v)), np.dtype(v.dtype)) for k, v in state.items()}


def load_for_resume(
    output: str | os.PathLike,
    config_text: str,
    model: str,
    expected: Mapping[str, tuple] | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """The checkpoint next to ``output`` for ``--resume``: (state arrays, step).

    Args:
      output: the run's output file; its checkpoint is ``checkpoint_path(output)``.
      config_text: the resolved config of the resuming run.
      model: the model name the checkpoint must have been written by.
      expected: name -> (shape, dtype) of every state array the run needs (shapes and dtypes
        follow from the config: grid runs pass ``expected_of(initial_state)``); each array
        is checked against it before any data is read, and only these arrays are read.

    Raises:
      ConfigError (``--resume``): no output or checkpoint, an unreadable, damaged or crafted
        one (see :func:`load`), or one written by another model or config (only
        ``time.steps`` may differ).
    """
    if not Path(output).exists():
        raise ConfigError("--resume", f"output file {output} does not exist; nothing to resume")
    state, step, text, ck_model = load(checkpoint_path(output), expected=expected)
    if ck_model != model or not config_matches(text, config_text):
        raise ConfigError(
            "--resume",
            f"the config differs from the one {output} was started with "
            "(only time.steps may change on resume)",
        )
    return state, step


def load(
    path: str | os.PathLike, expected: Mapping[str, tuple] | None = None
) -> tuple[dict[str, np.ndarray], int, str, str]:
    """Read a checkpoint: (state, step, config_text, model).

    The file is untrusted (``simpar.io.untrusted``): before any data is read, the ``step``,
    ``config`` and ``model`` attributes must be a scalar integer >= 0 and two texts, every
    ``/state`` member a dataset named by a hard link (no external or soft links), stored in
    this file (no HDF5 external storage, no virtual dataset), of plain numbers (float, int,
    bool; short fixed byte strings such as the LJ ``layout`` tag), and the arrays together
    must fit the memory available (``simpar.memory.available_bytes``).

    Args:
      path: the checkpoint file.
      expected: name -> (shape, dtype) of the arrays to read (a shape entry ``None``
        accepts any length): each must exist with exactly that shape and dtype, and float
        arrays must be finite; other members of ``/state`` are not read. ``None`` reads
        every member (particle runs).

    Returns:
      (state: name -> NumPy array, step: int, config_text: str, model: str).

    Raises:
      ConfigError (``--resume``): the checkpoint is missing, unreadable, damaged or crafted;
        the message names the file and the dataset or attribute at fault.
    """
    key = "--resume"
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            "--resume", f"no checkpoint {path} to resume from; run without --resume first"
        )
    try:
        with untrusted.no_plugins(), h5py.File(path, "r") as f:
            step = untrusted.attr(f, "step", path, key, kinds="iu")
            if step < 0:
                raise ConfigError(key, f"{path}: attribute 'step' is {step}; expected >= 0")
            text = untrusted.attr(f, "config", path, key, kinds="T")
            model = untrusted.attr(f, "model", path, key, kinds="T")
            g = untrusted.child(f, "state", path, key, dataset=False)
            names = list(expected) if expected is not None else list(g)
            datasets, total, biggest = {}, 0, (0, "")
            for name in names:
                ds = untrusted.child(g, name, path, key)
                if expected is not None:
                    shape, dtype = expected[name]
                    size = untrusted.check_dataset(ds, path, key, shape=shape, dtype=dtype)
                else:
                    size = untrusted.check_dataset(ds, path, key, kinds=untrusted.NUMERIC + "S")
                datasets[name] = ds
                total += size
                biggest = max(biggest, (size, ds.name))
            untrusted.check_size(total, biggest[1], path, key)
            state = {k: ds[()] for k, ds in datasets.items()}
            for k, value in state.items():  # a run's state is finite (particle checkpoints
                # use NaN as a "not set" marker, so only checked where ``expected`` is given)
                if expected is not None and value.dtype.kind == "f":
                    bad = int(np.count_nonzero(~np.isfinite(value)))
                    if bad:
                        raise ConfigError(
                            key,
                            f"{path}: dataset {datasets[k].name} holds {bad} non-finite "
                            "values (NaN or inf); the checkpoint is damaged",
                        )
            return state, step, text, model
    except ConfigError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
        raise ConfigError("--resume", f"checkpoint {path} is unreadable ({err})") from None
