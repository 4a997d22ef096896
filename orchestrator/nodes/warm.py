"""The warm interpreters on a set of hosts (agent/node/warm/): list them with their
memory, or end them (`orch warm`, `orch kill --all`, `orch gc`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.agent.kernel.replies import WarmList, WarmRow
from orchestrator.models.errors import OrchError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.group import connect_reachable
from orchestrator.transport import Transport

TIMEOUT_S = 30.0


def warm_rows(host: Host, transport: Transport) -> list[WarmRow]:
    """One host's warm interpreters of this user, as its agent lists them.

    Raises:
        HostError: the agent's reply is not a list of them (names the host).
    """
    reply = agent.run(host, transport, ["warm", "list"], timeout=TIMEOUT_S)
    return list(agent.parse(host, WarmList, reply).warm)


def listing(
    hosts: Sequence[Host], notice: Callable[[str], None]
) -> tuple[dict[str, list[WarmRow]], list[OrchError]]:
    """Each reachable host's warm interpreters of this user, and the hosts' errors."""
    return _each(hosts, notice, warm_rows)


def stop(
    hosts: Sequence[Host], notice: Callable[[str], None]
) -> tuple[dict[str, list[int]], list[OrchError]]:
    """End this user's warm interpreters on the hosts: the pids ended on each."""

    def one(host: Host, transport: Transport) -> list[int]:
        reply = agent.run(host, transport, ["warm", "stop"], timeout=TIMEOUT_S)
        return [int(pid) for pid in reply.get("stopped") or []]

    return _each(hosts, notice, one)


def _each(
    hosts: Sequence[Host], notice: Callable[[str], None], one: Callable[[Host, Transport], Any]
) -> tuple[dict[str, Any], list[OrchError]]:
    unique = list({(h.user, h.address, h.port, h.workdir): h for h in hosts}.values())
    group, failures = connect_reachable(unique, notice)
    with group:
        results, more = group.try_each(one)
    return results, [*failures, *more]
