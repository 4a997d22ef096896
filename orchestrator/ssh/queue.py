"""Waiting in line for GPUs and slots: the controller's side of agent/leases.py.

A host whose inventory entry says how many GPUs or slots it has (`gpus:`,
`slots:`) is shared: each node of a job leases what it uses there, and waits in
the host's line while that is held. A job of one node waits on its host alone,
so it needs no controller to start when its turn comes (`submit -d`). A job of
several nodes must start on all of them or none: this side asks every host
whether the job's turn came, takes all the leases at once, gives them back when
one host refused, and says go only when it holds them all (leases.py says why
that cannot deadlock). Detached, the job's keeper on its hosts does the same
(agent/line.py), so that it starts in its turn without the laptop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from orchestrator.agent.kernel import messages, replies
from orchestrator.agent.kernel.lease_wire import (
    LeaseHosts,
    LeaseStart,
    LeaseState,
    Waiting,
    printable,
)
from orchestrator.agent.kernel.line import Line, Outcome
from orchestrator.agent.kernel.messages import MessageError, parse_message
from orchestrator.agent.kernel.requests import LeaseRequest, LeaseUnits
from orchestrator.models.errors import HostError, InfraError, InputError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.models.job import JobSpec
from orchestrator.models.states import JobState
from orchestrator.nodes import agent, ops
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobDB
from orchestrator.reporting.hosts import QueueRow, UnitRow
from orchestrator.reporting.reporter import Reporter
from orchestrator.ssh.plan import LaunchPlan, NodeLaunch
from orchestrator.transport import Transport

log = logging.getLogger(__name__)
POLL_S = 0.5  # how often a waiting controller asks its hosts


class QueueBusy(InfraError):
    """`--no-wait`, and the job's GPUs or slots are held (exit 3)."""

    def __init__(self, text: str) -> None:
        super().__init__(
            f"not started: {text.removeprefix('queued: ')}",
            "leave out --no-wait to wait in line; orch status --hosts shows who holds what",
        )


class PolicyRefused(InputError):
    """The hosts' policy refuses what the job asks (exit 2): a priority its user may
    not use, more GPUs or slots than they may hold there."""

    def __init__(self, why: dict[str, str]) -> None:
        hosts = sorted(why)
        text = printable(why[hosts[0]], 1000)
        super().__init__(
            f"not started: {text} (host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)})",
            "ask whoever administers the hosts, or submit with --priority normal or fewer "
            "GPUs or slots per node (docs/SHARING.md, the policy file)",
        )


def lease_units(job: JobSpec, host: Host, nproc: int, first_slot: int = 0) -> LeaseUnits | None:
    """What a node of `nproc` processes leases on `host`: GPUs where the inventory
    lists them (the job's gpus_per_node, else one per process), else slots (one per
    process) numbered from `first_slot` (`slot_offsets`); None where the inventory says
    neither (the host is not shared)."""
    if not host.leases:
        return None
    if host.gpus:
        kind, pool = "gpu", list(host.gpus)
        count = job.gpus_per_node if job.gpus_per_node is not None else nproc
    else:
        kind, count = "slot", nproc
        pool = list(range(first_slot, first_slot + host.slots))
    return LeaseUnits(kind=kind, pool=pool, count=count, priority=job.priority)


def lease_request(
    job: JobSpec,
    node: NodeLaunch,
    ticket: tuple[float, str],
    wait: bool,
    self_start: bool,
    first_slot: int = 0,
) -> LeaseRequest | None:
    """The node's `lease_units`, as its supervisor's start asks for them."""
    units = lease_units(job, node.host, node.nproc, first_slot)
    if units is None:
        return None
    return LeaseRequest(
        kind=units.kind,
        pool=units.pool,
        count=units.count,
        priority=units.priority,
        job=ticket[1],
        ticket=list(ticket),
        wait=wait,
        self_start=self_start,
    )


def slot_offsets(hosts: Sequence[Host]) -> dict[str, int]:
    """Where each host's slots start counting. Entries of the inventory that name one
    machine (the same address: `local1` and `local2` on localhost, as `make demo`
    runs) share its lease directory; each gets slots of its own after the previous
    entry's, so that the nodes of one job there never wait for each other. GPUs need
    no such thing: their indices are the machine's own."""
    taken: dict[str, int] = {}
    offsets = {}
    for host in hosts:
        machine = "localhost" if host.is_local else host.address
        offsets[host.name] = taken.get(machine, 0)
        taken[machine] = offsets[host.name] + host.slots
    return offsets


def start_nodes(
    plan: LaunchPlan,
    group: HostGroup,
    reporter: Reporter,
    store: JobDB,
    start_plain: Callable[[Host, Transport], object],
    no_wait: bool = False,
    detach: bool = False,
) -> bool:
    """Start every node of the plan, each once its GPUs or slots are its own.

    Returns:
        True when the job waits in line (detached): a node of one starts on its host
        when its turn comes, the nodes of several by their keeper (the caller starts
        it); False once every node started.

    Raises:
        QueueBusy: `no_wait`, and a node would have to wait.
        InfraError / HostError: a node could not start, or left the line.
    """
    if not any(n.host.leases for n in plan.nodes):
        said = group.each(start_plain)
        warn_once(reporter, {name: getattr(r, "warnings", ()) for name, r in said.items()})
        return False
    nodes = {n.host.name: n for n in plan.nodes}
    ticket = (time.time(), plan.job_id)
    single = len(plan.nodes) == 1
    # Nodes of several always wait: this side decides when none has to any more.
    wait = not (no_wait and single)

    offsets = slot_offsets([n.host for n in plan.nodes])

    def start(host: Host, transport: Transport) -> LeaseStart:
        node = nodes[host.name]
        request = lease_request(plan.job, node, ticket, wait, single, offsets[host.name])
        if request is None:  # a host that is not shared, in a job with some that are
            request = LeaseRequest(
                kind=NO_UNITS.kind,
                pool=NO_UNITS.pool,
                count=NO_UNITS.count,
                priority=plan.job.priority,
                job=plan.job_id,
                ticket=list(ticket),
                wait=wait,
                self_start=single,
            )
        return ops.start(node, transport, request)

    replies = group.each(start)
    # A node that started says so with its warnings, below.
    warn_once(reporter, {n: r.warnings for n, r in replies.items() if r.pid is None})
    refused = {name: r.refused for name, r in replies.items() if r.refused is not None}
    if refused:
        raise PolicyRefused(refused)
    busy = {name: r.busy for name, r in replies.items() if r.busy is not None}
    if busy:
        raise QueueBusy(waiting_text(busy, nodes))
    _started(plan, {n: r for n, r in replies.items() if r.pid is not None}, reporter, store)
    queued = {name: r.queued for name, r in replies.items() if r.queued is not None}
    if not queued:
        return False
    if not single:
        waits = _wait_all(plan, group, reporter, store, no_wait, hand_over=detach)
        if waits is None:
            return False
        reporter.notice(
            f"{waits}; its nodes start together when its turn comes, by a keeper on its "
            f"hosts, without this controller (orch status {plan.job_id})"
        )
        return True
    text = waiting_text(queued, nodes)
    if detach:
        reporter.notice(
            f"{text}; it starts when its turn comes, without this controller "
            f"(orch status {plan.job_id})"
        )
        return True
    _wait_one(plan, group, reporter, store, text)
    return False


NO_UNITS = LeaseUnits(kind="slot", pool=[], count=0)  # waits its turn, holds nothing


def lease_command(node: NodeLaunch, transport: Transport, verb: str) -> LeaseState:
    """One of the node's `lease` commands (poll, take, untake, go), its reply parsed.

    Raises:
        RemoteCommandError: the command answered nothing.
        HostError: the reply lacks a field this controller needs.
    """
    command = agent.job_command(node.host, node.job_dir, "lease", verb, ".")
    result = transport.run(command, timeout=ops.STATUS_TIMEOUT_S + 60)
    reply = messages.last_json(result.stdout)
    if reply is None:
        raise RemoteCommandError(
            node.host.name, f"orch agent lease {verb}", result.exit_code, result.stderr
        )
    return _parsed(node.host.name, LeaseState, reply)


R = TypeVar("R", bound=replies.Reply)


def _parsed(host: str, cls: type[R], reply: dict[str, Any]) -> R:
    """A host's reply as `cls`.

    Raises:
        HostError: it lacks a field this controller needs (an older or broken agent).
    """
    try:
        return parse_message(cls, reply)
    except MessageError as exc:
        raise HostError(host, str(exc), "update orch, or remove the host's agent") from exc


def warn_once(reporter: Reporter, warnings: dict[str, Sequence[str]]) -> None:
    """Each warning once, naming the hosts that gave it (a cold start's reason is
    often every host's)."""
    hosts: dict[str, list[str]] = {}
    for host, said in warnings.items():
        for warning in said:
            hosts.setdefault(warning, []).append(host)
    for warning, names in hosts.items():
        where = f"host {names[0]}" if len(names) == 1 else f"hosts {', '.join(sorted(names))}"
        reporter.notice(f"warning: {printable(warning, 1000)} ({where})")


def _warn(reporter: Reporter, host: str, warnings: Sequence[str]) -> None:
    for warning in warnings:
        reporter.notice(f"warning: {printable(warning, 1000)} (host {host})")


def _started(
    plan: LaunchPlan,
    replies: dict[str, LeaseStart] | dict[str, LeaseState],
    reporter: Reporter,
    store: JobDB,
) -> None:
    warn_once(reporter, {name: reply.warnings for name, reply in replies.items()})
    for name in replies:
        store.update_node(plan.job_id, name, JobState.RUNNING)


def _wait_one(
    plan: LaunchPlan, group: HostGroup, reporter: Reporter, store: JobDB, shown: str
) -> None:
    """Wait, saying what for, until the job's one node has started on its own."""
    node = plan.nodes[0]
    reporter.notice(shown)
    while True:
        time.sleep(POLL_S)
        polled = group.each(lambda h, t: lease_command(node, t, "poll"))[node.host.name]
        if polled.state == "started":
            _started(plan, {node.host.name: polled}, reporter, store)
            return
        _check_in_line(node.host.name, polled)
        if polled.state == "waiting" and polled.info is not None:
            text = waiting_text({node.host.name: polled.info}, {node.host.name: node})
            if text != shown:
                reporter.notice(text)
                shown = text


def _wait_all(
    plan: LaunchPlan,
    group: HostGroup,
    reporter: Reporter,
    store: JobDB,
    no_wait: bool,
    hand_over: bool = False,
) -> str | None:
    """Take the leases of every node at once when every host says the job's turn
    came; give them back when one refused; then say go to all. The rounds are
    agent/line.py's, which a detached job's keeper runs too: this side carries each
    round's commands to the hosts.

    Returns:
        None once every node started; with `hand_over` (a detached job), what the
        job waits for as soon as it has to wait: its keeper waits from then on.
    """
    nodes = {n.host.name: n for n in plan.nodes}
    rounds = Line(list(nodes))
    shown = ""
    taken: dict[str, LeaseState] = {}
    asks = rounds.tick(time.monotonic(), ready=True)
    while True:
        following: list[tuple[str, str]] = []
        outcome: Outcome | None = None
        for verb in dict.fromkeys(v for _, v in asks):
            hosts = [host for host, v in asks if v == verb]
            replies = group.each(partial(_lease_on, nodes, verb), only=hosts)
            taken = replies if verb == "take" else taken
            for host, reply in replies.items():
                more, done = rounds.hear(host, verb, reply, time.monotonic())
                following += more
                outcome = outcome or done
        if outcome is not None:
            _out_of_line(plan, outcome, taken, reporter, store)
            return None
        if following:
            asks = following
            continue
        waiting = dict(rounds.waiting)
        text = waiting_text(waiting, nodes) if waiting else "queued: taking every node's lease"
        if no_wait:
            raise QueueBusy(text)
        if hand_over:
            return text
        if text != shown:
            reporter.notice(text)
            shown = text
        time.sleep(POLL_S)
        asks = rounds.tick(time.monotonic(), ready=True)


def _lease_on(
    nodes: dict[str, NodeLaunch], verb: str, host: Host, transport: Transport
) -> LeaseState:
    return lease_command(nodes[host.name], transport, verb)


def _out_of_line(
    plan: LaunchPlan,
    outcome: Outcome,
    taken: dict[str, LeaseState],
    reporter: Reporter,
    store: JobDB,
) -> None:
    """Every node started, or the job cannot start: a node left the line, or did not
    start when told to go.

    Raises:
        HostError: the first node that left the line or did not start.
    """
    for name, why in outcome.left.items():
        raise HostError(name, why)
    for name, reply in outcome.started.items():
        if reply.pid is None:
            raise HostError(name, f"the node did not start: {printable(reply.error)}")
    for name, state in taken.items():
        _warn(reporter, name, state.warnings)
    _started(plan, outcome.started, reporter, store)


def _check_in_line(name: str, reply: LeaseState) -> None:
    if reply.state in ("ended", "gone"):
        why = (reply.ended.error if reply.ended else None) or reply.error or "it ended"
        raise HostError(name, f"the node left the line before it started: {printable(why)}")


def limit_text(infos: dict[str, Waiting]) -> str:
    """`waiting: alice holds 4 of their 4 GPUs on node1, node2`: where a node waits
    because its user is at their limit there; '' where none does."""
    said: dict[str, list[str]] = {}
    for name, info in infos.items():
        if info.limit is not None:
            unit = "GPU" if info.kind == "gpu" else "slot"
            plural = "s" if info.limit.most != 1 else ""
            what = (
                f"{printable(info.limit.user)} holds {info.limit.held} of their "
                f"{info.limit.most} {unit}{plural}"
            )
            said.setdefault(what, []).append(name)
    return "; ".join(
        f"waiting: {what} on {', '.join(sorted(names))}" for what, names in said.items()
    )


def waiting_text(infos: dict[str, Waiting], nodes: dict[str, NodeLaunch]) -> str:
    """`queued: 4 GPUs on node2, node3 held by train-1a2b (alice) since 14:02; 1st in
    line` from the hosts' answers, or `waiting: alice holds 4 of their 4 GPUs on
    node1` where the job waits for its user's limit (`limit_text`). Job ids and user
    names come from other users' files: printed without their control characters."""
    limited = limit_text(infos)
    if limited:
        return limited
    wants: dict[str, list[str]] = {}
    holders: dict[str, str] = {}
    ahead: dict[str, str] = {}
    foreign: list[str] = []
    position = 1
    for name, info in infos.items():
        if info.waiting_for is not None:
            continue
        unit = "GPU" if info.kind == "gpu" else "slot"
        wants.setdefault(f"{info.want} {unit}{'s' if info.want != 1 else ''}", []).append(name)
        for lease in info.holders:
            since = time.strftime("%H:%M", time.localtime(_when(lease.since)))
            job, user = printable(lease.job), printable(lease.user)
            holders.setdefault(job, f"{job} ({user}) since {since}")
        for ticket in info.ahead:
            job, user = printable(ticket.job), printable(ticket.user)
            ahead.setdefault(job, f"{job} ({user})")
        for found in info.foreign:
            foreign.append(f"GPU {found.gpu} on {name}: pid {found.pid} ({printable(found.user)})")
        position = max(position, int(info.position or 1))
    what = "; ".join(f"{want} on {', '.join(names)}" for want, names in wants.items())
    text = f"queued: {what or 'waiting'}"
    if holders:
        text += " held by " + ", ".join(holders.values())
    if foreign:
        text += ", in use outside orch by " + ", ".join(foreign)
    if ahead:
        text += "; behind " + ", ".join(ahead.values())
    return text + f"; {_ordinal(position)} in line"


def _when(since: float | None) -> float:
    """A time to show: 0 where it is missing or could not be shown (an older agent's
    record that was never checked)."""
    try:
        time.localtime(since or 0)
    except (OverflowError, ValueError, OSError, TypeError):
        return 0
    return since or 0


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# ---------------------------------------------------------------- looking at hosts


def host_views(group: HostGroup) -> tuple[dict[str, LeaseHosts], list[Any]]:
    """Every reachable host's leases and tickets (`lease hosts`), and the failures."""

    def view(host: Host, transport: Transport) -> LeaseHosts:
        reply = agent.run(host, transport, ["lease", "hosts"], timeout=ops.STATUS_TIMEOUT_S)
        return _parsed(host.name, LeaseHosts, reply)

    return group.try_each(view)


def unit_rows(host: Host, view: LeaseHosts) -> list[UnitRow]:
    """One row per GPU (or slot) the inventory lets orch hand out on `host`: free, or
    who holds it since when; GPUs busy outside orch say by which pid and user."""
    kind = "gpu" if host.gpus else "slot"
    pool = list(host.gpus) if host.gpus else list(range(host.slots))
    held = {int(u): lease for lease in view.leases if lease.kind == kind for u in lease.units}
    foreign = {int(f.gpu): f for f in view.foreign} if kind == "gpu" else {}
    rows = []
    for unit in pool:
        row = UnitRow(host.name, kind, unit, "free")
        if unit in held:
            lease = held[unit]
            row = replace(row, state="held", job=lease.job, user=lease.user, since=lease.since)
        elif unit in foreign:
            row = replace(row, state="busy", pid=foreign[unit].pid, user=foreign[unit].user)
        rows.append(row)
    return rows


def queue_rows(host: Host, view: LeaseHosts) -> list[QueueRow]:
    """The host's line, first first (in the order of the host's policy)."""
    return [
        QueueRow(host.name, i + 1, t.job, t.user, t.kind, t.count, t.since, t.priority)
        for i, t in enumerate(view.tickets)
    ]


def positions(job_ids: Sequence[str], store: JobDB | None = None) -> dict[str, str]:
    """For jobs not yet started: `queued, 2nd in line on node1` where a node waits."""
    from orchestrator.nodes.group import connect_reachable

    store = store or JobDB()
    records = [store.get(job_id) for job_id in job_ids]
    pending = [r for r in records if r.state is JobState.PENDING]
    if not pending:
        return {}
    hosts = {n.host.name: n.host for r in pending for n in r.nodes}
    group, _ = connect_reachable(list(hosts.values()), lambda _: None)
    found: dict[str, str] = {}
    with group:
        for record in pending:
            by_host = {n.host.name: n for n in record.nodes}

            def poll(host: Host, transport: Transport, by_host: Any = by_host) -> LeaseState:
                node = by_host[host.name]
                command = agent.job_command(host, node.job_dir, "lease", "poll", ".")
                reply = messages.last_json(transport.run(command, timeout=30).stdout) or {}
                return _parsed(host.name, LeaseState, reply)

            replies, _ = group.try_each(poll, only=list(by_host))
            infos = {
                name: r.info
                for name, r in replies.items()
                if r.state == "waiting" and r.info is not None
            }
            places = [
                f"{_ordinal(int(info.position or 1))} in line on {name}"
                for name, info in infos.items()
            ]
            limited = limit_text(infos)
            if places:
                found[record.id] = "queued, " + ", ".join(places)
                found[record.id] += f"; {limited}" if limited else ""
            elif any(r.state in ("ready", "starting") for r in replies.values()):
                found[record.id] = "queued, its turn came"
    return found
