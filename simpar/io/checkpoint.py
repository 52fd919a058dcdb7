"""Restart checkpoints: the complete state of a run, written atomically.

A checkpoint is a small HDF5 file ``<output>.ckpt`` holding every state array (global, host
NumPy), the step, the resolved config text and the model name. It is written to a temporary
file, fsync'ed and moved into place with ``os.replace``, so a kill at any moment leaves either
the previous checkpoint or the new one, never a half-written file
(../shared/reference/HDF5_FORMATS.md section 4, recipe 3).
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from simpar.errors import ConfigError
from simpar.io.files import write_hdf5_atomic


def checkpoint_path(output: str | os.PathLike) -> Path:
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


def load_for_resume(
    output: str | os.PathLike, config_text: str, model: str
) -> tuple[dict[str, np.ndarray], int]:
    """The checkpoint next to ``output`` for ``--resume``: (state arrays, step).

    Raises:
      ConfigError (``--resume``): no output or checkpoint, an unreadable one, or one
        written by another model or config (only ``time.steps`` may differ).
    """
    if not Path(output).exists():
        raise ConfigError("--resume", f"output file {output} does not exist; nothing to resume")
    state, step, text, ck_model = load(checkpoint_path(output))
    if ck_model != model or not config_matches(text, config_text):
        raise ConfigError(
            "--resume",
            f"the config differs from the one {output} was started with "
            "(only time.steps may change on resume)",
        )
    return state, step


def load(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], int, str, str]:
    """Read a checkpoint: (state, step, config_text, model).

    Raises:
      ConfigError: the checkpoint is missing or unreadable.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            "--resume", f"no checkpoint {path} to resume from; run without --resume first"
        )
    try:
        with h5py.File(path, "r") as f:
            state = {k: f["state"][k][()] for k in f["state"]}
            return state, int(f.attrs["step"]), str(f.attrs["config"]), str(f.attrs["model"])
    except (OSError, KeyError) as err:
        raise ConfigError("--resume", f"checkpoint {path} is unreadable ({err})") from None
