"""Probing a host: its facts (python, torch, GPUs, routes, ports) without importing torch."""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.agent.kernel import messages
from orchestrator.agent.kernel.host_wire import GpuFacts, PortHolder, ProbeFacts
from orchestrator.agent.kernel.requests import ProbeOptions
from orchestrator.models.clocks import HostClock
from orchestrator.models.environment import WheelTarget
from orchestrator.models.errors import HostError, RemoteCommandError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.transport.base import Transport

PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Marks:
    """One fresh mark per host, for hosts probed at once: each writes its own in its
    workdir and looks for the others' (HostFacts.fs_mark, fs_seen; plan.fs_groups)."""

    of: dict[str, str]

    @staticmethod
    def fresh(hosts: Sequence[Host]) -> Marks:
        return Marks({h.name: secrets.token_hex(8) for h in hosts})


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
    marks: Marks | None = None,
    target: bool = False,
) -> ProbeResult:
    """Learn a host's facts without importing torch (that costs seconds).

    Args:
        master: the address whose route (interface, source address) to report.
        port: also report whether this port is free there, and who holds it.
        gpus: also count GPUs (nvidia-smi, which can take a second on a big box).
        modules: top-level modules to look for with the host's python.
        marks: find out which hosts share the workdir's filesystem (`Marks`).
        target: also say what wheels its python installs (`HostFacts.wheel_target`).

    Raises:
        HostError: python is missing on the host, or torch is not installed for it.
    """
    found = probe_host(host, transport, master, port, gpus, modules, marks, target=target)
    if not found.facts.torch_version:
        raise torch_missing(host)
    return found


def probe_host(
    host: Host,
    transport: Transport,
    master: str | None = None,
    port: int | None = None,
    gpus: bool = True,
    modules: Sequence[str] = (),
    marks: Marks | None = None,
    index: str | None = None,
    target: bool = False,
) -> ProbeResult:
    """The probe without a verdict: facts even where torch is missing (`orch check`);
    with `index`, whether the host reaches that package index; with `target`, what
    wheels its python installs.

    Raises:
        HostError: python is missing, or the probe's output cannot be read (no JSON
            object, or a field of the wrong type).
        RemoteCommandError: the probe itself failed.
    """
    index = index_origin(index) if index else None  # the argv is any user's to read
    options = ProbeOptions(
        master=master,
        port=port,
        workdir=host.workdir,
        gpus=gpus,
        modules=list(modules),
        index=index,
        target=target,
    )
    if marks is not None and host.name in marks.of:
        options.mark, options.look = marks.of[host.name], list(marks.of.values())
    # Not isolated: torch may come from site-packages, the user's site or PYTHONPATH.
    args = ["probe", options.to_json()]
    sent = time.time()
    result = agent.execute(host, transport, args, timeout=PROBE_TIMEOUT_S, isolated=False)
    received = time.time()
    if result.exit_code in agent.SHELL_NOT_FOUND:
        raise agent.python_not_found(host)
    if not result.ok:
        raise RemoteCommandError(
            host.name,
            "orch agent probe",
            result.exit_code,
            result.stderr,
            f"check that {host.python} is a working Python 3 on {host.name}",
        )
    data = messages.last_json(result.stdout)
    if data is None:
        raise HostError(host.name, f"unreadable probe output: {result.stdout[-200:]!r}")
    reply = agent.parse(host, ProbeFacts, data)
    return ProbeResult(facts_from_probe(reply, received, sent, index), reply.ssh_addr)


def index_origin(url: str) -> str:
    """A package index's scheme, host and port, all a connection to it needs: its path,
    user and password (a token of the job's env) stay here, out of the probe's argv."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "invalid:"
    if not host:
        return f"{parts.scheme}:"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "") + "/"


def torch_missing(host: Host) -> HostError:
    return HostError(
        host.name,
        f"torch is not installed for {host.python}",
        f"install torch there ({host.python} -m pip install torch), "
        f"or point 'python:' for {host.name} at an interpreter that has it",
    )


def facts_from_probe(
    reply: ProbeFacts, received_at: float, sent_at: float | None = None, index: str | None = None
) -> HostFacts:
    """HostFacts from the probe's reply; `received_at` is this machine's clock when it
    came, `sent_at` when the probe was sent, `index` the package index it was asked
    about.

    The probe stamps its clock just before it answers, so the difference is the
    clock offset, give or take the time the answer took to arrive; between sending
    and receiving it is sure to lie (HostClock).
    """
    gpus = reply.gpus or GpuFacts()
    port = reply.port
    remote_time = reply.time
    return HostFacts(
        hostname=reply.hostname,
        python_version=reply.python,
        torch_version=reply.torch,
        iface=reply.iface,
        local_addr=reply.local_addr,
        free_port=reply.free_port,
        os=reply.os,
        python_executable=reply.executable,
        torch_cuda=reply.torch_cuda,
        nccl_version=reply.nccl,
        gpu_count=gpus.count,
        gpu_names=tuple(g.name for g in gpus.list),
        gpu_error=gpus.error,
        addresses=tuple(sorted((reply.addresses or {}).items())),
        route_error=reply.route_error,
        port=port.port if port else None,
        port_free=port.free if port else None,
        port_holders=tuple(describe_holder(h) for h in port.holders) if port else (),
        disk_free=reply.disk_free,
        clock_offset_s=remote_time - received_at if isinstance(remote_time, float) else None,
        clock=(
            HostClock.measured(remote_time, sent_at, received_at)
            if isinstance(remote_time, float) and sent_at is not None
            else None
        ),
        modules_missing=tuple(m for m, found in (reply.modules or {}).items() if not found),
        index=(index, reply.index_reach) if index and reply.index_reach else None,
        fs_mark=reply.fs_mark,
        fs_seen=tuple(reply.fs_seen) if reply.fs_seen is not None else None,
        wheel_target=(
            WheelTarget(
                reply.target.implementation,
                reply.target.python_version,
                reply.target.abi,
                reply.target.platform,
                reply.target.glibc,
            )
            if reply.target is not None
            else None
        ),
    )


def describe_holder(holder: PortHolder) -> str:
    """`pid 4242 (python train.py) of user bob`, or who it is when the pid is hidden."""
    user = holder.user or "?"
    if not holder.pid:
        return f"a process of user {user} (hidden from this user: run check as {user} or root)"
    command = " ".join((holder.command or "?").split())
    if len(command) > 80:  # keep both ends: the program, and the arguments that name the run
        command = f"{command[:38]} ... {command[-38:]}"
    return f"pid {holder.pid} ({command}) of user {user}"
