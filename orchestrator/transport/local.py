"""LocalTransport: the same commands as over SSH, run on this machine with /bin/sh."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from typing import IO

from orchestrator.transport.base import CommandResult, Stdin, stdin_parts


class LocalProcess:
    """A local command followed line by line (RemoteProcess)."""

    def __init__(self, command: str) -> None:
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )

    @property
    def stdout(self) -> IO[bytes]:
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

    def stream(self, command: str, idle_timeout: float | None = None) -> LocalProcess:
        # A local command cannot be cut off by the network: no idle timeout needed.
        return LocalProcess(command)

    def close(self) -> None:
        pass
