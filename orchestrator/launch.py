"""Node operations on one host: probe, push, start, kill. Each is one command.

Every command line is built from quoted words; values from job and inventory files
(args, env, paths) travel as JSON inside a single quoted argument and reach torchrun
through `execve`, never through a shell.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass
from typing import Any

from orchestrator.models.errors import HostError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.plan import SUPERVISOR_NAME, HostFacts, NodeLaunch
from orchestrator.shell import sh_path
from orchestrator.sync import supervisor_source
from orchestrator.transport import Transport

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 30.0
PUSH_TIMEOUT_S = 600.0
KILL_GRACE_S = 3.0
SHELL_NOT_FOUND = (126, 127)


@dataclass(frozen=True)
class ProbeResult:
    """A host's facts, plus the address its sshd was reached at."""

    facts: HostFacts
    ssh_addr: str | None


def probe(host: Host, transport: Transport, master: str | None) -> ProbeResult:
    """Learn a host's facts without importing torch (that costs seconds).

    Raises:
        HostError: python is missing on the host, or torch is not installed for it.
    """
    command = f"{sh_path(host.python)} - probe" + (f" {shlex.quote(master)}" if master else "")
    result = transport.run(command, stdin=supervisor_source(), timeout=PROBE_TIMEOUT_S)
    if result.exit_code in SHELL_NOT_FOUND:
        raise HostError(
            host.name,
            f"python not found at {host.python}",
            f"set 'python:' for {host.name} in the inventory to an interpreter that has torch",
        )
    if not result.ok:
        raise RemoteCommandError(
            host.name,
            command,
            result.exit_code,
            result.stderr,
            f"check that {host.python} is a working Python 3 on {host.name}",
        )
    try:
        data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError(host.name, f"unreadable probe output: {result.stdout[-200:]!r}") from None
    if not data.get("torch"):
        raise HostError(
            host.name,
            f"torch is not installed for {host.python}",
            f"install torch there ({host.python} -m pip install torch), "
            f"or point 'python:' for {host.name} at an interpreter that has it",
        )
    facts = HostFacts(
        hostname=str(data.get("hostname", "")),
        python_version=str(data.get("python", "")),
        torch_version=data.get("torch"),
        iface=data.get("iface"),
        local_addr=data.get("local_addr"),
        free_port=data.get("free_port"),
    )
    return ProbeResult(facts, data.get("ssh_addr"))


def _supervisor(node: NodeLaunch, *args: str) -> str:
    """The command line that runs the node's supervisor from its job directory."""
    job_dir = sh_path(node.job_dir)
    words = " ".join(shlex.quote(a) for a in args)
    return f"cd {job_dir} && exec {sh_path(node.host.python)} {SUPERVISOR_NAME} {words}"


def push_and_start(node: NodeLaunch, transport: Transport, archive: bytes) -> dict[str, Any]:
    """Unpack the code into the node's job directory and start torchrun there, in one
    round trip: torchrun runs under a detached supervisor. Returns its pids.

    Raises:
        RemoteCommandError: unpacking failed, or the supervisor could not start torchrun.
    """
    job_dir = sh_path(node.job_dir)
    spec = json.dumps({"argv": list(node.argv), "env": node.env})
    unpack = f"mkdir -p {job_dir} && cd {job_dir} && tar -xzf -"
    command = f"{unpack} && {_supervisor(node, 'start', '.', spec)}"
    result = transport.run(command, stdin=archive, timeout=PUSH_TIMEOUT_S)
    try:
        started: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        started = {}
    if not result.ok or "pid" not in started:
        what = unpack if not result.stdout.strip() else f"{SUPERVISOR_NAME} start"
        raise RemoteCommandError(
            node.host.name,
            what,
            result.exit_code,
            result.stderr + str(started.get("error", "")),
            f"check free disk space and permissions of {node.host.workdir}",
        )
    log.debug("[job=%s host=%s] started %s", node.env.get("ORCH_JOB_ID"), node.host.name, started)
    return started


def follow_command(node: NodeLaunch, offsets: dict[str, int] | None = None) -> str:
    """The command that streams the node's log lines as JSON records."""
    return _supervisor(node, "follow", ".", json.dumps(offsets or {}))


def kill(node: NodeLaunch, transport: Transport, grace_s: float = KILL_GRACE_S) -> dict[str, Any]:
    """Stop everything the job runs on this node: its process groups, then tagged strays."""
    command = _supervisor(node, "kill", ".", str(grace_s))
    result = transport.run(command, timeout=grace_s + 30)
    if not result.ok:
        raise RemoteCommandError(
            node.host.name, f"{SUPERVISOR_NAME} kill", result.exit_code, result.stderr
        )
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report
