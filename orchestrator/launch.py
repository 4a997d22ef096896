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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.models.errors import HostError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.plan import SUPERVISOR_NAME, HostFacts, NodeLaunch
from orchestrator.shell import sh_path
from orchestrator.sync import last_json, packed_supervisor, supervisor_command, supervisor_source
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


def probe(
    host: Host,
    transport: Transport,
    master: str | None,
    port: int | None = None,
    gpus: bool = False,
    modules: Sequence[str] = (),
) -> ProbeResult:
    """Learn a host's facts without importing torch (that costs seconds).

    Args:
        master: the address whose route (interface, source address) to report.
        port: also report whether this port is free there, and who holds it.
        gpus: also count GPUs (nvidia-smi, which can take a second on a big box).
        modules: top-level modules to look for with the host's python.

    Raises:
        HostError: python is missing on the host, or torch is not installed for it.
    """
    found = probe_host(host, transport, master, port, gpus, modules)
    if not found.facts.torch_version:
        raise torch_missing(host)
    return found


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


def probe_host(
    host: Host,
    transport: Transport,
    master: str | None = None,
    port: int | None = None,
    gpus: bool = True,
    modules: Sequence[str] = (),
) -> ProbeResult:
    """The probe without a verdict: facts even where torch is missing (`orch check`).

    Raises:
        HostError: python is missing, or the probe's output cannot be read.
        RemoteCommandError: the probe itself failed.
    """
    options = {
        "master": master,
        "port": port,
        "workdir": host.workdir,
        "gpus": gpus,
        "modules": list(modules),
    }
    command = f"{sh_path(host.python)} - probe {shlex.quote(json.dumps(options))}"
    result = transport.run(command, stdin=supervisor_source(), timeout=PROBE_TIMEOUT_S)
    received = time.time()
    if result.exit_code in SHELL_NOT_FOUND:
        raise HostError(
            host.name,
            f"python not found at {host.python}",
            f"set 'python:' for {host.name} in the inventory to an interpreter that has torch",
        )
    if not result.ok:
        raise RemoteCommandError(
            host.name,
            f"{host.python} - probe",
            result.exit_code,
            result.stderr,
            f"check that {host.python} is a working Python 3 on {host.name}",
        )
    data = last_json(result.stdout)
    if data is None:
        raise HostError(host.name, f"unreadable probe output: {result.stdout[-200:]!r}")
    return ProbeResult(facts_from_probe(data, received), data.get("ssh_addr"))


def torch_missing(host: Host) -> HostError:
    return HostError(
        host.name,
        f"torch is not installed for {host.python}",
        f"install torch there ({host.python} -m pip install torch), "
        f"or point 'python:' for {host.name} at an interpreter that has it",
    )


def facts_from_probe(data: dict[str, Any], received_at: float) -> HostFacts:
    """HostFacts from the probe's JSON; `received_at` is this machine's clock when it came.

    The probe stamps its clock just before it answers, so the difference is the
    clock offset, give or take the time the answer took to arrive.
    """
    gpus = data.get("gpus") or {}
    port = data.get("port") or {}
    remote_time = data.get("time")
    return HostFacts(
        hostname=str(data.get("hostname", "")),
        python_version=str(data.get("python", "")),
        torch_version=data.get("torch"),
        iface=data.get("iface"),
        local_addr=data.get("local_addr"),
        free_port=data.get("free_port"),
        os=str(data.get("os", "")),
        python_executable=str(data.get("executable", "")),
        torch_cuda=data.get("torch_cuda"),
        nccl_version=data.get("nccl"),
        gpu_count=gpus.get("count"),
        gpu_names=tuple(str(g.get("name", "")) for g in gpus.get("list", ())),
        gpu_error=gpus.get("error"),
        addresses=tuple(sorted((data.get("addresses") or {}).items())),
        route_error=data.get("route_error"),
        port=port.get("port"),
        port_free=port.get("free"),
        port_holders=tuple(describe_holder(h) for h in port.get("holders", ())),
        disk_free=data.get("disk_free"),
        clock_offset_s=remote_time - received_at if isinstance(remote_time, float) else None,
        modules_missing=tuple(m for m, found in (data.get("modules") or {}).items() if not found),
    )


def describe_holder(holder: dict[str, Any]) -> str:
    """`pid 4242 (python train.py) of user bob`, or who it is when the pid is hidden."""
    user = holder.get("user") or "?"
    if not holder.get("pid"):
        return f"a process of user {user} (hidden from this user: run check as {user} or root)"
    command = " ".join(str(holder.get("command") or "?").split())
    if len(command) > 80:  # keep both ends: the program, and the arguments that name the run
        command = f"{command[:38]} ... {command[-38:]}"
    return f"pid {holder['pid']} ({command}) of user {user}"


SETUP_TAIL_LINES = 15


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
