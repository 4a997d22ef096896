"""The wire between a detached job's keeper and its members (daemon.py, member.py):
length-prefixed JSON messages, each with an HMAC over the connection's nonce, its
direction and its number, under the job's secret. A member proves it knows the secret
when it connects (`join`); the keeper greets it (`greet`) and refuses a stranger."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

GREETING = b"orch-keeper-1\n"
NONCE_BYTES = 32
MAC_BYTES = 32
HEADER = struct.Struct(">I")
MAX_MESSAGE = 1 << 20
HB_S = 1.0  # heartbeats, both ways
IO_TIMEOUT_S = 5.0


class Channel:
    """One authenticated connection between the keeper and a member (daemon.py, point 1)."""

    def __init__(self, sock: socket.socket, secret: bytes, nonce: bytes, keeper: bool) -> None:
        self.sock, self.secret, self.nonce = sock, secret, nonce
        self.mine, self.theirs = (b"k", b"m") if keeper else (b"m", b"k")
        self.sent = self.received = 0
        self.host: str | None = None  # the member's host, once it said hello
        self.closed = False
        self.give_up_at: float | None = None  # a read's deadline (monotonic), if any
        self._lock = threading.Lock()
        self._buffer = b""
        sock.settimeout(IO_TIMEOUT_S)

    def _mac(self, direction: bytes, number: int, payload: bytes) -> bytes:
        data = direction + self.nonce + struct.pack(">Q", number) + payload
        return hmac.new(self.secret, data, hashlib.sha256).digest()

    def send(self, message: dict[str, Any]) -> None:
        """Raises OSError when the connection is gone."""
        payload = json.dumps(message).encode()
        with self._lock:
            mac = self._mac(self.mine, self.sent, payload)
            self.sent += 1
            self.sock.sendall(HEADER.pack(len(payload)) + mac + payload)

    def receive(self) -> dict[str, Any]:
        """The next message. Raises EOFError (closed) or ValueError (not authentic)."""
        (size,) = HEADER.unpack(self._read(HEADER.size))
        if size > MAX_MESSAGE:
            raise ValueError(f"message of {size} bytes")
        mac, payload = self._read(MAC_BYTES), self._read(size)
        if not hmac.compare_digest(mac, self._mac(self.theirs, self.received, payload)):
            raise ValueError("a message failed its authentication")
        self.received += 1
        message = json.loads(payload)
        if not isinstance(message, dict):
            raise ValueError("not a message")
        return message

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:  # noqa: UP041 (TimeoutError only from 3.10; hosts: 3.8)
                if self.closed:
                    raise EOFError("closed") from None
                if self.give_up_at is not None and time.monotonic() > self.give_up_at:
                    raise EOFError("no answer in time") from None
                continue
            except OSError as exc:
                raise EOFError(str(exc)) from None
            if not chunk:
                raise EOFError("the connection closed")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


def proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, b"orch-keeper-member" + nonce, hashlib.sha256).digest()


def greet(sock: socket.socket, secret: bytes) -> Channel | None:
    """The keeper's side of a handshake: a Channel, or None for a stranger."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    channel = Channel(sock, secret, nonce, keeper=True)
    try:
        sock.sendall(GREETING + nonce)
        if hmac.compare_digest(channel._read(MAC_BYTES), proof(secret, nonce)):
            return channel
    except (OSError, EOFError):
        pass
    channel.close()
    return None


def join(addr: str, port: int, secret: bytes, wait_s: float | None = None) -> Channel:
    """The member's side: connect and prove it knows the job's secret.

    Args:
        wait_s: how long to wait for the greeting (a member that is not yet its
            job's keeper listens, but greets nobody); None: as long as it takes.

    Raises:
        OSError / EOFError / ValueError: no keeper there, or not this job's.
    """
    sock = socket.create_connection((addr, port), IO_TIMEOUT_S)
    channel = Channel(sock, secret, b"", keeper=False)
    if wait_s is not None:
        channel.give_up_at = time.monotonic() + wait_s
        sock.settimeout(min(wait_s, 0.5))
    try:
        greeting = channel._read(len(GREETING) + NONCE_BYTES)
    except EOFError:
        channel.close()
        raise
    channel.give_up_at = None
    sock.settimeout(IO_TIMEOUT_S)
    if not greeting.startswith(GREETING):
        channel.close()
        raise ValueError(f"not an orch keeper at {addr}:{port}")
    channel.nonce = greeting[len(GREETING) :]
    sock.sendall(proof(secret, channel.nonce))
    return channel


def read_messages(channel: Channel, put: Callable[[Channel, dict[str, Any] | None], None]) -> None:
    """Hand every message to `put`, then None once the channel is gone."""
    try:
        while True:
            put(channel, channel.receive())
    except (EOFError, ValueError, OSError):
        put(channel, None)


def ready(fd: int, reply: dict[str, Any]) -> None:
    os.write(fd, json.dumps(reply).encode())
    os.close(fd)
