"""The warm interpreters on a set of hosts (agent/node/warm.py): list them with their
memory, or end them (`orch warm`, `orch kill --all`, `orch gc`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.models.errors import OrchError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.group import connect_reachable
from orchestrator.transport import Transport

TIMEOUT_S = 30.0


@dataclass(frozen=True)
class WarmProcess:
    """One warm interpreter: its pid, state, what it preloaded, its memory (PSS)."""

    pid: int
    state: str
    preload: tuple[str, ...]
    pss_kb: int | None
    idle_s: float | None

    @classmethod
    def of(cls, row: dict[str, Any]) -> WarmProcess:
        return cls(
            pid=int(row["pid"]),
            state=str(row.get("state") or "?"),
            preload=tuple(str(p) for p in row.get("preload") or ()),
            pss_kb=int(row["pss_kb"]) if row.get("pss_kb") is not None else None,
            idle_s=float(row["idle_s"]) if row.get("idle_s") is not None else None,
        )


def warm_interpreters(host: Host, transport: Transport) -> list[dict[str, Any]]:
    """One host's warm interpreters of this user, as its agent lists them."""
    reply = agent.run(host, transport, ["warm", "list"], timeout=TIMEOUT_S)
    return [dict(row) for row in reply.get("warm") or [] if isinstance(row, dict)]


def listing(
    hosts: Sequence[Host], notice: Callable[[str], None]
) -> tuple[dict[str, list[WarmProcess]], list[OrchError]]:
    """Each reachable host's warm interpreters of this user, and the hosts' errors."""

    def one(host: Host, transport: Transport) -> list[WarmProcess]:
        return [WarmProcess.of(row) for row in warm_interpreters(host, transport)]

    return _each(hosts, notice, one)


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
