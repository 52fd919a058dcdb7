"""Errors with messages a user can act on.

``ConfigError`` is raised for invalid input (config keys, command-line options, files):
the command line turns it into exit code 2 and a one-paragraph message, no traceback.
``SimulationError`` is raised when a run fails (NaN, instability, buffer overflow that
cannot be repaired): exit code 1, with the step, the reason and the setting to change.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid user input.

    Args:
      key: the dotted config key or option at fault, e.g. ``"grid.shape"`` or ``"--mesh"``.
      message: what is wrong and what is allowed.
    """

    def __init__(self, key: str, message: str):
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


class SimulationError(RuntimeError):
    """A run that could not continue.

    Args:
      step: the time step at which the problem was detected.
      reason: what happened.
      hint: the setting to change (e.g. ``"reduce time.dt"``).
      checkpoint: path of the last good checkpoint or output frame, if any.
    """

    def __init__(self, step: int, reason: str, hint: str = "", checkpoint: str | None = None):
        self.step = step
        self.reason = reason
        self.hint = hint
        self.checkpoint = checkpoint
        msg = f"run failed at step {step}: {reason}"
        if hint:
            msg += f". {hint}"
        if checkpoint:
            msg += f". Last good output: {checkpoint}"
        super().__init__(msg)
