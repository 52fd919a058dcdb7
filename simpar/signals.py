"""SIGINT and SIGTERM: stop a run at the next safe point, with the right status and exit code.

``SIGTERM`` is what ``timeout``, ``kill`` and batch systems (SLURM at the end of a job's time)
send; it is handled like Ctrl-C (``SIGINT``):

- outside a run loop (start-up, validation, the first compilation) either signal raises
  :class:`Interrupted` at once; the command line exits 130 (SIGINT) or 143 (SIGTERM);
- inside a run loop (:func:`deferred`) the first signal only sets a flag and the driver stops
  at the next safe point (after the current chunk's frame and checkpoint are written),
  writing ``run_status = "failed: interrupted"`` or ``"failed: terminated"``; a second
  signal raises at once.

Handlers are installed only in the main thread (elsewhere these functions do nothing).
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["Interrupted", "deferred", "install"]

_REASONS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM.

    Attributes:
      signum: the signal number.
      reason: ``"interrupted"`` (SIGINT) or ``"terminated"`` (SIGTERM).
      exit_code: 128 + signal number (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.reason = _REASONS.get(signum, f"signal {signum}")
        self.exit_code = 128 + self.signum
        super().__init__(self.reason)


def _raise(signum, frame):
    raise Interrupted(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` (the command line calls it first)."""
    if _main_thread():
        for sig in _REASONS:
            signal.signal(sig, _raise)


class _Stop:
    """The flag set by a deferred signal; :meth:`check` raises at a safe point."""

    def __init__(self):
        self.signum: int | None = None

    def check(self) -> None:
        """Raise :class:`Interrupted` if a signal arrived since the loop started."""
        if self.signum is not None:
            raise Interrupted(self.signum)


@contextlib.contextmanager
def deferred():
    """Within the block the first SIGINT/SIGTERM is held until ``stop.check()``.

    Yields:
      An object whose ``check()`` raises :class:`Interrupted` when a signal arrived.
    """
    stop = _Stop()
    if not _main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.signum is not None:  # second signal: stop now
            raise Interrupted(signum)
        stop.signum = signum

    previous = {sig: signal.signal(sig, handler) for sig in _REASONS}
    try:
        yield stop
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
