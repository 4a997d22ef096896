"""`orch exec`: one command on many hosts at once, each output line as `[host] line`.

The command runs as ssh would run it, through the user's login shell: one word is a
shell command line (`orch exec -- 'nvidia-smi | head -3'`), several words are one
exact argv. stdin is empty and stderr is merged into stdout, in order. Each host's
command runs in its own session, so that Ctrl-C can stop all of it: closing an SSH
channel alone would leave it running.
"""

from __future__ import annotations

import logging
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.models.errors import (
    EXIT_INFRA,
    InputError,
    Interrupted,
    OrchError,
)
from orchestrator.models.inventory import Host
from orchestrator.nodes.group import HostGroup
from orchestrator.transport import ConnectOptions, Transport

log = logging.getLogger(__name__)
PGID_MARK = "@orch-exec-pgid "
LOST = 255  # as ssh exits when the connection fails or drops
STOP_GRACE_S = 2.0
_SESSION = 'echo "@orch-exec-pgid $$"; exec "$0" -c "$1"'


@dataclass(frozen=True)
class HostRun:
    """How the command ended on one host: its exit code, or the error that stopped it."""

    host: str
    exit_code: int
    error: OrchError | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def describe(self) -> str:
        if self.error is not None:
            return f"{self.host} ({self.error.what})"
        if self.exit_code == LOST:
            return f"{self.host} (connection lost, or killed by a signal)"
        return f"{self.host} (exit {self.exit_code})"


def remote_command(argv: Sequence[str]) -> str:
    """The shell line that runs `argv` in its own session and reports its process group.

    Raises:
        InputError: no command given.
    """
    if not argv:
        raise InputError("no command to run", "orch exec -- COMMAND [ARGS...]")
    line = argv[0] if len(argv) == 1 else shlex.join(argv)
    shell = '"${SHELL:-/bin/sh}"'
    fallback = f"command -v setsid >/dev/null 2>&1 || exec {shell} -c {shlex.quote(line)}"
    session = f"exec setsid -w /bin/sh -c {shlex.quote(_SESSION)} {shell} {shlex.quote(line)}"
    return f"exec </dev/null 2>&1; {fallback}; {session}"


def run_everywhere(
    hosts: Sequence[Host],
    argv: Sequence[str],
    on_line: Callable[[str, str], None],
    options: ConnectOptions | None = None,
) -> list[HostRun]:
    """Run `argv` on every host in parallel; pass each output line to `on_line(host, line)`.

    Returns:
        Each host's outcome, in host order (unreachable hosts included).

    Raises:
        Interrupted: Ctrl-C; the command was stopped on every host first.
    """
    command = remote_command(argv)
    return run_lines(hosts, {h.name: command for h in hosts}, on_line, options)


def run_lines(
    hosts: Sequence[Host],
    lines: Mapping[str, str],
    on_line: Callable[[str, str], None],
    options: ConnectOptions | None = None,
) -> list[HostRun]:
    """`run_everywhere` with a command line of each host's own (`lines[host.name]`, made
    by `remote_command`)."""
    with HostGroup(hosts, options or ConnectOptions()) as group:
        runs = {e.host or "?": HostRun(e.host or "?", EXIT_INFRA, e) for e in group.connect(True)}
        pgids: dict[str, int] = {}

        def run_one(host: Host, transport: Transport) -> None:
            try:
                runs[host.name] = HostRun(
                    host.name, _follow(host, transport, lines[host.name], pgids, on_line)
                )
            except OrchError as exc:
                runs[host.name] = HostRun(host.name, LOST, exc)

        workers = [
            threading.Thread(target=run_one, args=(h, t), daemon=True, name=f"exec-{h.name}")
            for h in hosts
            if (t := group.transports.get(h.name)) is not None and h.name not in runs
        ]
        for worker in workers:
            worker.start()
        try:
            for worker in workers:
                while worker.is_alive():
                    worker.join(0.2)  # a timed wait, so that Ctrl-C gets through
        except KeyboardInterrupt:
            stopped = stop(group, pgids)
            for worker in workers:
                worker.join(STOP_GRACE_S + 5)
            raise Interrupted(f"interrupted: stopped the command on {', '.join(stopped)}") from None
    return [runs[h.name] for h in hosts if h.name in runs]


def _follow(
    host: Host,
    transport: Transport,
    command: str,
    pgids: dict[str, int],
    on_line: Callable[[str, str], None],
) -> int:
    process = transport.stream(command)
    try:
        for line in process.lines():
            if host.name not in pgids and line.startswith(PGID_MARK):
                pgids[host.name] = int(line.removeprefix(PGID_MARK))
                continue
            on_line(host.name, line)
        code = process.wait()
    finally:
        process.close()
    return LOST if code < 0 else code


def stop(group: HostGroup, pgids: dict[str, int]) -> list[str]:
    """TERM each host's command session, KILL what is left after a grace period.

    Returns:
        The hosts where it was stopped.
    """
    grace_steps = int(STOP_GRACE_S * 10)

    def kill(host: Host, transport: Transport) -> None:
        group_id = f"-{pgids[host.name]}"
        transport.run(
            f"kill -s TERM -- {group_id} 2>/dev/null; i=0; "
            f"while kill -0 -- {group_id} 2>/dev/null && [ $i -lt {grace_steps} ]; "
            f"do sleep 0.1; i=$((i+1)); done; kill -s KILL -- {group_id} 2>/dev/null; true",
            timeout=STOP_GRACE_S + 10,
        )

    done, errors = group.try_each(kill, only=list(pgids))
    for error in errors:
        log.warning("could not stop the command: %s", error.message)
    return list(done)


def worst_exit(runs: Sequence[HostRun]) -> int:
    """The exit code of `orch exec`: the highest of the hosts' codes."""
    return max((r.exit_code for r in runs), default=0)
