"""Node operations on one host: setup, start, follow, status, kill. Each is one agent
command. (The probe is probe.py's; the code push, which may take several, push.py's.)

Every command line is built from quoted words; values from job and inventory files
(args, env, paths) travel as JSON inside a single quoted argument and reach torchrun
through `execve`, never through a shell.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Protocol

from orchestrator.agent.kernel import layout, messages
from orchestrator.agent.kernel.lease_wire import LeaseStart, printable
from orchestrator.agent.kernel.replies import KillReport, StatusReply
from orchestrator.agent.kernel.requests import (
    LeaseRequest,
    NodeTemplate,
    SetupRequest,
    StartRequest,
)
from orchestrator.models.errors import HostError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.transport import Transport

log = logging.getLogger(__name__)
STATUS_TIMEOUT_S = 30.0
START_TIMEOUT_S = 600.0
KILL_GRACE_S = 3.0


class NodeRef(Protocol):
    """What node operations need to know of a node: a plan's or a stored record's."""

    @property
    def host(self) -> Host: ...

    @property
    def node_rank(self) -> int: ...

    @property
    def job_dir(self) -> str: ...


class NodeEnv(NodeRef, Protocol):
    """A node and its environment: what its setup runs with."""

    @property
    def env(self) -> dict[str, str]: ...


class NodeStart(NodeEnv, Protocol):
    """What starting a node needs beyond a NodeRef: a plan's node (ssh/plan.py's NodeLaunch)."""

    @property
    def argv(self) -> tuple[str, ...]: ...

    @property
    def template(self) -> NodeTemplate: ...

    @property
    def python(self) -> str | None: ...


def start(node: NodeStart, transport: Transport, lease: LeaseRequest | None = None) -> LeaseStart:
    """Start torchrun under a detached supervisor in the node's job directory, whose
    code snapshot `push.push` built there: the one start command of every path.

    Args:
        lease: the GPUs or slots the node leases on a shared host, and its ticket
            (ssh/queue.py): it may then wait its turn first, and say so.

    Returns:
        The reply: `pid` once torchrun runs; with a lease, else `queued` (the node
        waits in line), `busy` (it was told not to wait) or `refused` (the host's
        policy refuses its priority or its count).

    Raises:
        HostError: the host's lease directory cannot be used.
        RemoteCommandError: the supervisor could not start torchrun.
    """
    spec = StartRequest(argv=list(node.argv), env=node.env)
    if lease:
        spec.lease = lease
    if node.template.warm:
        spec.warm = node.template.warm
    if node.python:
        spec.python = node.python
    command = agent.job_command(node.host, node.job_dir, "start", ".")
    # On stdin: the env may hold secrets, and every user of a host can read an argv.
    result = transport.run(command, stdin=spec.to_json().encode(), timeout=START_TIMEOUT_S)
    reply = messages.last_json(result.stdout) or {}
    if any(reply.get(key) is not None for key in ("pid", "queued", "busy", "refused")):
        started = agent.parse(node.host, LeaseStart, reply)
        log.debug(
            "[job=%s host=%s] start: %s", node.env.get("ORCH_JOB_ID"), node.host.name, started
        )
        return started
    error = printable(reply.get("error", ""), 2000)
    if error.startswith("cannot use the lease directory"):
        raise HostError(
            node.host.name,
            error,
            "every user of the host shares its lease directory; orch status --hosts "
            "shows who holds what (docs/SHARING.md)",
        )
    if result.exit_code in agent.SHELL_NOT_FOUND:
        raise agent.python_not_found(node.host)
    raise RemoteCommandError(
        node.host.name,
        "orch agent start",
        result.exit_code,
        result.stderr + error,
        f"check free disk space and permissions of {node.host.workdir}"
        + (
            ", and that /run/lock or /dev/shm is a sticky directory every user can write"
            if lease
            else ""
        ),
    )


def follow_command(node: NodeRef, offsets: dict[str, int] | None = None, once: bool = False) -> str:
    """The command that streams the node's log files from `offsets` (kernel/framing.py)."""
    args = ["follow", ".", json.dumps(offsets or {}), *(["--once"] if once else [])]
    return agent.job_command(node.host, node.job_dir, *args)


def kill(
    node: NodeRef,
    transport: Transport,
    job_id: str,
    grace_s: float = KILL_GRACE_S,
    port: int | None = None,
) -> KillReport:
    """Stop everything the job runs on this node (the agent decides what: agent/kill.py).
    Runs through the host's cached agent, so it works where the job directory was never
    created (a launch cut short). `port`: also wait until it is free, and say so."""
    args = ["kill", node.job_dir, str(grace_s), job_id, *([str(port)] if port is not None else [])]
    reply = agent.run(node.host, transport, args, timeout=grace_s + 30)
    return agent.parse(node.host, KillReport, reply)


def node_status(node: NodeRef, transport: Transport) -> StatusReply:
    """Whether a node started, runs, and how it ended, from its host."""
    reply = agent.run(node.host, transport, ["status", node.job_dir], timeout=STATUS_TIMEOUT_S)
    return agent.parse(node.host, StatusReply, reply)


def setup(
    node: NodeEnv,
    transport: Transport,
    script: str,
    key: str,
    digest: str,
    on_line: Callable[[str], None],
    python: str | None = None,
) -> None:
    """Run the job's `setup:` command with /bin/sh in the node's code snapshot, passing
    each output line to `on_line`; on success the host's store records `key`, so that
    the same setup for the same code version does not run there again.

    Raises:
        HostError: the setup command failed; names the host, the exit code and the
            last lines of its output.
    """
    store = layout.store_dir(node.host.workdir)
    spec = SetupRequest(script=script, env=node.env, store=store, key=key, manifest=digest)
    if python:
        spec.python = python  # the job's environment's: its pip is the one setup means
    process = transport.stream(
        agent.job_command(node.host, node.job_dir, "setup", "."), stdin=spec.to_json().encode()
    )
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
