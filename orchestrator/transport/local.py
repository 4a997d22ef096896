"""LocalTransport: the same commands as over SSH, run on this machine with /bin/sh."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, cast

from orchestrator.models.errors import HostError
from orchestrator.transport.base import CommandResult, Stdin, stdin_parts


class _IdleReader:
    """A pipe whose reads raise TimeoutError once the command stays silent for
    `idle_timeout` (as an SSH channel's do): a watchdog kills the silent command, and
    the read that its end cut short raises."""

    def __init__(self, proc: subprocess.Popen[bytes], idle_timeout: float) -> None:
        assert proc.stdout is not None
        self._raw, self._proc, self._idle = proc.stdout, proc, idle_timeout
        self._waiting_since: float | None = None  # a read is blocked since then
        self._timed_out = False
        threading.Thread(target=self._watch, daemon=True, name="local-idle").start()

    def _watch(self) -> None:
        while self._proc.poll() is None:
            since = self._waiting_since
            if since is not None and time.monotonic() - since > self._idle:
                self._timed_out = True
                self._proc.kill()
                return
            time.sleep(min(self._idle / 4, 0.5))

    def _call(self, method: Callable[[int], bytes], size: int) -> bytes:
        self._waiting_since = time.monotonic()
        try:
            data = method(size)
        finally:
            self._waiting_since = None
        if not data and self._timed_out:
            raise TimeoutError("no data from the command within the idle timeout")
        return data

    def readline(self, size: int = -1) -> bytes:
        return self._call(self._raw.readline, size)

    def read(self, size: int = -1) -> bytes:
        return self._call(self._raw.read, size)

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


class LocalProcess:
    """A local command followed line by line (RemoteProcess)."""

    def __init__(
        self, command: str, idle_timeout: float | None = None, stdin: bytes | None = None
    ) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        if stdin is not None:
            assert self._proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.write(stdin)
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
        self._reader = None if idle_timeout is None else _IdleReader(self._proc, idle_timeout)

    @property
    def stdout(self) -> IO[bytes]:
        if self._reader is not None:
            return cast(IO[bytes], self._reader)
        assert self._proc.stdout is not None
        return self._proc.stdout

    def lines(self) -> Iterator[str]:
        for raw in self.stdout:
            yield raw.decode("utf-8", "replace").rstrip("\n")

    def wait(self) -> int:
        return self._proc.wait()

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()
        self._stderr.close()


class SocketTunnel:
    """A local host's tunnel: a plain TCP connection."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(None)
        self.sock = sock

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


class LocalTransport:
    """Runs commands on this machine; `localhost` hosts never use SSH."""

    def __init__(self, name: str) -> None:
        self.name = name

    def connect(self) -> None:
        pass

    def run(
        self, command: str, stdin: Stdin | None = None, timeout: float | None = None
    ) -> CommandResult:
        proc = subprocess.run(
            ["/bin/sh", "-c", command],
            input=b"".join(stdin_parts(stdin)),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        return CommandResult(
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
        )

    def interactive(self, command: str) -> int:
        return subprocess.call(["/bin/sh", "-c", command])

    def tunnel(self, port: int, address: str = "127.0.0.1") -> SocketTunnel:
        try:
            return SocketTunnel(socket.create_connection((address, port), timeout=10))
        except OSError as exc:
            raise HostError(
                self.name,
                f"nothing answers on port {port} of {self.name} ({exc.strerror or exc})",
                "start the server there first",
            ) from None

    def stream(
        self, command: str, idle_timeout: float | None = None, stdin: bytes | None = None
    ) -> LocalProcess:
        # No network can cut a local command off, but it can hang: same rule as SSH.
        return LocalProcess(command, idle_timeout, stdin)

    def close(self) -> None:
        pass
