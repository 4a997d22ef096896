"""A detached job's keeper (agent/keeper.py), from the controller's side.

`orch submit -d` of a job with `restarts:` starts, once the job runs, a keeper on its
master host and a member on each of its hosts and spares (the spares get the code and
`setup:` first), so that a node's failure or loss restarts the job without the laptop.
A detached job that waits in line for shared hosts (ssh/queue.py) gets its keeper at
once, restarts or not: it starts the job's nodes together when their turn comes.
`orch status`, `orch logs` and `orch kill` read the keeper's record through `sync` and
bring the local record up to date, one `JobDB.restart` per attempt the keeper started,
with each ended attempt's logs copied into its own local mirror: they then show the
attempt and its marked lines exactly as for an attached submit's restarts.

The keeper may move: when its host is lost, a member takes over on another host
(agent/keeper/takeover.py), with the next epoch. The record therefore keeps every
host's directory, and `sync` asks all the hosts it reaches for a keeper's record and
follows the newest epoch; the spec's `keeper.at` names the host that keeps the job now
(`orch status` shows it). `orch kill` stops every keeper it finds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.agent.kernel import layout, messages, states
from orchestrator.agent.kernel.requests import (
    Candidate,
    KeeperConfig,
    LeaseUnits,
    MemberConfig,
    NodeTemplate,
    Placement,
    Request,
)
from orchestrator.models.errors import OrchError, RemoteCommandError
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup, connect_reachable
from orchestrator.records.db import JobDB, JobRecord, NodeRecord, host_from_json, host_to_json
from orchestrator.records.logmirror import LogMirror
from orchestrator.reporting.contact import LOST_AFTER_S
from orchestrator.reporting.reporter import Reporter
from orchestrator.transport import Transport

# `orch status`, `logs` and `kill` import this module for `sync`; what only starting a
# keeper uses (the plan, the lease policy, the probe, the log follower: 7 ms) is
# imported where it is used, off their start.
if TYPE_CHECKING:
    from orchestrator.ssh.plan import LaunchPlan

    Push = Callable[[LaunchPlan, HostGroup], LaunchPlan]

log = logging.getLogger(__name__)
KEEPER_TIMEOUT_S = 90.0  # `keeper stop` waits for the nodes' kill, and more


def start_keeper(
    plan: LaunchPlan,
    candidates: Sequence[Host],
    group: HostGroup,
    digest: str,
    push: Push,
    reporter: Reporter,
    store: JobDB,
    line: str | None = None,
) -> None:
    """Start the keeper of a running detached job, and a member on each of its hosts
    and spares. A spare that cannot be reached or used is left out, with a warning;
    a job without restarts has no use for spares.

    Args:
        candidates: every host of the job's selection, its hosts first (Submission).
        group: the job's hosts, connected.
        digest: the code's manifest: a member builds a later attempt's snapshot from it.
        push: builds the code snapshot (and the environment, and runs setup:) on the
            hosts of a plan, and returns the plan with the environment's python.
        line: the job waits in line (keeping.py): "together" or "alone".

    Raises:
        OrchError: the keeper, or the member of one of the job's hosts, could not
            start; the keeper was stopped again (the caller tears the job down).
    """
    from orchestrator.ssh.plan import node_count  # (see the imports above)

    job, master = plan.job, plan.master
    templates = {n.host.name: n.template for n in plan.nodes}
    # The master's peers reach it at the plan's address, whatever its probe said.
    templates[master.host.name] = copy.copy(master.template)
    templates[master.host.name].addr = plan.master_addr
    homes = {n.host.name: n.job_dir for n in plan.nodes}
    spares = [h for h in candidates if h.name not in homes] if job.restarts else []
    with HostGroup(spares, group.options) as spare_group:
        if spares:
            _prepare_spares(plan, spares, spare_group, push, templates, homes, reporter)
        hosts = [h for h in candidates if h.name in templates]
        leases = _lease_units(plan, hosts)
        secret = secrets.token_hex(32)
        lost_after = float(job.lost_after or max(h.lost_after or LOST_AFTER_S for h in hosts))
        config = KeeperConfig(
            secret=secret,
            job_id=plan.job_id,
            restarts=job.restarts,
            lost_after=lost_after,
            rendezvous_port=job.rendezvous_port,
            bind=plan.master_addr,
            host=master.host.name,
            line=line,
            place=Placement(
                hosts=[n.host.name for n in plan.nodes],
                nprocs=[n.nproc for n in plan.nodes],
                master_addr=plan.master_addr,
                master_port=plan.master_port,
                attempt=0,
            ),
            candidates=[
                Candidate(
                    host=h.name,
                    nproc=node_count(job, h),
                    addr=templates[h.name].addr,
                    workdir=h.workdir,
                )
                for h in hosts
            ],
            notify=job.notify,  # on stdin: a webhook's URL may hold a token
        )
        if job.stall_after is not None:  # the keeper's members take stacks with py-spy
            from orchestrator.ssh.pyspy import carry_pyspy

            config.stall_after, config.on_stall = float(job.stall_after), job.on_stall
            config.pyspy = carry_pyspy(plan.nodes, group, reporter)
        keeper_dir = master.job_dir
        started = _run(master.host, group.transports[master.host.name], keeper_dir, "start", config)
        log.info("[job=%s] keeper on %s, port %s", plan.job_id, master.host.name, started["port"])
        keeper = {
            "host": master.host.name,
            "dir": keeper_dir,
            "at": master.host.name,
            "dirs": {h.name: homes[h.name] for h in hosts},
            "hosts": {
                h.name: json.loads(host_to_json(_recorded(h, job.lost_after))) for h in hosts
            },
        }
        store.update_spec(plan.job_id, ssh={"keeper": keeper})

        def member(host: Host, transport: Transport) -> None:
            node_dir = homes[host.name] if host.name in {n.host.name for n in plan.nodes} else None
            config = MemberConfig(
                secret=secret,
                addr=plan.master_addr,
                port=int(started["port"]),
                template=templates[host.name],
                store=layout.store_dir(host.workdir),
                digest=digest,
                node_dir=node_dir,
                lost_after=lost_after,
                lease=leases[host.name],
                notify=job.notify,
            )
            _run(host, transport, homes[host.name], "member", config)

        try:
            group.each(member)
        except OrchError:
            _stop_quietly(master.host, group.transports[master.host.name], keeper_dir)
            raise
        standby = [h.name for h in spares if h.name in templates]
        joined, failures = spare_group.try_each(member, only=standby)
        for failure in failures:  # the keeper never chooses a spare whose member is not there
            reporter.notice(f"warning: spare left out of restarts: {failure.message}")
    names = ", ".join(name for name in standby if name in joined)
    if job.stall_after is not None:
        reporter.notice(
            f"stall_after: a keeper on {master.host.name} watches the job for "
            f"{job.stall_after} s without a line from any rank"
        )
    if job.notify is not None:
        reporter.notice(f"notify: a keeper on {master.host.name} tells the job's end")
    if job.restarts:
        reporter.notice(
            f"restarts: a keeper on {master.host.name} restarts the job up to {job.restarts} "
            f"time(s) without this controller" + (f"; spares: {names}" if names else "")
        )


def _prepare_spares(
    plan: LaunchPlan,
    spares: Sequence[Host],
    group: HostGroup,
    push: Push,
    templates: dict[str, NodeTemplate],
    homes: dict[str, str],
    reporter: Reporter,
) -> None:
    """Probe the spares, push the code to those that can run the job, and note their
    templates and directories (where their members live)."""
    from orchestrator.nodes.probe import probe
    from orchestrator.ssh.plan import build_plan, fs_groups, node_template

    for failure in group.connect(tolerate=True):
        reporter.notice(f"warning: spare left out of restarts: {failure.message}")
    reached = [h for h in spares if h.name in group.transports]
    probes, failures = group.try_each(
        lambda h, t: probe(h, t, plan.master_addr), only=[h.name for h in reached]
    )
    for failure in failures:
        reporter.notice(f"warning: spare left out of restarts: {failure.message}")
    usable = [h for h in reached if h.name in probes]
    if not usable:
        return
    facts = {name: p.facts for name, p in probes.items()}
    first = facts[usable[0].name].local_addr or usable[0].address
    standby = build_plan(
        plan.job, usable, plan.job_id, first, None, facts, fs_groups(usable, facts)
    )
    standby = push(standby, group)  # with each node's environment's python, if any
    for node in standby.nodes:
        template = node_template(plan.job, node.host, facts[node.host.name], plan.job_id)
        if node.python:
            template.python = node.python
        templates[node.host.name] = template
        homes[node.host.name] = node.job_dir


def _lease_units(plan: LaunchPlan, hosts: Sequence[Host]) -> dict[str, LeaseUnits | None]:
    """What a later attempt's node leases on each host (queue.lease_units): where any
    host is shared, the others lease nothing but still wait for their turn together."""
    from orchestrator.ssh.plan import node_count
    from orchestrator.ssh.queue import NO_UNITS, lease_units, slot_offsets

    offsets = slot_offsets(hosts)
    units = {
        h.name: lease_units(plan.job, h, node_count(plan.job, h), offsets[h.name]) for h in hosts
    }
    if not any(units.values()):
        return units
    return {name: u or NO_UNITS for name, u in units.items()}


def _recorded(host: Host, lost_after: int | None) -> Host:
    return dataclasses.replace(host, lost_after=lost_after or host.lost_after)


def _run(
    host: Host, transport: Transport, directory: str, verb: str, config: Request
) -> dict[str, Any]:
    """Run `keeper VERB DIR` with the job's pinned agent, its config (and secret) on
    stdin, never in an argv.

    Raises:
        RemoteCommandError: it did not start; names the host and what it said.
    """
    command = agent.job_command(host, directory, "keeper", verb, ".")
    result = transport.run(command, stdin=config.to_json().encode(), timeout=60)
    reply = messages.last_json(result.stdout) or {}
    if not result.ok or "pid" not in reply:
        raise RemoteCommandError(
            host.name,
            f"orch agent keeper {verb}",
            result.exit_code,
            result.stderr + str(reply.get("error", "")),
            "hosts must reach the master's address as the job's ranks do (orch check)",
        )
    return reply


def _stop_quietly(host: Host, transport: Transport, directory: str) -> None:
    try:
        agent.run(host, transport, ["keeper", "stop", directory], timeout=KEEPER_TIMEOUT_S)
    except OrchError as exc:
        log.info("could not stop the keeper on %s: %s", host.name, exc.message)


# ---------------------------------------------------------------- sync


@dataclass
class Kept:
    """A job's record after `sync`, and whether its keeper runs it: then only the
    keeper tears it down and restarts it, and nodes that ended do not end the job."""

    record: JobRecord
    acting: bool = False


def sync(store: JobDB, record: JobRecord, reporter: Reporter, stop: bool = False) -> Kept:
    """Bring a detached job's record up to date with its keeper's (when it has one):
    every attempt the keeper started since becomes the record's, through
    `JobDB.restart`, each ended attempt's logs copied into its local mirror.

    Args:
        stop: `orch kill`: first have the keeper stop the job's nodes and leave.

    Returns:
        The record as it now is; `acting` when the keeper still runs the job.
    """
    keeper = keeper_of(record)
    if keeper is None or record.state.is_terminal():
        return Kept(record)
    hosts = {name: host_from_json(json.dumps(h)) for name, h in keeper["hosts"].items()}
    asked = _ask(keeper, hosts, "stop" if stop else "show", reporter)
    if asked is None:
        return Kept(record)
    at, reply = asked
    if at != keeper.get("at", keeper["host"]):
        store.update_spec(
            record.id, ssh={**(record.view.own or {}), "keeper": {**keeper, "at": at}}
        )
    found = reply["record"]
    _keep_stall_dumps(record, reply.get("dumps") or {}, reporter)
    record = _apply(store, store.get(record.id), found, hosts, reporter)
    return Kept(record, bool(reply.get("alive")) and found.get("state") in states.KEEPER_ACTING)


def _keep_stall_dumps(record: JobRecord, dumps: dict[str, Any], reporter: Reporter) -> None:
    """The stacks the keeper's stall watchdog took, kept with the job's records here
    (as `orch stack` keeps its own), each once, and said once."""
    from orchestrator.agent.kernel.replies import StackReply
    from orchestrator.records import stacks as kept
    from orchestrator.reporting import stacks

    for name, data in sorted(dumps.items()):
        if not isinstance(data, dict) or not isinstance(data.get("at"), (int, float)):
            continue
        taken = float(data["at"])
        if (kept.stacks_dir(record.id) / f"{kept.stamp(taken)}.txt").exists():
            continue
        replies = {}
        for host, reply in (data.get("replies") or {}).items():
            try:
                replies[str(host)] = messages.parse_message(StackReply, reply)
            except messages.MessageError as exc:
                log.info("[job=%s] stacks of %s in %s: %s", record.id, host, name, exc)
        missing = [
            (str(h), "no stacks before the keeper acted") for h in data.get("unanswered") or []
        ]
        order = [n.host.name for n in record.nodes]
        view = stacks.view(record.id, taken, replies, missing, order)
        head = f"{data.get('reason')} (attempt {int(data.get('attempt') or 0) + 1}), seen by the job's keeper"
        text = "\n".join([head, *stacks.lines(view, verbose=True)]) + "\n"
        path = kept.save(record.id, taken, text, view.to_json())
        reporter.notice(f"job {record.id}: {head}: stacks kept: {path}")


def _ask(
    keeper: dict[str, Any], hosts: dict[str, Host], verb: str, reporter: Reporter
) -> tuple[str, dict[str, Any]] | None:
    """`keeper show` (or `stop`) in the job's directory: the host of the newest
    keeper's record (of a keeper that did not give way, then of the latest epoch, a
    live one first), and its reply; None when no host has one.
    `show` asks the host that kept the job last, and every other host it reaches, in
    parallel, only when no keeper runs there any more; `stop` asks them all at once:
    every keeper found stops."""
    dirs: dict[str, str] = keeper.get("dirs") or {keeper["host"]: keeper["dir"]}
    at = str(keeper.get("at", keeper["host"]))
    found: dict[str, dict[str, Any]] = {}
    failures: list[OrchError] = []
    if verb == "show" and at in dirs and at in hosts:
        found, failures = _each_keeper([hosts[at]], dirs, verb)
        if at in found and found[at].get("alive"):
            return at, found[at]
    rest = [hosts[n] for n in dirs if n in hosts and n not in found]
    more, others = _each_keeper(rest, dirs, verb)
    found.update(more)
    if not found:
        for failure in [*failures, *others]:
            reporter.notice(f"could not ask the job's keeper: {failure.message}")
        return None

    chosen = current_keeper(found, at)
    return chosen, found[chosen]


def current_keeper(found: dict[str, dict[str, Any]], at: str) -> str:
    """Which of the hosts' `keeper show` replies (by host) is the job's keeper now: one
    that did not give way (too few members reached it: it never hides another), then
    the latest epoch, then a live one, then the host that kept it last."""

    def newest(name: str) -> tuple[bool, int, bool, bool]:
        record, alive = found[name]["record"], bool(found[name].get("alive"))
        return not record.get("gave_way"), int(record.get("epoch") or 0), alive, name == at

    return max(found, key=newest)


def _each_keeper(
    hosts: list[Host], dirs: dict[str, str], verb: str
) -> tuple[dict[str, dict[str, Any]], list[OrchError]]:
    """The replies of `keeper VERB DIR` that hold a keeper's record, on every host of
    `hosts` that answers, in parallel; the failures beside."""
    if not hosts:
        return {}, []
    group, _ = connect_reachable(hosts, lambda _: None)
    with group:
        replies, failures = group.try_each(
            lambda h, t: agent.run(
                h, t, ["keeper", verb, str(dirs[h.name])], timeout=KEEPER_TIMEOUT_S
            )
        )
    found = {
        name: reply
        for name, reply in replies.items()
        if isinstance(reply.get("record"), dict)
        and isinstance(reply["record"].get("current"), dict)
    }
    return found, failures


def keeper_of(record: JobRecord) -> dict[str, Any] | None:
    """A detached job's keeper ({host, dir, at, dirs, hosts}), from the SSH backend's
    own field of its spec (an orch before that kept it at the spec's top)."""
    keeper = (record.view.own or {}).get("keeper", record.spec.get("keeper"))
    return keeper if isinstance(keeper, dict) else None


def note(record: JobRecord) -> str:
    """` (kept by node2)`: the host whose keeper restarts the detached job."""
    keeper = keeper_of(record)
    if keeper is None or not record.spec.get("restarts"):
        return ""
    return f" (kept by {keeper.get('at', keeper['host'])})"


def _apply(
    store: JobDB,
    record: JobRecord,
    found: dict[str, Any],
    hosts: dict[str, Host],
    reporter: Reporter,
) -> JobRecord:
    """Record the attempts the keeper started beyond the record's own."""
    known = record.view.attempt
    attempts = {int(a["attempt"]): a for a in [*found.get("attempts", []), found["current"]]}
    latest = int(found["current"]["attempt"])
    for attempt in range(known, latest):
        ended, following = attempts.get(attempt), attempts.get(attempt + 1)
        if ended is None or following is None:
            break
        for node in ended["nodes"]:
            store.update_node(
                record.id,
                str(node["host"]),
                JobState.parse(node["state"]),
                node.get("exit_code"),
                node.get("error"),
            )
        earlier = store.get(record.id).nodes
        nodes = [
            NodeRecord(
                hosts[n["host"]],
                int(n["node_rank"]),
                int(n["first_rank"]),
                int(n["nproc"]),
                str(n["job_dir"]),
            )
            for n in following["nodes"]
        ]
        store.restart(
            JobRecord(
                record.id,
                record.name,
                JobState.PENDING,
                str(following["master_addr"]),
                following["master_port"],
                {"attempt": attempt + 1},
                nodes,
            )
        )
        _copy_logs(store, record.id, attempt, earlier)
        restarts = record.view.restarts
        reporter.notice(
            f"job {record.id}: {ended.get('reason') or f'attempt {attempt + 1} ended'}: "
            f"its keeper started it again as attempt {attempt + 2} of {restarts + 1}, on "
            + ", ".join(n.host.name for n in nodes)
        )
    current = found["current"]
    if found.get("state") == states.FAILED and int(current["attempt"]) == record.view.attempt:
        for node in current["nodes"]:  # how the keeper ended them (a stall, say)
            if node.get("state") == states.FAILED and node.get("error"):
                store.update_node(
                    record.id, str(node["host"]), JobState.FAILED, None, str(node["error"])
                )
    return store.get(record.id)


def _copy_logs(store: JobDB, job_id: str, attempt: int, nodes: list[NodeRecord]) -> None:
    """Copy what an ended attempt's nodes logged into its local mirror (what `orch
    logs` shows under the attempt's marker); hosts that do not answer are skipped."""
    from orchestrator.reporting.follow import Watcher

    group, _ = connect_reachable([n.host for n in nodes], lambda _: None)
    mirror = LogMirror(store.home / "logs", job_id, attempt)
    try:
        with group:
            reachable = [n for n in nodes if n.host.name in group.transports]
            watcher = Watcher(reachable, group.transports, mirror, once=True)
            try:
                for _event in watcher.events():
                    pass
            finally:
                watcher.close()
    except OrchError as exc:
        log.info("[job=%s] logs of attempt %d: %s", job_id, attempt, exc.message)
    finally:
        mirror.close()
