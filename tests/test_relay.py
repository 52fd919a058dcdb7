"""The coordination service's relay (``simpar.parallel.relay``): bytes pass unchanged, the
service's HTTP/2 PINGs are answered by the relay, closes propagate, and jaxlib's client
works through it (the SIGSTOP > 60 s case itself: tests/test_cluster_faults.py, slow)."""

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simpar.parallel import relay


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + struct.pack(">I", stream) + payload
    )


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


@pytest.fixture
def pair():
    """(client socket, the service's end of its relayed connection)."""
    service = socket.socket()
    service.bind(("127.0.0.1", 0))
    service.listen(1)
    front = socket.socket()
    front.bind(("127.0.0.1", 0))
    port = front.getsockname()[1]
    front.close()
    relay.Relay(f"127.0.0.1:{port}", service.getsockname())
    client = socket.create_connection(("127.0.0.1", port))
    client.settimeout(5)
    up, _ = service.accept()
    up.settimeout(5)
    yield client, up
    for s in (client, up, service):
        s.close()


def test_frames_pass_unchanged_and_service_pings_are_answered(pair):
    client, up = pair
    data = _frame(0x0, 0x1, 1, b"x" * 70000)  # DATA larger than one recv
    settings = _frame(0x4, 0x0, 0, b"\x00\x03\x00\x00\x00\x64")
    # the client's preface and frames arrive byte for byte, in order, split anywhere
    sent = relay.PREFACE + settings + data
    for k in range(0, len(sent), 7001):
        client.sendall(sent[k : k + 7001])
    assert _read(up, len(sent)) == sent
    # the service's PING is answered to the service and never reaches the client
    ping = _frame(relay.PING, 0x0, 0, b"12345678")
    up.sendall(ping + settings)
    assert _read(up, len(ping)) == _frame(relay.PING, relay.ACK, 0, b"12345678")
    assert _read(client, len(settings)) == settings
    # the client's own PING goes to the service, and the service's answer to the client
    mine = _frame(relay.PING, 0x0, 0, b"abcdefgh")
    client.sendall(mine)
    assert _read(up, len(mine)) == mine
    answer = relay.ack(mine)
    up.sendall(answer)
    assert _read(client, len(answer)) == answer == _frame(relay.PING, 1, 0, b"abcdefgh")


def test_other_protocols_pass_unparsed(pair):
    """A client that does not start with HTTP/2's preface (TLS): every byte passes both
    ways, a PING-shaped frame included."""
    client, up = pair
    hello = b"\x16\x03\x01\x02\x00" + bytes(range(40))
    client.sendall(hello)
    assert _read(up, len(hello)) == hello
    ping = _frame(relay.PING, 0x0, 0, b"12345678")
    up.sendall(ping)
    assert _read(client, len(ping)) == ping


def test_a_close_on_one_side_closes_the_other(pair):
    client, up = pair
    client.sendall(relay.PREFACE)
    assert _read(up, len(relay.PREFACE)) == relay.PREFACE
    client.close()
    assert up.recv(1) == b""  # the service sees the client go, as without the relay


def test_port_taken_raises():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(OSError):
            relay.Relay(f"127.0.0.1:{taken.getsockname()[1]}", ("127.0.0.1", 1))


def test_jaxlib_client_through_the_relay():
    """jaxlib's own service and client (one process, the key-value store) through the relay
    on ``[::]:PORT`` (the address JAX gives the service): a value set is read back."""
    from jax._src.lib import _jax

    inner, front = (socket.socket() for _ in range(2))
    for s in (inner, front):
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in (inner, front)]
    for s in (inner, front):
        s.close()
    service = _jax.get_distributed_runtime_service(f"127.0.0.1:{ports[0]}", 1)
    relay.Relay(f"[::]:{ports[1]}", ("127.0.0.1", ports[0]))
    client = _jax.get_distributed_runtime_client(f"127.0.0.1:{ports[1]}", 0, init_timeout=20)
    client.connect()
    client.key_value_set("simpar/test", "4.25")
    assert client.blocking_key_value_get("simpar/test", 5000) == "4.25"
    assert dict(client.key_value_dir_get("simpar/")) == {"simpar/test": "4.25"}
    t0 = time.monotonic()
    client.shutdown()
    service.shutdown()
    assert time.monotonic() - t0 < 10


def test_service_helper_serves_through_the_relay_and_cleans_up():
    """``coordinator.ServiceProcess`` (process 0's helper): a jaxlib client on the run's
    address sets and reads a key; ``shutdown`` ends the helper and removes its socket's
    folder; a taken port is refused with a RuntimeError."""
    from jax._src.lib import _jax

    from simpar.parallel.coordinator import ServiceProcess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    helper = ServiceProcess(f"[::]:{port}", 1, shutdown_timeout=10)
    fds = Path(f"/proc/{helper.proc.pid}/fd")
    inodes = {
        os.readlink(f).strip("socket:[]") for f in fds.iterdir() if "socket:" in os.readlink(f)
    }
    folders = [  # the helper's listening Unix socket: a simpar-XXXX folder in the temp dir
        cols[7]
        for cols in (line.split() for line in open("/proc/net/unix").read().splitlines()[1:])
        if len(cols) == 8 and cols[6] in inodes and "/simpar-" in cols[7]
    ]
    client = _jax.get_distributed_runtime_client(f"127.0.0.1:{port}", 0, init_timeout=20)
    client.connect()
    client.key_value_set("simpar/x", "-1.5e-3")
    assert client.blocking_key_value_get("simpar/x", 5000) == "-1.5e-3"
    with pytest.raises(RuntimeError, match="did not start"):
        ServiceProcess(f"[::]:{port}", 1)
    client.shutdown()
    helper.shutdown()
    assert helper.proc.returncode == 0
    assert folders and not any(os.path.exists(os.path.dirname(f)) for f in folders), folders


CHILD = """
import os, sys, threading, time
from jax._src.lib import _jax
addr, flag = sys.argv[1], sys.argv[2]
c = _jax.get_distributed_runtime_client(addr, 0, init_timeout=30, heartbeat_timeout=30 * 86400)
c.connect()
big = "x" * (4 << 20)
def pump():  # data in flight when the stop comes: the service sends its BDP pings
    while True:
        c.key_value_set("big", big, allow_overwrite=True)
threading.Thread(target=pump, daemon=True).start()
print("ready", flush=True)
while not os.path.exists(flag):
    time.sleep(0.1)
c.key_value_set("after", "1")
print("alive", c.blocking_key_value_get("after", 5000), flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_client_stopped_past_the_ping_timeout_keeps_its_connection(tmp_path):
    """Two jaxlib clients, each alone with its own service (heartbeats never judged), send
    4 MB values in a loop and are SIGSTOPped for 65 s, then continued: the one connected
    straight to the service aborts (gRPC's 60 s ping timeout ended its connection: SIGABRT,
    ``Polled an error from coordination service``, as the run's processes did), the one
    connected through the relay sets and reads a key and exits 0. Measured here: the direct one
    aborted 5 of 5, the relayed one lived 5 of 5 (a 40 s stop: both live). The direct one is the
    control, and it depends on the host: on the CI machine of 2026-12-07 it lived too (exit 0),
    so it is checked to end in one of those two ways, and the relay's promise, that the relayed
    client lives, is what this test asserts."""
    from jax._src.lib import _jax

    def port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    services, procs = [], []
    for relayed in (False, True):
        inner = port()
        services.append(
            _jax.get_distributed_runtime_service(
                f"127.0.0.1:{inner}", 1, heartbeat_timeout=30 * 86400
            )
        )
        address = inner
        if relayed:
            address = port()
            relay.Relay(f"127.0.0.1:{address}", ("127.0.0.1", inner))
        flag = tmp_path / f"continued{int(relayed)}"
        cmd = [sys.executable, "-c", CHILD, f"127.0.0.1:{address}", str(flag)]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append((p, flag))
    for p, _ in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()[-2000:]
    time.sleep(1.0)
    for p, _ in procs:
        p.send_signal(signal.SIGSTOP)
    time.sleep(65.0)
    for p, _ in procs:
        p.send_signal(signal.SIGCONT)
    time.sleep(0.5)
    results = []
    for p, flag in procs:
        flag.touch()
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        results.append((p.returncode, out, err))
    (rc0, out0, err0), (rc1, out1, err1) = results
    aborted = rc0 == -signal.SIGABRT and "Polled an error from coordination service" in err0
    assert aborted or (rc0 == 0 and out0.split() == ["alive", "1"]), (rc0, err0[-2000:])
    assert rc1 == 0 and out1.split() == ["alive", "1"], (rc1, err1[-2000:])
