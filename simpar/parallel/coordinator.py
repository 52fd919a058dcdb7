"""The coordination service of a multi-process run, in a helper process of process 0.

``jax.distributed.initialize`` starts the coordination service (the key-value store, the
heartbeats, the barriers) inside process 0. When process 0 dies, every other process's JAX
client loses its error-polling RPC and aborts at once (SIGABRT, a C++ stack trace, measured
0.1-0.6 s later), before anything in Python can react; and when process 0 fails and exits,
the others abort the same way before they can read why. So process 0 runs the service in
this helper instead (:func:`start_service`, which ``simpar.parallel.distributed`` hands to
JAX in place of its own); the key-value store then outlives process 0 long enough for the
watchdogs (``simpar.parallel.watchdog``) of the others to notice and end with one line.

The helper (``python -m simpar.parallel.coordinator ADDRESS N HEARTBEAT_S SHUTDOWN_S``)
prints ``ready`` once it listens, and reads its stdin: ``bye`` (process 0's
``jax.distributed.shutdown`` after the run, once every process passed the shutdown barrier)
ends it at once; end-of-file without ``bye`` (process 0 died or failed) ends it once no
process is connected to its port any more (the survivors have left; read from
``/proc/net/tcp``), or ``LINGER_S`` seconds later at most. It ignores SIGINT (process 0
decides what a Ctrl-C means) and lives in its own session; SIGTERM ends it.

The service itself never declares a process dead (its heartbeat timeout is
``SERVICE_HEARTBEAT_S``, not JAX's): the watchdogs judge the peers. A verdict of the service
reaches every process still connected through JAX's error polling, which aborts it (SIGABRT,
C++ trace) and cannot be intercepted from Python; a process that was stopped (SIGSTOP,
Ctrl-Z) while its peers ended the run met it the moment it was continued. With the service
silent, and the helper kept while such a process is still connected, that process instead
reads on its continuation why the others left (``simpar/left/<j>``) and exits 1 with one line.

The service listens on a Unix socket of its own (in a temporary folder of /tmp: jaxlib's
gRPC server binds TCP ports with SO_REUSEPORT: a second service started on a taken port,
measured, and the kernel then spreads the connections over both); the run's address is served by
``simpar.parallel.relay``, which copies each connection's bytes to the service and answers
the service's HTTP/2 PINGs itself (and, binding without SO_REUSEPORT, refuses a taken port). Without it a stop longer than 60 s still ended in the
abort: gRPC's ping timeout ended the stopped process's connection, and its continuation
found its error polling failed (measured with a 70 s stop: 5 of 7 aborted before, 0 of 10
after; the relay's docstring gives the chain and the limits).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LINGER_S = 86400.0  # after process 0 is gone, the helper serves the processes still
# connected (a stopped one, continued later, reads why the run ended) for this long at most (s)
SERVICE_HEARTBEAT_S = 30 * 86400  # the service's heartbeat timeout (s): in effect never
START_S = 60.0  # the helper must listen within this time (s)


class ServiceProcess:
    """Process 0's handle on the helper: what JAX keeps as its ``service`` (``shutdown``).

    Args:
      address: the address to listen on (``[::]:PORT``), from JAX.
      num_nodes: the number of processes.
      heartbeat_timeout: JAX's heartbeat timeout (s), not used: ``SERVICE_HEARTBEAT_S``.
      shutdown_timeout: JAX's shutdown timeout (s); ``None``: JAX's default.
      **_: further service options of JAX (``recoverable``, ...), not used.

    Raises:
      RuntimeError: the helper did not start listening (e.g. the port is taken).
    """

    def __init__(
        self, address, num_nodes, heartbeat_timeout=None, shutdown_timeout=None, **_
    ) -> None:
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds simpar/
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable, "-m", "simpar.parallel.coordinator", str(address), str(num_nodes),
            str(SERVICE_HEARTBEAT_S), str(shutdown_timeout or 300),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal goes to the run, not here
        )
        ready: list[bytes] = []
        reader = threading.Thread(target=lambda: ready.append(self.proc.stdout.readline()))
        reader.daemon = True
        reader.start()
        reader.join(START_S)
        if not ready or ready[0].strip() != b"ready":
            self.proc.kill()
            raise RuntimeError(f"the coordination service did not start on {address} (port taken?)")

    def shutdown(self) -> None:
        """End the helper (after the run's shutdown barrier)."""
        try:
            self.proc.stdin.write(b"bye\n")
            self.proc.stdin.close()
            self.proc.wait(10)
        except Exception:
            self.proc.kill()


def main(argv: list[str]) -> None:
    """The helper: run the service until ``bye``, or ``LINGER_S`` after end-of-file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    address, num_nodes, heartbeat, shutdown = argv
    from jax._src.lib import _jax

    from simpar.parallel.relay import Relay

    # the service's own socket: a file, not a port (gRPC servers bind ports with SO_REUSEPORT,
    # so two services on one port would share its connections); the run connects to the relay
    folder = tempfile.mkdtemp(prefix="simpar-", dir="/tmp" if os.path.isdir("/tmp") else None)
    signal.signal(signal.SIGTERM, lambda *_: _end(folder))
    inner = os.path.join(folder, "service")
    service = _jax.get_distributed_runtime_service(
        f"unix:{inner}", int(num_nodes), heartbeat_timeout=int(heartbeat),
        shutdown_timeout=int(shutdown),
    )  # fmt: skip
    try:
        Relay(address, inner)
    except OSError:  # the port is taken: no "ready", and ServiceProcess says so
        _end(folder)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    said = sys.stdin.buffer.read()  # until process 0 closes its end (exit, crash or kill)
    if b"bye" in said:
        service.shutdown()
        _end(folder)
    port = int(address.rpartition(":")[2])
    end = time.monotonic() + LINGER_S
    time.sleep(1.0)  # the survivors' watchdogs poll every 0.5 s
    while time.monotonic() < end and connections(port) != 0:
        time.sleep(0.5)
    _end(folder)


def _end(folder: str) -> None:
    """Leave at once (no waiting for the service's threads), the socket's folder removed."""
    shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)


def connections(port: int) -> int | None:
    """Established TCP connections to local ``port`` (Linux ``/proc/net/tcp*``; None if
    unknown)."""
    count, known = 0, False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        known = True
        for row in rows:
            cols = row.split()
            if len(cols) > 3 and cols[3] == "01" and int(cols[1].rpartition(":")[2], 16) == port:
                count += 1
    return count if known else None


if __name__ == "__main__":
    main(sys.argv[1:])
