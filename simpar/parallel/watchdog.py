"""Multi-process runs end together: a watchdog thread per process and a shared "failed" key.

Without it a survivor of a dead or failed peer waits in a collective until the coordination
service's heartbeat timeout (100 s by default) and then aborts (SIGABRT and a C++ stack trace),
or gets a gloo ``JaxRuntimeError`` and then hangs in ``jax.distributed`` shutdown. JAX's own
verdict cannot be caught: ``missed_heartbeat_callback`` of jaxlib 0.10.2's client aborts with
``std::bad_cast`` when it is given a Python function.

Each process of a multi-process run (:func:`start`, called by
``simpar.parallel.distributed.initialize``) runs a daemon thread that every ``POLL_S`` seconds

* writes its own heartbeat (a counter) under ``simpar/beat/<i>`` in the coordination
  service's key-value store, and reads everyone's;
* reads ``simpar/failed/<j>``: the exit code and one-line reason a failing process
  publishes (:func:`publish_failure`) before it exits (a write error on process 0, an
  invalid input, SIGINT/SIGTERM, a simulation error).

It stops the run, on this process, when a peer published a failure, when a peer's heartbeat
has not changed for ``PEER_TIMEOUT_S`` seconds (killed, crashed, or stuck outside Python for
that long), or when the key-value store has been unreachable for ``PEER_TIMEOUT_S`` seconds
(the coordinator is gone). Stopping means: run the hooks the driver registered
(:func:`on_stop`: process 0 sets ``run_status = "failed: <reason>"``), print ONE line naming
the failed process and the reason on stderr, and ``os._exit(1)`` (2 when the peer found the
input invalid; 128 + signal number when this process got SIGINT/SIGTERM too), so neither the
collective nor JAX's shutdown barrier is waited for. A process that finished its run
(:func:`finish`) no longer judges its peers' heartbeats (they end too), but still leaves
(exit 1) when one of them publishes a failure: it would otherwise wait for it in JAX's
shutdown barrier.

A watchdog that stops its process publishes why under ``simpar/left/<i>`` first. A process
that was stopped (SIGSTOP, Ctrl-Z, a debugger: its thread saw more than ``PAUSE_S`` seconds
pass over one wait) does not count that time against its peers' heartbeats, and when a peer
left meanwhile it exits 1 at once with one line naming its stop and the peer's reason
(process 0 sets ``run_status`` to it). Before, it was aborted with a C++ trace the moment it
was continued: the coordination service had judged it dead after its heartbeat timeout and
JAX's error polling (``CoordinationServiceAgent::SetError`` -> the client's
``missed_heartbeat_callback``, ``LOG(FATAL)`` in ``client.h``) printed at once on SIGCONT,
before any Python thread ran, and the process died by SIGABRT 0.17-0.44 s later. Now the
service (``simpar.parallel.coordinator``) never judges heartbeats and serves the processes
still connected after process 0 left, and its gRPC transport no longer ends the
connection of a process stopped for more than 60 s (``simpar.parallel.relay``: a 70 s stop
aborted 5 of 7 runs before it, 0 of 10 after). The limit: where JAX runs the service itself (inside process 0,
where ``simpar.parallel.distributed`` cannot hand it the helper: JAX's internals changed),
a stop longer than ``distributed.HEARTBEAT_S`` (or than 60 s, gRPC's ping timeout) still
ends in that abort.

A failing process itself leaves through :func:`exit_now` (an ``atexit`` hook that runs before
JAX's own): its message is printed by the command line, and then it exits with its code
without waiting for peers that are no longer there.

The watchdog is the only reader of these keys; nothing here imports a model.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time

__all__ = [
    "PEER_TIMEOUT_S",
    "POLL_S",
    "begin",
    "exit_now",
    "finish",
    "finished",
    "leave",
    "on_stop",
    "publish_failure",
    "start",
    "verdict_wait",
]

POLL_S = 0.5  # seconds between two looks at the key-value store
PEER_TIMEOUT_S = 10.0  # a peer whose heartbeat is this old (s) is taken as gone
PAUSE_S = 3.0  # a gap this long (s) between two polls: this process was stopped, and its
# peers' silence over that gap is not theirs
# (the thread needs the GIL about every POLL_S: a 26 s compilation and a 1.6 GB h5py write
# each left gaps of at most 0.22 s, measured here)
_PREFIX = "simpar/"


class _State:
    client = None  # jax's DistributedRuntimeClient
    me = 0
    n = 1
    coordinator = ""
    thread: threading.Thread | None = None
    entered = False  # this process started a run (:func:`begin`)
    finished = False  # this process's run ended well: heartbeats are not judged
    stopping = False  # the watchdog is stopping this process
    failed_code: int | None = None  # this process failed and leaves with this code
    hooks: list = []
    lock = threading.Lock()
    halt = threading.Event()  # set at interpreter exit: the thread returns


_S = _State()


def _say(line: str) -> None:
    try:
        sys.stdout.flush()
    except Exception:
        pass
    try:
        os.write(2, (line.rstrip("\n") + "\n").encode(errors="replace"))
    except OSError:
        pass


def _exit_code(peer_code: int) -> int:
    """This process's code when a peer stops it: 128 + signal if it got SIGINT/SIGTERM
    too, 2 if the peer found the input invalid (it is invalid for every process), else 1."""
    from simpar import signals

    sig = signals.pending()
    return 128 + sig if sig else (2 if peer_code == 2 else 1)


def _stop(line: str, status: str, peer_code: int = 1) -> None:
    """Stop this process because of a peer: hooks (``status``), one line, ``os._exit``."""
    with _S.lock:
        if _S.stopping or _S.failed_code is not None:
            return
        _S.stopping = True
    code = _exit_code(peer_code)
    with contextlib.suppress(Exception):  # a process continued later reads why (_judge)
        reason = status.removeprefix("failed: ")
        _S.client.key_value_set(f"{_PREFIX}left/{_S.me}", reason, allow_overwrite=True)
    for hook in list(_S.hooks):
        try:
            hook(status)
        except BaseException:  # the status is best effort: the disk may be full
            pass
    _say(line)
    os._exit(code)


def _watch() -> None:
    beat = 0
    seen: dict[int, tuple[str | None, float]] = {}  # peer -> (last beat, when it changed)
    start = last_ok = before = time.monotonic()
    paused = resumed = 0.0  # how long this process last did not run (s), and when it resumed
    while not _S.halt.is_set():
        now = time.monotonic()
        if now - before > PAUSE_S:  # this process was stopped (SIGSTOP, Ctrl-Z, suspend)
            paused, resumed = now - before, now
            seen = {j: (b, now) for j, (b, _) in seen.items()}  # not the peers' silence
            start = max(start, now)
        elif paused and now - resumed > PEER_TIMEOUT_S:
            paused = 0.0  # long enough ago: no longer the reason for what follows
        beat += 1
        try:
            _S.client.key_value_set(f"{_PREFIX}beat/{_S.me}", str(beat), allow_overwrite=True)
            entries = dict(_S.client.key_value_dir_get(_PREFIX))
            last_ok = now
        except Exception as err:  # the coordination service is unreachable
            if _S.finished or _S.failed_code is not None:
                return
            if now - last_ok > PEER_TIMEOUT_S:
                why = str(err).strip().splitlines()[0][:200] if str(err).strip() else "no answer"
                reason = (
                    f"the coordinator {_S.coordinator} (process 0) is unreachable for "
                    f"{PEER_TIMEOUT_S:.0f} s ({why})"
                )
                if paused:
                    reason = f"{_was_stopped(paused)}; {reason}"
                _stop(f"simpar: {reason}; process {_S.me} stops too", f"failed: {reason}")
            before = time.monotonic()  # a pause is measured over the wait alone
            _S.halt.wait(POLL_S)
            continue
        if _S.failed_code is None:
            try:
                _judge(entries, seen, now, start, paused)
            except Exception as err:  # never die silently: the run would lose its watchdog
                _say(f"simpar: warning: watchdog: {type(err).__name__}: {err}")
        before = time.monotonic()
        _S.halt.wait(POLL_S)


def _key(entries: dict, name: str, j: int):
    return entries.get(f"{_PREFIX}{name}/{j}", entries.get(f"{name}/{j}"))


def _was_stopped(seconds: float) -> str:
    return f"process {_S.me} was stopped for {seconds:.0f} s (SIGSTOP, Ctrl-Z or a suspended job?)"


def _judge(entries: dict, seen: dict, now: float, start: float, paused: float = 0.0) -> None:
    peers = [j for j in range(_S.n) if j != _S.me]
    failures = any(_key(entries, "failed", j) is not None for j in peers)
    for j in peers if not failures else ():  # a failure is named below, at its source
        left = _key(entries, "left", j)  # the peer's watchdog ended the run (_stop)
        if left is not None:
            reason = f"process {j} ended the run: {left}"
            if paused:
                reason = f"{_was_stopped(paused)}, and meanwhile {reason}"
            _stop(f"simpar: {reason}; process {_S.me} stops too", f"failed: {reason}")
    for j in range(_S.n):
        if j == _S.me:
            continue
        failed = _key(entries, "failed", j)
        if failed is not None:
            code, _, why = failed.partition(" ")
            reason = f"process {j} failed: {why}"
            _stop(
                f"simpar: {reason}; process {_S.me} stops too",
                f"failed: {reason}",
                int(code) if code.isdigit() else 1,
            )
        if _S.finished or _key(entries, "done", j) is not None:
            continue
        beat = _key(entries, "beat", j)  # None until the peer's first beat
        if j not in seen or seen[j][0] != beat:
            seen[j] = (beat, start if beat is None else now)  # last change
        elif now - seen[j][1] > PEER_TIMEOUT_S:
            reason = (
                f"process {j} stopped responding (no heartbeat for {PEER_TIMEOUT_S:.0f} s: "
                "killed, crashed or out of memory?)"
            )
            _stop(f"simpar: {reason}; process {_S.me} stops too", f"failed: {reason}")


def start(client, process_id: int, num_processes: int, coordinator: str | None) -> None:
    """Start this process's watchdog thread (once; a no-op for one process).

    Args:
      client: ``jax._src.distributed.global_state.client`` (the key-value store).
      process_id, num_processes: this process and the run's size.
      coordinator: ``host:port`` of the coordination service, for the messages.
    """
    if num_processes < 2 or _S.thread is not None or client is None:
        return
    _S.client, _S.me, _S.n = client, int(process_id), int(num_processes)
    _S.coordinator = coordinator or "(detected)"
    atexit.register(_halt)  # runs after every later-registered exit hook, JAX's included
    atexit.register(_leaving)
    _S.thread = threading.Thread(target=_watch, name="simpar-watchdog", daemon=True)
    _S.thread.start()


def _halt() -> None:
    """Stop the thread before the interpreter's finalization: a daemon thread that meets it
    inside a key-value call is unwound through C++ and aborts the process (``FATAL:
    exception not rethrown``, exit -6, seen once after a run that had completed)."""
    _S.halt.set()
    if _S.thread is not None:
        _S.thread.join(4 * POLL_S)


def _leaving() -> None:
    """At interpreter exit inside a run (:func:`begin`) that neither finished nor failed:
    tell the peers. Outside a run (a script that joined without running one; the command
    line guards everything after joining) JAX's own shutdown ends the processes together."""
    if _S.entered and not _S.finished and _S.failed_code is None:
        publish_failure("exited before the run ended", 1)
        exit_now()  # JAX's shutdown would wait for the peers, which now leave


def finished() -> bool:
    """Whether this process's run ended well (:func:`finish`)."""
    return _S.finished and _S.failed_code is None and not _S.stopping


def active() -> bool:
    """Whether a watchdog runs in this process (a multi-process run)."""
    return _S.thread is not None


def publish_failure(reason: str, code: int) -> None:
    """This process fails: tell the peers (``simpar/failed/<i>``) and leave with ``code``.

    The peers' watchdogs print one line naming this process and ``reason`` and exit. This
    process stops judging its peers, and :func:`exit_now` (``atexit``, before JAX's shutdown,
    which would wait for the peers) ends it with ``code`` once the command line printed its
    message.

    Args:
      reason: one line, e.g. ``"cannot write out.nc: No space left on device"``.
      code: this process's exit code (1 failed, 2 invalid input, 130/143 signals).
    """
    if not _claim(code):
        return
    reason = " ".join(str(reason).split())[:500]
    with contextlib.suppress(Exception):
        _S.client.key_value_set(f"{_PREFIX}failed/{_S.me}", f"{code} {reason}", True)
    atexit.register(exit_now)  # registered last: runs before JAX's atexit hooks


def leave(code: int) -> None:
    """This process stops with every other one at the same point (all of them agreed, e.g.
    on a signal: ``simpar.drive.chunks``): nothing is published, the peers are no longer
    judged, and :func:`exit_now` ends this process with ``code`` once the command line
    printed its message (JAX's shutdown would wait for peers that leave the same way).

    Args:
      code: this process's exit code (130/143 for signals).
    """
    if not _claim(code):
        return
    atexit.register(exit_now)  # registered last: runs before JAX's atexit hooks


def _claim(code: int) -> bool:
    """Record this process's exit ``code`` once (False: no watchdog, or already stopping)."""
    if not active():
        return False
    with _S.lock:
        if _S.stopping or _S.failed_code is not None:
            return False
        _S.failed_code = int(code)
    return True


def exit_now() -> None:
    """Leave at once with the code given to :func:`publish_failure` (an ``atexit`` hook)."""
    if _S.failed_code is not None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(_S.failed_code)


def begin() -> None:
    """This process starts its run (the driver's guard): leaving without :func:`finish` or
    :func:`publish_failure` is then a failure the peers hear of."""
    _S.entered = True


def finish() -> None:
    """This process's run ended well: tell the peers (``simpar/done/<i>``), judge no more."""
    if not active():
        return
    _S.finished = True
    with contextlib.suppress(Exception):
        _S.client.key_value_set(f"{_PREFIX}done/{_S.me}", "1", allow_overwrite=True)


@contextlib.contextmanager
def on_stop(hook):
    """Within the block, a peer's failure first calls ``hook(status)`` in the watchdog thread
    (e.g. ``writer.set_status``; ``status`` is ``"failed: <reason>"``)."""
    _S.hooks.append(hook)
    try:
        yield
    finally:
        _S.hooks.remove(hook)


def verdict_wait(timeout: float | None = None) -> None:
    """Give the watchdog up to ``timeout`` seconds (default: ``PEER_TIMEOUT_S`` + 3 s) to
    name the peer behind a failed collective; it ends the process when it does, else this
    returns."""
    if not active() or _S.finished:
        return
    deadline = time.monotonic() + (PEER_TIMEOUT_S + 3.0 if timeout is None else timeout)
    while time.monotonic() < deadline:
        time.sleep(POLL_S / 2)
