"""A TCP relay in front of the coordination service that answers the service's HTTP/2 pings.

Why: a process stopped (SIGSTOP, Ctrl-Z, a debugger) for more than 60 s was aborted with a
C++ trace the moment it was continued (``coordination_service_agent.cc:289 Polled an error
from coordination service``, ``LOG(FATAL)`` in ``client.h:80``, SIGABRT, before any Python
thread ran). The chain, traced here with ``GRPC_TRACE=http_keepalive`` on both sides:

1. the service's gRPC transport sends HTTP/2 PING frames of its own (flow-control "BDP"
   probes after data from the client, keepalive pings after 2 h idle); the last one before
   the stop is never answered, since every thread of the stopped client is stopped;
2. 60 s later (gRPC's ping timeout, ``grpc.http2.ping_timeout_ms``) the server ends the
   connection (``Sending goaway ... err=UNKNOWN:ping_timeout``, then a close);
3. on SIGCONT the client's long-running ``PollForError`` RPC fails at once (UNAVAILABLE,
   ``sendmsg: Broken pipe``), the agent's ``SetError`` calls the client's
   ``missed_heartbeat_callback``, whose default is ``LOG(FATAL)``.

jaxlib 0.10.2 offers no way around this from Python: ``get_distributed_runtime_service``
takes no gRPC channel arguments (no ping timeout, no BDP probing switch);
``get_distributed_runtime_client`` does not expose ``poll_for_error_from_service_at_startup``
(the option that starts the polling), and a Python ``missed_heartbeat_callback`` aborts with
``std::bad_cast``.

So process 0's service helper (``simpar.parallel.coordinator``) runs the service on a
loopback port and this relay on the run's address. The relay copies the bytes of each
connection both ways, unchanged, frame by frame, except that it answers every PING the
service sends (a PING frame with the ACK flag and the same 8 bytes) instead of passing it to
the client. The service's pings thus never time out, and a stopped client keeps its
connection however long it is stopped; its own pings still go to the service, which answers
them. The data of the run does not pass here: it goes through the collectives (gloo, MPI).
When either side closes, the relay closes the other (a killed client is seen as before).

Limits: the service cannot tell a hung client from a live one through its transport any
more (it never judged that: its heartbeat timeout is ``coordinator.SERVICE_HEARTBEAT_S``;
simpar's watchdogs judge the peers). A client that sends or receives more than the sockets
buffer while the relay's writer to it is blocked (a stopped client with megabytes of
replies in flight) could still delay the answers to pings past 60 s. And a ping the client
itself sent just before it was stopped may time out on its continuation (gRPC's timer
against the answer waiting in its socket): not seen here, but not excluded.
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
      target: the service's own address, e.g. ``("127.0.0.1", 41234)``.

    Raises:
      OSError: ``address`` cannot be listened on (the port is taken).
    """

    def __init__(self, address: str, target: tuple[str, int]) -> None:
        host, _, port = address.rpartition(":")
        host = host.strip("[]") or "::"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
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
                service = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, service):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            Connection(client, service)


class Connection:
    """One client's connection: two threads, client -> service and service -> client."""

    def __init__(self, client: socket.socket, service: socket.socket) -> None:
        self.client, self.service = client, service
        self.to_service = threading.Lock()  # whole frames only: the client's and our ACKs
        for name, target in (("up", self._up), ("down", self._down)):
            threading.Thread(target=target, name=f"relay-{name}", daemon=True).start()

    def _close(self) -> None:
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
            frames = Frames(self.client, skip=len(PREFACE))
            for data in frames:
                self._send_up(data)
        except OSError:
            pass
        self._close()

    def _down(self) -> None:
        """Service -> client: every frame but the service's PINGs, which are answered here."""
        try:
            for data in Frames(self.service):
                if len(data) == HEADER + 8 and data[3] == PING and not data[4] & ACK:
                    self._send_up(ack(data))
                else:
                    self.client.sendall(data)
        except OSError:
            pass
        self._close()


def ack(ping: bytes) -> bytes:
    """The answer to an HTTP/2 PING frame: the same frame with the ACK flag set."""
    return ping[:4] + bytes([ping[4] | ACK]) + ping[5:]


class Frames:
    """The HTTP/2 frames read from a socket, each as its bytes (header and payload).

    Args:
      sock: the socket to read.
      skip: bytes passed on as they come before the first frame (the client's preface).
    """

    def __init__(self, sock: socket.socket, skip: int = 0) -> None:
        self.sock, self.skip, self.buf = sock, skip, b""

    def _fill(self) -> None:
        data = self.sock.recv(CHUNK)
        if not data:
            raise OSError("closed")
        self.buf += data

    def __iter__(self):
        while self.skip:
            while not self.buf:
                self._fill()
            head, self.buf = self.buf[: self.skip], self.buf[self.skip :]
            self.skip -= len(head)
            yield head
        while True:
            while len(self.buf) < HEADER:
                self._fill()
            size = HEADER + int.from_bytes(self.buf[:3], "big")
            while len(self.buf) < size:
                self._fill()
            frame, self.buf = self.buf[:size], self.buf[size:]
            yield frame
