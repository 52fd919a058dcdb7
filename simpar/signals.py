"""SIGINT and SIGTERM: stop at the next safe point, with the right status and exit code.

``SIGTERM`` is what ``timeout``, ``kill`` and batch systems (SLURM at the end of a job's time)
send; it is handled like Ctrl-C (``SIGINT``). The first signal only sets a flag; the command
line and the drivers call :func:`check` at safe points (after the configuration is read, after
JAX has started, before the output file is created, and before each chunk of steps; chunks
end at an output frame or after about 2 s of measured step time, ``simpar.drive.loop``),
which raises :class:`Interrupted`. The checkpoint is the last frame's. In a multi-process
run the processes agree before each chunk: a signal on any of them stops all of them at the
same chunk boundary (``simpar.drive.chunks``).
A running simulation then writes ``run_status = "failed: interrupted"`` or ``"failed:
terminated"`` and the command line exits 130 (SIGINT) or 143 (SIGTERM). A second signal
raises at once.

Raising only at safe points matters: a ``KeyboardInterrupt`` raised inside JAX's start-up or
first compilation crashed the interpreter (SIGSEGV) in about 1 of 10 tries.

Handlers are installed only from the main thread (elsewhere these functions do nothing but
:func:`check`).
"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["Interrupted", "check", "deferred", "install", "pending", "uninstall"]

_REASONS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}
_pending: list[int] = []  # signals received and not yet raised
_previous: dict = {}


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM.

    Attributes:
      signum: the signal number.
      reason: ``"interrupted"`` (SIGINT) or ``"terminated"`` (SIGTERM).
      exit_code: 128 + signal number (130 for SIGINT, 143 for SIGTERM).
      together: every process of a multi-process run stops with it at the same chunk
        boundary (``simpar.drive.chunks.next_chunk``): none reports the others as failed.
    """

    def __init__(self, signum: int, together: bool = False):
        self.signum = int(signum)
        self.together = bool(together)
        self.reason = _REASONS.get(signum, f"signal {signum}")
        self.exit_code = 128 + self.signum
        super().__init__(self.reason)


def _handler(signum, frame):
    if _pending:  # a second signal: stop now
        raise Interrupted(signum)
    _pending.append(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def installed() -> bool:
    """Whether this module's handlers are in place."""
    return _main_thread() and signal.getsignal(signal.SIGINT) is _handler


def install() -> None:
    """Hold SIGINT/SIGTERM until the next :func:`check` (the command line calls it first)."""
    if _main_thread() and not installed():
        _pending.clear()
        for sig in _REASONS:
            _previous[sig] = signal.signal(sig, _handler)


def uninstall() -> None:
    """Restore the handlers :func:`install` replaced."""
    if _main_thread() and installed():
        for sig, h in _previous.items():
            signal.signal(sig, h)
        _previous.clear()
    _pending.clear()


def check() -> None:
    """Raise :class:`Interrupted` if a signal arrived since :func:`install`."""
    if _pending:
        raise Interrupted(_pending[0])


def pending() -> int | None:
    """The first signal received and not yet raised (e.g. ``signal.SIGTERM``), or None."""
    return _pending[0] if _pending else None


class _Stop:
    check = staticmethod(check)


@contextlib.contextmanager
def deferred():
    """A block in which signals wait for ``stop.check()`` (installs the handlers when the
    caller has not, e.g. a run started from Python, and restores them afterwards).

    Yields:
      An object whose ``check()`` raises :class:`Interrupted` when a signal arrived.
    """
    if installed() or not _main_thread():
        yield _Stop()
        return
    install()
    try:
        yield _Stop()
    finally:
        uninstall()
