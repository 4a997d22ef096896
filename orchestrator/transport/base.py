"""The Transport protocol: how orch runs commands on one host.

Two implementations, chosen by the inventory (never monkeypatched): `SshTransport`
for remote hosts, one SSH connection per host with a channel per command, and
`LocalTransport` for localhost, which runs the same commands with /bin/sh.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one command on one host."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class RemoteProcess(Protocol):
    """A command whose stdout is read while it runs.

    1. `stdout` is its raw stdout; a read raises TimeoutError when nothing arrived
       for the stream's idle timeout, and returns b"" at the end or when the
       connection dropped.
    2. `lines()` yields stdout lines without their newline, until the command ends
       or the connection drops.
    3. `wait()` returns the exit code, or -1 when the connection was lost.
    4. `close()` stops reading and releases the channel; the remote command may go on.
    """

    @property
    def stdout(self) -> IO[bytes]: ...

    def lines(self) -> Iterator[str]: ...

    def wait(self) -> int: ...

    def stderr(self) -> str: ...

    def close(self) -> None: ...


Stdin = bytes | Iterable[bytes]  # one buffer, or several sent in order, taken as they go


def stdin_parts(stdin: Stdin | None) -> Iterable[bytes]:
    """The buffers of a command's stdin, in order."""
    if stdin is None:
        return ()
    return (stdin,) if isinstance(stdin, bytes) else stdin


def coalesced(
    parts: Iterable[bytes], small: int = 64 << 10, batch: int = 256 << 10
) -> Iterator[bytes]:
    """The same bytes, in order, with runs of small parts joined up to `batch` bytes:
    every send is an SSH packet of its own, and a push of many small files would
    otherwise cost a packet (and its Python overhead) per file and host."""
    pending: list[bytes] = []
    size = 0
    for part in parts:
        if len(part) >= small:
            if size:
                yield b"".join(pending)
            pending, size = [], 0
            yield part
            continue
        pending.append(part)
        size += len(part)
        if size >= batch:
            yield b"".join(pending)
            pending, size = [], 0
    if size:
        yield b"".join(pending)


class Transport(Protocol):
    """Runs commands on one host.

    1. `connect()` reaches the host or raises HostError (exit 3) naming it.
    2. `run()` runs a /bin/sh command line, with optional stdin bytes (one buffer, or
       several sent one after another and taken only as they are sent: a push shares
       its frames between hosts rather than joining a copy for each, and counts its
       progress as they go), and returns its exit code and output; it never raises
       for a non-zero exit.
    3. `stream()` starts a command and returns a RemoteProcess to follow its stdout;
       with `idle_timeout`, reads give up after that many silent seconds; `stdin`,
       if given, is sent whole before EOF.
    4. Commands may run concurrently on one transport, from several threads.
    5. `tunnel(port)` opens a TCP connection to `port` on the host's own loopback,
       made from the host (`orch forward`); HostError where nothing listens there.
    6. `interactive(command)` runs a command with this process's stdin, stdout and
       stderr (a terminal on the host where stdin is one here: `orch ssh`) and
       returns its exit status.
    7. `close()` releases the connection; it never raises.
    """

    name: str

    def connect(self) -> None: ...

    def run(
        self, command: str, stdin: Stdin | None = None, timeout: float | None = None
    ) -> CommandResult: ...

    def stream(
        self, command: str, idle_timeout: float | None = None, stdin: bytes | None = None
    ) -> RemoteProcess: ...

    def tunnel(self, port: int, address: str = "127.0.0.1") -> Tunnel: ...

    def interactive(self, command: str) -> int: ...

    def close(self) -> None: ...


class Tunnel(Protocol):
    """A TCP connection to a port on the host's loopback (or an address the host
    reaches: a Slurm node, from its login node), made from the host's side (SSH's
    direct-tcpip channel; a plain socket for a local host)."""

    def recv(self, size: int) -> bytes: ...

    def sendall(self, data: bytes) -> None: ...

    def shutdown_write(self) -> None: ...

    def close(self) -> None: ...


def default_known_hosts() -> Path | None:
    """$ORCH_KNOWN_HOSTS: the known_hosts file that replaces the user's files (those
    that `UserKnownHostsFile` names, by default `~/.ssh/known_hosts`); None: those."""
    value = os.environ.get("ORCH_KNOWN_HOSTS")
    return Path(value) if value else None


@dataclass(frozen=True)
class ConnectOptions:
    """How to open SSH connections; `notice` reports first-use host keys."""

    known_hosts: Path | None = field(default_factory=default_known_hosts)
    connect_timeout: float = CONNECT_TIMEOUT_S
    # Keeps NATs and firewalls from dropping a quiet connection (following a job
    # already hears a heartbeat every 2 s); paramiko sends it on every connection,
    # busy or not, and at 5 s it was a sixth of a 32-host launch's controller CPU.
    keepalive_s: int = 15
    notice: Callable[[str], None] = lambda message: None
