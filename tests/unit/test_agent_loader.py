"""The agent's archive goes only to a host that lacks its version (nodes/agent.py), run
through the real loader with /bin/sh."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from orchestrator.models.errors import HostError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.transport.base import CommandResult, Stdin, stdin_parts
from orchestrator.transport.local import LocalProcess, LocalTransport


class Recording(LocalTransport):
    """A local transport that keeps how many bytes each command got on stdin."""

    def __init__(self) -> None:
        super().__init__("local")
        self.sent: list[int] = []

    def run(
        self, command: str, stdin: Stdin | None = None, timeout: float | None = None
    ) -> CommandResult:
        parts = list(stdin_parts(stdin))
        self.sent.append(sum(len(p) for p in parts))
        return super().run(command, parts, timeout)


def local_host(workdir: Path) -> Host:
    return Host(name="local", address="localhost", python=sys.executable, workdir=str(workdir))


def test_the_archive_goes_once_then_commands_run_the_installed_version(tmp_path: Path) -> None:
    host, transport = local_host(tmp_path / "work"), Recording()
    first = agent.run(host, transport, ["status", str(tmp_path / "no-job")])
    # Tried without it; the loader said the version is missing before reading stdin.
    assert transport.sent == [0, len(agent.packed())]
    assert (tmp_path / "work" / "agent" / agent.version()).is_dir()
    again = agent.run(host, transport, ["status", str(tmp_path / "no-job")], [b"{}"])
    assert transport.sent[2:] == [2]  # the command's own stdin only, no archive
    assert again == first
    command, archive = agent.invocation(host, "sync")
    assert archive == b"" and shlex.split(command)[5:7] == ["0", agent.version()]


def test_without_the_archive_the_loader_exits_missing_and_unpacks_nothing(
    tmp_path: Path,
) -> None:
    host = local_host(tmp_path / "work")
    command = agent.command(host, "status", str(tmp_path / "no-job"), archive=False)
    result = LocalTransport("local").run(command, stdin=b"not an archive")
    assert result.exit_code == agent.MISSING
    assert agent.MISSING_NOTE in result.stderr
    assert not (tmp_path / "work" / "agent" / agent.version()).exists()


def test_a_workdir_that_cannot_hold_the_version_gets_the_archive_every_time(
    tmp_path: Path,
) -> None:
    """As a read-only workdir: each command runs from a temporary copy. A file where
    the workdir should be makes any user's unpack fail, root's too."""
    (tmp_path / "file").write_text("")
    host, transport = local_host(tmp_path / "file" / "work"), Recording()
    replies = [agent.run(host, transport, ["status", str(tmp_path / "no-job")]) for _ in range(4)]
    assert all(r == replies[0] for r in replies)
    assert not (tmp_path / "file").is_dir()
    packed = len(agent.packed())
    # Missing twice (once after it came): from then on the archive goes at once.
    assert transport.sent == [0, packed, 0, packed, packed, packed]


def test_a_stream_told_the_version_is_there_names_it_when_it_went_missing(
    tmp_path: Path,
) -> None:
    host = local_host(tmp_path / "work")
    agent.run(host, LocalTransport("local"), ["status", str(tmp_path / "no-job")])
    agent.run(host, LocalTransport("local"), ["status", str(tmp_path / "no-job")])
    command, archive = agent.invocation(host, "status", str(tmp_path / "no-job"))
    assert archive == b""
    for path in sorted((tmp_path / "work" / "agent").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    process: LocalProcess = LocalTransport("local").stream(command, stdin=archive)
    result = CommandResult(process.wait(), b"".join(process.stdout).decode(), process.stderr())
    with pytest.raises(HostError, match="went missing"):
        agent.reply_of(host, result, "status")
    assert agent.invocation(host, "status")[1] == agent.packed()  # sent again next time
