"""`nettest TEST ARGS...`: orch's network tests between the job's hosts.

    listen PORT EXPECT SECONDS TOKEN  listen on PORT; answer each connection with
                                      TOKEN; stop after EXPECT of them or SECONDS
    connect ADDR PORT SECONDS TOKEN   connect to ADDR:PORT; did TOKEN come back?
    bwserve SECONDS EXPECT IDLE       serve EXPECT throughput tests on a free port
    bwclient ADDR PORT SECONDS        send to ADDR:PORT for SECONDS, then receive

Each prints JSON lines, the records of kernel/host_wire.py: `listen` and `bwserve`
print NetReady as soon as they listen, then NetDone; `connect` prints Reached,
`bwclient` Bandwidth. Every command ends on its own within its time
limit: a closed SSH channel does not stop a remote command. Hosts may run an older
Python than the controller (3.8 up): `socket.timeout` is TimeoutError only from 3.10.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import time

from ..kernel.host_wire import Bandwidth, NetDone, NetReady, Reached
from ..kernel.messages import Message

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any

CHUNK = 1 << 20


def emit(record: Message) -> None:
    sys.stdout.write(record.to_json() + "\n")
    sys.stdout.flush()


def listener(port: int) -> socket.socket:
    server = socket.socket()
    # As c10d's TCPStore binds: a TIME_WAIT leftover must not make the test fail.
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("", port))
    server.listen(128)
    return server


def cmd_listen(args: list[str]) -> int:
    port, expect, seconds, token = int(args[0]), int(args[1]), float(args[2]), args[3]
    try:
        server = listener(port)
    except OSError as exc:
        emit(NetReady(ready=False, error=exc.strerror or str(exc)))
        return 1
    emit(NetReady(ready=True, port=server.getsockname()[1]))
    deadline = time.monotonic() + seconds
    peers: list[str] = []
    with server:
        while len(peers) < expect and time.monotonic() < deadline:
            server.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, addr = server.accept()
            except socket.timeout:  # noqa: UP041
                break
            with conn:
                conn.settimeout(2)
                try:
                    conn.sendall(token.encode())
                    # Wait for the peer to close first: its side keeps the TIME_WAIT.
                    conn.recv(1)
                except OSError:
                    pass
            peers.append(addr[0])
    emit(NetDone(done=True, peers=peers))
    return 0


def cmd_connect(args: list[str]) -> int:
    addr, port, seconds, token = args[0], int(args[1]), float(args[2]), args[3].encode()
    started = time.monotonic()
    got = b""
    try:
        with socket.create_connection((addr, port), timeout=seconds) as conn:
            while len(got) < len(token):
                chunk = conn.recv(len(token) - len(got))
                if not chunk:
                    break
                got += chunk
    except socket.timeout:  # noqa: UP041
        why = f"no answer within {seconds:g} s (a firewall dropping packets?)"
        emit(Reached(ok=False, error=why))
        return 0
    except OSError as exc:
        emit(Reached(ok=False, error=(exc.strerror or str(exc)).lower()))
        return 0
    if got != token:
        emit(Reached(ok=False, error="another program answered on that port, not orch's test"))
        return 0
    emit(Reached(ok=True, ms=round((time.monotonic() - started) * 1000, 1)))
    return 0


def cmd_bwserve(args: list[str]) -> int:
    seconds, expect, idle = float(args[0]), int(args[1]), float(args[2])
    try:
        server = listener(0)
    except OSError as exc:
        emit(NetReady(ready=False, error=exc.strerror or str(exc)))
        return 1
    emit(NetReady(ready=True, port=server.getsockname()[1]))
    served = 0
    with server:
        server.settimeout(idle)
        while served < expect:
            try:
                conn, _ = server.accept()
            except socket.timeout:  # noqa: UP041
                break
            with conn:
                conn.settimeout(seconds + idle)
                with contextlib.suppress(OSError):
                    serve_one(conn, seconds)
            served += 1
    emit(NetDone(done=True, served=served))
    return 0


def serve_one(conn: socket.socket, seconds: float) -> None:
    """One client's test: it sends for `seconds`, then we send for `seconds`."""
    nbytes, elapsed = receive_all(conn)
    conn.sendall(f"{nbytes} {elapsed:f}\n".encode())
    send_for(conn, seconds)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)  # the client closes first


def send_for(conn: socket.socket, seconds: float) -> None:
    data = memoryview(bytearray(CHUNK))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.sendall(data)


def receive_all(conn: socket.socket) -> tuple[int, float]:
    """Bytes received until EOF, and the seconds from the first byte to the last."""
    buf = bytearray(CHUNK)
    nbytes, first, last = 0, 0.0, 0.0
    while n := conn.recv_into(buf, CHUNK):
        last = time.monotonic()
        first = first or last
        nbytes += n
    return nbytes, last - first


def read_line(conn: socket.socket) -> str:
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        if not chunk:
            break
        line += chunk
    return line.decode()


def cmd_bwclient(args: list[str]) -> int:
    addr, port, seconds = args[0], int(args[1]), float(args[2])
    try:
        with socket.create_connection((addr, port), timeout=seconds + 10) as conn:
            send_for(conn, seconds)
            conn.shutdown(socket.SHUT_WR)
            nbytes, elapsed = read_line(conn).split()
            up = gbits(int(nbytes), float(elapsed))
            down = gbits(*receive_all(conn))
    except (OSError, ValueError) as exc:
        emit(Bandwidth(error=getattr(exc, "strerror", None) or str(exc) or type(exc).__name__))
        return 0
    emit(Bandwidth(up_gbps=up, down_gbps=down))
    return 0


def gbits(nbytes: int, seconds: float) -> float | None:
    return round(nbytes * 8 / seconds / 1e9, 3) if seconds > 0 else None


COMMANDS: dict[str, Any] = {
    "listen": cmd_listen,
    "connect": cmd_connect,
    "bwserve": cmd_bwserve,
    "bwclient": cmd_bwclient,
}


def main(args: list[str]) -> int:
    return int(COMMANDS[args[0]](args[1:]))
