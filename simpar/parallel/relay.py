"""A TCP relay in front of the coordination service that answers the service's HTTP/2 pings.

Why: a process stopped (SIGSTOP, Ctrl-Z, a debugger) for more than 60 s was aborted with a
C++ trace the moment it was continued (``coordination_service_agent.cc:289 Polled an error
from coordination service``, ``LOG(FATAL)`` in ``client.h:80``, SIGABRT, before any Python
thread ran). The chain, traced here with ``GRPC_TRACE=http_keepalive`` on both sides:

1. the service's gRPC transport sends HTTP/2 PING frames of its own (flow-control "BDP"
   probes while data from the client arrives; keepalive pings); one sent just before or
   as the stop begins is never answered, since every thread of the stopped client is
   stopped (the kernel still takes the bytes);
2. 60 s later (chttp2's ping timeout: the server's GOAWAY came 60.00 s after its
   unanswered PING) the server ends the connection (``Sending goaway ...
   err=UNKNOWN:ping_timeout``, then a close);
3. on SIGCONT the client's long-running ``PollForError`` RPC fails at once (UNAVAILABLE,
   ``ping timeout`` or ``sendmsg: Broken pipe``), the agent's ``SetError`` calls the
   client's ``missed_heartbeat_callback``, whose default is ``LOG(FATAL)``.

Whether a PING is in flight when the stop begins is chance: the 70 s stop of the test
(tests/test_cluster_faults.py) aborted 5 of 7 runs on main here (0 of 10 with the relay); a client stopped while it
sends 4 MB values aborted every time (tests/test_relay.py). A stop under 60 s never did.

jaxlib 0.10.2 offers no way around this from Python: ``get_distributed_runtime_service``
takes no gRPC channel arguments (no ping timeout, no BDP probing switch);
``get_distributed_runtime_client`` does not expose ``poll_for_error_from_service_at_startup``
(the option that starts the polling), and a Python ``missed_heartbeat_callback`` aborts with
``std::bad_cast``.

So process 0's service helper (``simpar.parallel.coordinator``) runs the service on a
Unix socket of its own and this relay on the run's address. The relay copies the bytes of each
connection both ways, unchanged, frame by frame, except that it answers every PING the
service sends (a PING frame with the ACK flag and the same 8 bytes) instead of passing it to
the client. The service's pings thus never time out, and a stopped client keeps its
connection however long it is stopped; its own pings still go to the service, which answers
them. The data of the run does not pass here: it goes through the collectives (gloo, MPI).
When either side closes, the relay closes the other (a killed client is seen as before).

Limits: the service cannot tell a hung client from a live one through its transport any
more (it never judged that: its heartbeat timeout is ``coordinator.SERVICE_HEARTBEAT_S``;
simpar's watchdogs judge the peers). Three ways of losing the connection remain, none seen
here: the relay's writer to a stopped client blocks once the client's socket buffers are
full (megabytes of replies in flight), and the pings behind it then wait too; a SETTINGS
frame the service sends during the stop (a new flow-control window) is still answered by
the client alone, within gRPC's settings timeout; and a ping the client itself sent just
before the stop may time out on its continuation (gRPC's timer against the answer waiting
in its socket).
"""

from __future__ import annotations

import contextlib
import socket
import threading

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # what an HTTP/2 client sends first
HEADER = 9  # an HTTP/2 frame header: length (3 bytes), type, flags, stream id (4 bytes)
PING, ACK = 0x6, 0x1  # the PING frame type and its ACK flag
CHUNK = 1 << 16


class Relay:
    """Listen on ``address`` and relay each connection to ``target`` (``host``, ``port``).

    Args:
      address: where the run's processes connect, ``HOST:PORT`` as JAX gives it to the
        service (``[::]:1234``: every interface, IPv4 too).
      target: the service's own address: a Unix socket's path (the helper's choice: no
        port to race for), or ``(host, port)``.

    Raises:
      OSError: ``address`` cannot be listened on (the port is taken).
    """

    def __init__(self, address: str, target: str | tuple[str, int]) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "::"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self.sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            if host != "::":
                raise
            host, family = "0.0.0.0", socket.AF_INET  # a host without IPv6: every interface
            self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.sock.bind((host, int(port)))
        self.sock.listen(64)
        self.target = target
        thread = threading.Thread(target=self._accept, name="relay-accept", daemon=True)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                service = _connect(self.target)
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                client.close()
                continue
            Connection(client, service)


def _connect(target: str | tuple[str, int]) -> socket.socket:
    if isinstance(target, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(target)
        except OSError:
            sock.close()
            raise
        return sock
    sock = socket.create_connection(target)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Connection:
    """One client's connection: two threads, client -> service and service -> client.

    The client's first bytes must be HTTP/2's preface (gRPC without TLS, as jaxlib's client
    speaks); anything else (TLS) is passed on unparsed both ways, its pings included.
    """

    def __init__(self, client: socket.socket, service: socket.socket) -> None:
        self.client, self.service = client, service
        self.to_service = threading.Lock()  # whole frames only: the client's and our ACKs
        self.http2: bool | None = None  # whether the client spoke HTTP/2 (set by _up)
        self.checked = threading.Event()
        for name, target in (("up", self._up), ("down", self._down)):
            threading.Thread(target=target, name=f"relay-{name}", daemon=True).start()

    def _close(self) -> None:
        self.checked.set()
        for s in (self.client, self.service):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _send_up(self, data: bytes) -> None:
        with self.to_service:
            self.service.sendall(data)

    def _up(self) -> None:
        """Client -> service: the preface, then whole frames (our ACKs go in between)."""
        try:
            head = b""
            while len(head) < len(PREFACE) and PREFACE.startswith(head):
                data = self.client.recv(len(PREFACE) - len(head))
                if not data:
                    raise OSError("closed")
                head += data
            self.http2 = head == PREFACE
            self._send_up(head)
            self.checked.set()
            reader = Frames(self.client, parse=self.http2)
            while True:
                self._send_up(b"".join(reader.read()))
        except OSError:
            pass
        self._close()

    def _down(self) -> None:
        """Service -> client: every frame but the service's PINGs, which are answered here."""
        self.checked.wait()
        try:
            reader = Frames(self.service, parse=bool(self.http2))
            while True:
                frames = reader.read()
                pings = [f for f in frames if is_ping(f)] if self.http2 else []
                if pings:
                    self._send_up(b"".join(ack(f) for f in pings))
                    frames = [f for f in frames if not is_ping(f)]
                if frames:
                    self.client.sendall(b"".join(frames))
        except OSError:
            pass
        self._close()


def is_ping(frame: bytes) -> bool:
    """Whether ``frame`` is an HTTP/2 PING that asks for an answer (no ACK flag)."""
    return len(frame) == HEADER + 8 and frame[3] == PING and not frame[4] & ACK


def ack(ping: bytes) -> bytes:
    """The answer to an HTTP/2 PING frame: the same frame with the ACK flag set."""
    return ping[:4] + bytes([ping[4] | ACK]) + ping[5:]


class Frames:
    """Read whole HTTP/2 frames from a socket.

    Args:
      sock: the socket to read.
      parse: False: pass the bytes on as they come (each read is one "frame").
    """

    def __init__(self, sock: socket.socket, parse: bool = True) -> None:
        self.sock, self.parse, self.buf = sock, parse, bytearray()

    def read(self) -> list[bytes]:
        """The next whole frames (at least one; each its header and payload), as they come.

        Raises:
          OSError: the socket closed or failed.
        """
        while True:
            data = self.sock.recv(CHUNK)
            if not data:
                raise OSError("closed")
            if not self.parse:
                return [data]
            self.buf += data
            frames, at = [], 0
            while len(self.buf) - at >= HEADER:
                end = at + HEADER + int.from_bytes(self.buf[at : at + 3], "big")
                if end > len(self.buf):
                    break
                frames.append(bytes(self.buf[at:end]))
                at = end
            del self.buf[:at]
            if frames:
                return frames
