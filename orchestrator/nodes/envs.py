"""The jobs' environments on the hosts (agent/host/envs.py, docs/ENVIRONMENTS.md): make
sure a job's is there (built where missing), list them, collect unused ones."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence

from orchestrator.agent.kernel import layout, messages
from orchestrator.agent.kernel.replies import EnvList, EnvReady
from orchestrator.agent.kernel.requests import EnvRequest
from orchestrator.models.environment import Environment, installer_env
from orchestrator.models.errors import InfraError, OrchError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.group import connect_reachable
from orchestrator.transport import Transport

log = logging.getLogger(__name__)
ENSURE_TIMEOUT_S = 3600.0  # a first build with torch's wheels takes minutes
LIST_TIMEOUT_S = 60.0
KEEP_DAYS_DEFAULT = 14.0


def keep_days() -> float:
    """`ORCH_KEEP_ENVS_DAYS` (default 14): how long an unused environment stays."""
    try:
        return max(0.0, float(os.environ.get("ORCH_KEEP_ENVS_DAYS", KEEP_DAYS_DEFAULT)))
    except ValueError:
        return KEEP_DAYS_DEFAULT


def ensure(
    host: Host,
    transport: Transport,
    job_dir: str,
    env: Environment,
    digest: str,
    job_env: Mapping[str, str] | None = None,
) -> EnvReady:
    """The job's environment on `host`, built there first where it is missing (the
    job's code, with its wheels, is already in `job_dir`/code). `job_env`: the env the
    job's nodes get there, whose index settings (PIP_INDEX_URL...) its installer gets.

    Returns:
        The reply: its python, whether this call built it; or `error`.

    Raises:
        RemoteCommandError: the agent gave no reply.
    """
    request = EnvRequest(
        envs=layout.envs_dir(host.workdir),
        digest=digest,
        requirements=list(env.requirements),
        wheels=env.wheels,
        installer_env=installer_env(job_env or {}) or None,
    )
    command = agent.job_command(host, job_dir, "env", "ensure", ".")
    result = transport.run(command, stdin=request.to_json().encode(), timeout=ENSURE_TIMEOUT_S)
    reply = messages.last_json(result.stdout)
    if reply is None:
        if result.exit_code in agent.SHELL_NOT_FOUND:
            raise agent.python_not_found(host)
        raise RemoteCommandError(
            host.name,
            "orch agent env ensure",
            result.exit_code,
            result.stderr,
            f"check free disk space and permissions of {host.workdir}",
        )
    return agent.parse(host, EnvReady, reply)


def ready(host: Host, transport: Transport, digest: str) -> str | None:
    """The python of the environment `digest` where `host` has it built, else None
    (`orch check`)."""
    args = ["env", "ready", layout.envs_dir(host.workdir), digest]
    reply = agent.run(host, transport, args, timeout=LIST_TIMEOUT_S)
    return agent.parse(host, EnvReady, reply).python


# What pip and uv say when a host reaches no index (after which pip also says it found
# no version of the requirement: the index, not the requirement, is what is wrong).
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Network is unreachable|"
    r"Temporary failure in name resolution|Name or service not known|ConnectTimeoutError|"
    r"Connection refused|error sending request|dns error|connection timed out",
    re.IGNORECASE,
)


def built_at(name: str, reply: EnvReady) -> str:
    """`node1 (uv, 3.1 s)`: where an environment was built, with what, how long."""
    how = f"{reply.installer}, " if reply.installer else ""
    return f"{name} ({how}{reply.seconds:.1f} s)"


def failure(env: Environment, failed: dict[str, EnvReady]) -> InfraError:
    """One error for every host whose build failed: the hosts that reach no index,
    else the packages not found and the hosts, else the installer's last lines per
    host."""
    missing = sorted({name for r in failed.values() for name in r.missing})
    hosts = ", ".join(failed)
    offline = [n for n, r in failed.items() if any(_UNREACHABLE.search(t) for t in r.tail)]
    if offline and env.wheels is None:
        line = next(t for t in failed[offline[0]].tail if _UNREACHABLE.search(t))
        said = _UNREACHABLE.findall(line)[-1]  # the innermost reason comes last
        return InfraError(
            f"environment: {', '.join(offline)} cannot reach the package index to install "
            f"{', '.join(missing) or 'the requirements'} ({env.source}; the installer "
            f"said: {said})",
            "let this machine download the wheels for the hosts (wheels: download in the "
            "job file, or --wheels download), or give a directory of them (wheels: DIR); "
            "nothing was started (docs/ENVIRONMENTS.md)",
        )
    if missing:
        return InfraError(
            f"environment: cannot install {', '.join(missing)} on {hosts}: no version or "
            f"wheel found for the host's python and platform ({env.source})",
            "correct the requirement, or add its wheel for the hosts' platform to "
            "wheels: (docs/ENVIRONMENTS.md); nothing was started",
        )
    lines = []
    for name, reply in failed.items():
        lines.append(f"{name}: {reply.error}")
        lines += ["  " + line for line in reply.tail]
    return InfraError(
        f"environment: the build failed on {hosts}:\n" + "\n".join(lines),
        "fix what the installer says above; nothing was started, and no half-built "
        "environment is left (docs/ENVIRONMENTS.md)",
    )


def listing(
    hosts: Sequence[Host], notice: Callable[[str], None], days: float | None = None
) -> tuple[dict[str, EnvList], list[OrchError]]:
    """Each reachable host's environments of this user (`days`: first remove those
    unused that long), and the errors of the hosts that did not answer. Hosts that
    share a machine and workdir are asked once."""

    def one(host: Host, transport: Transport) -> EnvList:
        where = layout.envs_dir(host.workdir)
        args = ["env", "list", where] if days is None else ["env", "gc", where, str(days)]
        reply = agent.run(host, transport, args, timeout=LIST_TIMEOUT_S)
        return agent.parse(host, EnvList, reply)

    unique = list({(h.user, h.address, h.port, h.workdir): h for h in hosts}.values())
    group, failures = connect_reachable(unique, notice)
    with group:
        results, more = group.try_each(one)
    return results, [*failures, *more]
