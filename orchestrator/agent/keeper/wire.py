"""The wire between a detached job's keeper and its members (daemon.py, member.py):
length-prefixed JSON messages, each with an HMAC over the connection's nonce, its
direction and its number, under the job's secret. A member proves it knows the secret
when it connects (`join`); the keeper greets it (`greet`) and refuses a stranger.

Each message is one of the classes below, its kind in "k": built with `Channel.tell`,
parsed by `Channel.hear` (kernel/messages.py checks its fields' types; a kind this
side does not know is skipped, fields it does not know ignored). decisions.py, pure,
takes and gives them as these classes; kernel/line.py's lease rounds as verbs and
parsed lease answers.
"""

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
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..kernel.messages import Message, MessageError, parse_message
from ..kernel.replies import ExitRecord

GREETING = b"orch-keeper-1\n"
NONCE_BYTES = 32
MAC_BYTES = 32
HEADER = struct.Struct(">I")
MAX_MESSAGE = 1 << 20
HB_S = 1.0  # heartbeats, both ways
IO_TIMEOUT_S = 5.0
C = TypeVar("C", bound=Message)


class WireMessage(Message):
    """A message between the keeper and a member; KIND is its "k"."""

    KIND = ""


class Heartbeat(WireMessage):
    """Either way, every HB_S; a member's carries `idle`: seconds since its node's
    ranks last printed, on its host's clock (None: none runs yet), for the stall
    watchdog."""

    KIND = "hb"
    idle: float | None = None


# ------------------------------------------------ from a member to the keeper


class Hello(WireMessage):
    """`port`: the member's standby listener, where it would keep the job
    (takeover.py); None where it cannot."""

    KIND = "hello"
    host: str
    port: int | None = None


class NodeEnd(ExitRecord):
    """The member's node of `attempt` ended, as its host recorded it; where it failed
    and the job has `notify:`, its failing rank and that rank's last lines."""

    KIND = "end"
    attempt: int
    rank: int | None = None
    tail: Sequence[str] = ()


class NodeStarted(WireMessage):
    """The answer to Start: the node runs (`ok`), waits in line (`queued`), or not."""

    KIND = "started"
    attempt: int
    ok: bool
    error: str | None = None
    queued: bool = False


class StackTaken(WireMessage):
    """The answer to StackWanted: the `stack` command's reply for the member's node
    (kernel/replies.py StackReply, as data)."""

    KIND = "stacks"
    attempt: int
    reply: dict[str, Any]


class Stopped(WireMessage):
    KIND = "stopped"
    attempt: int


class PortFound(WireMessage):
    """A free port on the member's host: the next attempt's rendezvous."""

    KIND = "port"
    port: int


class LeaseAnswered(WireMessage):
    """The agent's `lease VERB` answer for the member's node (kernel/line.py)."""

    KIND = "lease"
    verb: str
    reply: dict[str, Any]


# ------------------------------------------------ from the keeper to a member


class Stop(WireMessage):
    KIND = "stop"
    attempt: int


class Start(WireMessage):
    """Start the member's node of the attempt `place` (kernel/placement.py) says."""

    KIND = "start"
    place: dict[str, Any]


class PortWanted(WireMessage):
    KIND = "port"


class LeaseAsked(WireMessage):
    KIND = "lease"
    verb: str


class StackWanted(WireMessage):
    """The stall watchdog: take the node's stacks (the `stack` command), named `taken`,
    py-spy from `tools_dir` by `pyspy` (StackRequest's)."""

    KIND = "stacks"
    attempt: int
    taken: str
    tools_dir: str | None = None
    pyspy: dict[str, str] | None = None


class Bye(WireMessage):
    KIND = "bye"


class State(WireMessage):
    """The keeper's snapshot (decisions.Keeping.snapshot), for a member to take over."""

    KIND = "state"
    snapshot: dict[str, Any]


FROM_MEMBER: dict[str, type[Message]] = {
    c.KIND: c
    for c in (
        Heartbeat,
        Hello,
        NodeEnd,
        NodeStarted,
        Stopped,
        PortFound,
        LeaseAnswered,
        StackTaken,
    )
}
TO_MEMBER: dict[str, type[Message]] = {
    c.KIND: c for c in (Heartbeat, Stop, Start, PortWanted, LeaseAsked, Bye, State, StackWanted)
}


def record(message: Message) -> dict[str, Any]:
    """A message as data: its fields and its kind in "k"."""
    return {"k": getattr(message, "KIND", ""), **message.as_dict()}


def for_member(data: dict[str, Any]) -> Message:
    """What the keeper decided to send (data, decisions.py) as its message.

    Raises:
        MessageError: it is no message a member takes.
    """
    kind = TO_MEMBER.get(str(data.get("k")))
    if kind is None:
        raise MessageError(f"no message to a member is {data.get('k')!r}")
    return parse_message(kind, data)


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

    def tell(self, message: Message) -> None:
        """Send a message. Raises OSError when the connection is gone."""
        self.send(record(message))

    def hear(self) -> Message | None:
        """The next message, parsed as its class; None for a kind this side does not
        know (a newer peer's). Raises EOFError (closed), ValueError (not authentic)
        or MessageError (a field missing or of the wrong type, naming the sender)."""
        data = self.receive()
        kind = (TO_MEMBER if self.mine == b"m" else FROM_MEMBER).get(str(data.get("k")))
        if kind is None:
            return None
        sender = "the keeper" if self.mine == b"m" else self.host or "a member"
        return parse_message(kind, data, host=sender)

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


def read_messages(channel: Channel, put: Callable[[Channel, Message | None], None]) -> None:
    """Hand every message to `put`, then None once the channel is gone (a message of
    the wrong shape ends it too, said in the log)."""
    try:
        while True:
            message = channel.hear()
            if message is not None:
                put(channel, message)
    except MessageError as exc:
        print(f"unreadable message: {exc}", flush=True)
        put(channel, None)
    except (EOFError, ValueError, OSError):
        put(channel, None)


def ready(fd: int, reply: dict[str, Any]) -> None:
    os.write(fd, json.dumps(reply).encode())
    os.close(fd)


def read_config(cls: type[C], verb: str) -> C | None:
    """A keeper command's config, on stdin, as `cls`; None where it is not one (bad
    JSON, or a MessageError: a controller of another version), said as its reply."""
    import sys

    try:
        return parse_message(cls, json.loads(sys.stdin.read()))
    except ValueError as exc:
        print(json.dumps({"error": f"keeper {verb}: {exc}"}))
        return None
