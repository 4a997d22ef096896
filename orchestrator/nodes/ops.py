"""Node operations on one host: probe, setup, start, kill. Each is one command.
(The code push, which may take several, is push.py's.)

Every command line is built from quoted words; values from job and inventory files
(args, env, paths) travel as JSON inside a single quoted argument and reach torchrun
through `execve`, never through a shell.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Callable
from typing import Any, Protocol

from orchestrator.jobs.plan import SUPERVISOR_NAME, NodeLaunch
from orchestrator.models.errors import HostError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.nodes.agent import last_json, packed_supervisor, supervisor_command
from orchestrator.nodes.shell import sh_path
from orchestrator.transport import Transport

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 30.0
PUSH_TIMEOUT_S = 600.0
KILL_GRACE_S = 3.0


class NodeRef(Protocol):
    """What node operations need to know of a node: a plan's or a stored record's."""

    @property
    def host(self) -> Host: ...

    @property
    def node_rank(self) -> int: ...

    @property
    def job_dir(self) -> str: ...


def _supervisor(node: NodeRef, *args: str) -> str:
    """The command line that runs the node's supervisor from its job directory."""
    job_dir = sh_path(node.job_dir)
    words = " ".join(shlex.quote(a) for a in args)
    return f"cd {job_dir} && exec {sh_path(node.host.python)} {SUPERVISOR_NAME} {words}"


def start(node: NodeLaunch, transport: Transport) -> dict[str, Any]:
    """Start torchrun under a detached supervisor in the node's job directory, whose
    code snapshot and supervisor `push.push` put there. Returns its pids.

    Raises:
        RemoteCommandError: the supervisor could not start torchrun.
    """
    spec = json.dumps({"argv": list(node.argv), "env": node.env})
    result = transport.run(_supervisor(node, "start", ".", spec), timeout=PUSH_TIMEOUT_S)
    started = last_json(result.stdout) or {}
    if not result.ok or "pid" not in started:
        raise RemoteCommandError(
            node.host.name,
            f"{SUPERVISOR_NAME} start",
            result.exit_code,
            result.stderr + str(started.get("error", "")),
            f"check free disk space and permissions of {node.host.workdir}",
        )
    log.debug("[job=%s host=%s] started %s", node.env.get("ORCH_JOB_ID"), node.host.name, started)
    return started


def follow_command(node: NodeRef, offsets: dict[str, int] | None = None, once: bool = False) -> str:
    """The command that streams the node's log files from `offsets` as framed chunks."""
    return _supervisor(
        node, "follow", ".", json.dumps(offsets or {}), *(["--once"] if once else [])
    )


def _run_sent(
    node: NodeRef, transport: Transport, args: list[str], timeout: float
) -> dict[str, Any]:
    """Run a supervisor command through the host's cached copy of the supervisor (sent
    along, stored on first use): it works even where the job directory was never
    created (a launch cut short), and costs no compile once the host has it."""
    command = supervisor_command(node.host, " ".join(shlex.quote(a) for a in args))
    result = transport.run(command, stdin=packed_supervisor(), timeout=timeout)
    report = last_json(result.stdout)
    if report is None:
        raise RemoteCommandError(
            node.host.name, f"{SUPERVISOR_NAME} {args[0]}", result.exit_code, result.stderr
        )
    return report


def kill(
    node: NodeRef,
    transport: Transport,
    job_id: str,
    grace_s: float = KILL_GRACE_S,
    port: int | None = None,
) -> dict[str, Any]:
    """Stop everything the job runs on this node: its process groups, then tagged strays.

    Returns:
        {"killed": [[pid, cmdline], ...], "forced": [...], "remaining": [...],
        "seconds": {"scan", "grace", "confirm"}}, and "port_free" when a port was given.
    """
    args = ["kill", node.job_dir, str(grace_s), job_id, *([str(port)] if port is not None else [])]
    return _run_sent(node, transport, args, timeout=grace_s + 30)


def node_status(node: NodeRef, transport: Transport) -> dict[str, Any]:
    """{"started", "running", "ended": exit record or None} of a node, from its host."""
    return _run_sent(node, transport, ["status", node.job_dir], timeout=PROBE_TIMEOUT_S)


def setup(
    node: NodeLaunch,
    transport: Transport,
    script: str,
    marker: str,
    digest: str,
    on_line: Callable[[str], None],
) -> None:
    """Run the job's `setup:` command with /bin/sh in the node's code snapshot, passing
    each output line to `on_line`; on success the host records `marker`, so that the
    same setup for the same code version does not run there again.

    Raises:
        HostError: the setup command failed; names the host, the exit code and the
            last lines of its output.
    """
    spec = {"script": script, "env": node.env, "marker": marker, "manifest": digest}
    process = transport.stream(_supervisor(node, "setup", ".", json.dumps(spec)))
    tail: list[str] = []
    try:
        for line in process.lines():
            on_line(line)
            tail = [*tail[1 - SETUP_TAIL_LINES :], line]
        code = process.wait()
        if code != 0 and not tail:
            tail = process.stderr().strip().splitlines()[-SETUP_TAIL_LINES:]
    finally:
        process.close()
    if code != 0:
        how = "the connection was lost" if code < 0 else f"it exited with code {code}"
        raise HostError(
            node.host.name,
            f"setup failed on {node.host.name}: {how}; last lines of its output:\n"
            + "\n".join("  " + line for line in tail),
            "fix the job's setup: command (it runs with /bin/sh in the job's code "
            f"directory); its full output is in {node.job_dir}/setup.log there",
        )


SETUP_TAIL_LINES = 15
