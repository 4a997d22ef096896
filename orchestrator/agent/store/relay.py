"""Relay push: hosts copy the code among themselves, so that the laptop's link carries
each object once (sync.py for the rest of the design).

`relay` (stdin: {"store", "secret"}) runs on one host, the seed, while the controller
pushes to it: it listens on a free TCP port, prints {"port": P}, and serves objects
of its store to the other hosts of the push. A host fetches with `fetch()`, when its
`sync` stream holds an R frame {"addr", "port", "secret", "keys"}.

1. Only the push's hosts get anything: the server sends a fresh nonce, and the client
   must answer HMAC-SHA256(secret, nonce); the secret is new per push and travels on
   the SSH channels' stdin, never in an argv.
2. A relay can delay a push, never change it: every object is verified by its hash as
   it is stored (ContentStore.put_piece), and what a host could not fetch it reports
   missing, for the controller to send it directly.
3. The seed serves an object as soon as it has it: the other hosts' copies overlap the
   controller's push to the seed, so the laptop's link is the only wait.
4. The server ends once `expect` clients came and went, when the controller closes
   its channel (an error on its stdout), or after MAX_LIFE_S whatever happens.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import select
import socket
import sys
import threading
import time
from typing import Any

from ..kernel.fileio import describe_error
from ..kernel.framing import frame, json_frame, read_exact, read_frame
from ..kernel.layout import KEY_RE
from ..kernel.messages import parse_message
from ..kernel.requests import RelayConfig, RelayOrder
from .content import ContentStore

GREETING = b"orch-relay-1\n"
NONCE_BYTES = 32
CHUNK_BYTES = 4 << 20
CONNECT_TIMEOUT_S = 3.0
WAIT_S = 600.0  # how long a client waits for the seed, and the seed for an object
MAX_LIFE_S = 3600.0
HEARTBEAT_S = 1.0  # how often the server looks at the clock, at most


def main(args: list[str]) -> int:
    """`relay`: serve the store named on stdin to `expect` clients (0: any number), or
    until the channel closes."""
    try:
        config = parse_message(RelayConfig, json.loads(sys.stdin.read()))
    except ValueError as exc:  # bad JSON, or a MessageError: a controller of another version
        sys.stderr.write(f"orch agent relay: {exc}\n")
        return 2
    store = ContentStore(os.path.expanduser(config.store))
    secret = bytes.fromhex(config.secret)
    expect = config.expect
    dual = socket.has_dualstack_ipv6()  # IPv4 and IPv6 peers alike, where it can
    listener = socket.create_server(
        ("", 0), family=socket.AF_INET6 if dual else socket.AF_INET, backlog=64, dualstack_ipv6=dual
    )
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    finished_r, finished_w = os.pipe()  # a byte per client served
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    poller.register(finished_r, select.POLLIN)
    # The controller's end of the channel: its closing shows as an error on stdout.
    poller.register(sys.stdout.fileno(), 0)
    stopping = threading.Event()
    served, started = 0, time.monotonic()
    while time.monotonic() - started < MAX_LIFE_S and not (expect and served >= expect):
        events = dict(poller.poll(HEARTBEAT_S * 1000))
        if events.get(sys.stdout.fileno(), 0) & (select.POLLERR | select.POLLHUP):
            break
        if finished_r in events:
            served += len(os.read(finished_r, 1024))
        if listener.fileno() in events:
            conn, _ = listener.accept()
            client = (conn, store, secret, stopping, finished_w)
            threading.Thread(target=serve, args=client, daemon=True).start()
    stopping.set()
    return 0


def serve(
    conn: socket.socket,
    store: ContentStore,
    secret: bytes,
    stopping: threading.Event,
    finished: int,
) -> None:
    """One client: check its answer to a fresh nonce, then send what it asks for; a
    byte to `finished` when done, however it went (the client reports what it lacks)."""
    try:
        with conn:
            conn.settimeout(WAIT_S)
            stream = conn.makefile("rwb")
            nonce = secrets.token_bytes(NONCE_BYTES)
            stream.write(GREETING + nonce)
            stream.flush()
            if not hmac.compare_digest(read_exact(stream, 32), proof(secret, nonce)):
                return  # not one of this push's hosts: nothing
            kind, payload = read_frame(stream)
            keys = json.loads(payload)["keys"] if kind == b"Q" else []
            for key in keys:
                if stopping.is_set() or not send_object(stream, store, str(key)):
                    break
            stream.write(frame(b"Z"))
            stream.flush()
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return
    finally:
        os.write(finished, b"x")


def send_object(stream: Any, store: ContentStore, key: str) -> bool:
    """Send one object once the seed has it; False when it never came."""
    path = store.object_path(key)  # checks the key
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            stream.write(json_frame(b"X", {"k": key}))
            return False
        time.sleep(0.02)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        stream.write(json_frame(b"O", {"k": key, "size": size}))
        while chunk := f.read(CHUNK_BYTES):
            stream.write(chunk)
    return True


def proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, b"orch-relay-client" + nonce, hashlib.sha256).digest()


def fetch(store: ContentStore, request: RelayOrder, push: str) -> dict[str, Any]:
    """Fetch the objects `request.keys` this store lacks from the relay it names.

    Returns:
        {"relayed": objects stored, "relayed_bytes": their bytes}, plus
        "relay_error" when the relay could not give them all (the controller then
        sends what is still missing itself).
    """
    wanted = [
        k
        for k in request.keys
        if KEY_RE.fullmatch(str(k)) and not os.path.exists(store.object_path(k))
    ]
    # Connects even when it lacks nothing: the relay ends once every host came.
    report: dict[str, Any] = {"relayed": 0, "relayed_bytes": 0}
    where = f"{request.addr}:{request.port}"
    try:
        conn = socket.create_connection((request.addr, request.port), CONNECT_TIMEOUT_S)
    except OSError as exc:
        report["relay_error"] = f"cannot reach the relay at {where}: {describe_error(exc)}"
        return report
    with conn:
        conn.settimeout(WAIT_S)
        stream = conn.makefile("rwb")
        try:
            greeting = read_exact(stream, len(GREETING) + NONCE_BYTES)
            if not greeting.startswith(GREETING):
                raise ValueError("not an orch relay")
            stream.write(proof(bytes.fromhex(request.secret), greeting[len(GREETING) :]))
            stream.write(json_frame(b"Q", {"keys": wanted}))
            stream.flush()
            receive(stream, store, push, report)
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
            report["relay_error"] = f"the relay at {where} failed: {describe_error(exc)}"
    return report


def receive(stream: Any, store: ContentStore, push: str, report: dict[str, Any]) -> None:
    """Store the objects the relay sends, each verified by its hash, until it ends."""
    while True:
        kind, payload = read_frame(stream)
        if kind == b"Z":
            return
        meta = json.loads(payload)
        if kind == b"X":
            raise ValueError(f"the relay never got object {meta['k']}")
        key, size, off = str(meta["k"]), int(meta["size"]), 0
        while True:
            data = read_exact(stream, min(CHUNK_BYTES, size - off))
            if store.put_piece({"k": key, "size": size, "off": off}, data, push):
                break
            off += len(data)
        report["relayed"] += 1
        report["relayed_bytes"] += size
