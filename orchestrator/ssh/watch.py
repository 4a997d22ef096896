"""Watching an attached job: stream its output, and tear it down when a node fails."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from orchestrator.models.clocks import HostClock, clocks_from_json
from orchestrator.models.errors import Interrupted, JobFailed
from orchestrator.models.states import JobState, job_state, node_state
from orchestrator.nodes import ops
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.records.logmirror import LogMirror
from orchestrator.reporting.contact import LOST_AFTER_S
from orchestrator.reporting.failure import (
    TAIL_LINES,
    describe_exit,
    failure_summary,
    first_in_time,
)
from orchestrator.reporting.follow import NodeExit, Notice, Output, Watcher
from orchestrator.reporting.progress import Condenser
from orchestrator.reporting.reporter import Reporter
from orchestrator.ssh.retry import retry_each
from orchestrator.ssh.stall import StallWatch
from orchestrator.ssh.teardown import STOPPED_LATER, stop_interrupted, teardown

LOST_RETRY_S = 15.0  # how long an attached submit keeps trying to stop a lost node


def watch_job(
    record: JobRecord,
    group: HostGroup,
    reporter: Reporter,
    store: JobDB,
    mirror: LogMirror,
    attached: bool,
    stop_others: bool = True,
    stalled: Callable[[list[str]], None] | None = None,
) -> int:
    """Stream a job's output until every node ended; tear the job down when one fails.

    Args:
        attached: the submit that started the job: Ctrl-C kills the job (else it only
            stops following).
        stop_others: tear the job down when a node fails; False where another owns
            that (a detached job's keeper, which restarts it).
        stalled: told what the stall watchdog found, each time it takes the stacks.

    Returns:
        0 when every node succeeded.

    Raises:
        JobFailed: a node failed or was lost; the job was stopped on every node.
        Interrupted: Ctrl-C on an attached submit; the job was stopped everywhere.
    """
    # Over complexity 10: the stream loop, the first failure's teardown and Ctrl-C
    # share one watcher and one teardown thread, which every way out must close/join.
    live = [
        n for n in record.nodes if not n.state.is_terminal() and n.host.name in group.transports
    ]
    watcher = Watcher(
        live,
        group.transports,
        mirror,
        reconnect=group.fresh,
        lost_after={n.host.name: float(n.host.lost_after or LOST_AFTER_S) for n in live},
    )
    tails: dict[tuple[str, int | None], deque[bytes]] = {}
    condensers: dict[tuple[str, int | None], Condenser] = {}
    failure: NodeExit | None = None
    failures: list[NodeExit] = []  # in the order they arrived
    killer: threading.Thread | None = None
    stall = _stall_watch(record, group, reporter, attached, stalled)
    try:
        for event in watcher.events():
            if isinstance(event, Notice):
                reporter.notice(event.message)
                continue
            if isinstance(event, Output):
                key = (event.host, event.rank)
                tail = tails.setdefault(key, deque(maxlen=TAIL_LINES))
                condenser = condensers.setdefault(key, Condenser())
                lines = condenser.feed(event.data)  # a progress bar: its last state only
                if not condenser.bar:
                    lines += condenser.flush()
                tail.extend(lines.split(b"\n")[-TAIL_LINES - 1 : -1])
                reporter.output(event.host, event.rank, event.data)
                if stall is not None:
                    stall.heard()
                continue
            state = node_state(event.returncode, event.killed)
            store.update_node(record.id, event.host, state, event.returncode, event.reason)
            record.node(event.host).state = state
            if event.ok:
                continue
            failures.append(event)
            if failure is not None:
                continue
            failure = event  # the first to arrive: the job is stopped at once
            if not stop_others or (stall is not None and stall.reason):
                continue  # a stalled job is being stopped already
            others = [
                n for n in record.nodes if n.host.name != event.host and not n.state.is_terminal()
            ]
            reporter.notice(
                f"{describe_exit(event)}: stopping the job on {len(others)} other node(s)"
            )
            args = (record.id, record.master_port, others, group, reporter)
            killer = threading.Thread(target=teardown, args=args, daemon=True)
            killer.start()
    except KeyboardInterrupt:
        if not attached:
            raise
        stop_interrupted(record.id, record.master_port, record.nodes, group, reporter)
        for node in record.nodes:
            store.update_node(record.id, node.host.name, JobState.KILLED)
        store.update_job(record.id, JobState.KILLED)
        raise Interrupted(f"job {record.id} interrupted and stopped on every host") from None
    finally:
        watcher.close()
        if killer is not None:
            killer.join()
        if stall is not None:
            stall.close()
    if stall is not None and stall.reason:
        raise _stalled(record, store, stall.reason, stall.saved)
    lost = [n for n in record.nodes if n.state is JobState.LOST]
    if lost and attached:
        stop_when_reachable(record, lost, group, reporter, store)
    final = job_state([n.state for n in record.nodes])
    if final.is_terminal() and stop_others:  # else the job's keeper says how it ends
        store.update_job(record.id, final, 0 if final is JobState.SUCCEEDED else 1)
    if failure is None and final is JobState.SUCCEEDED:
        return 0
    if failure is None:
        raise JobFailed(f"job {record.id} ended {final.value}", f"see: orch status {record.id}")
    cause = first_failure(failures, clocks_from_json(record.spec.get("clocks")))
    raise JobFailed(failure_summary(record, cause, tails), f"all output: orch logs {record.id}")


def _stall_watch(
    record: JobRecord,
    group: HostGroup,
    reporter: Reporter,
    attached: bool,
    stalled: Callable[[list[str]], None] | None,
) -> StallWatch | None:
    """The job's stall watchdog, where it has `stall_after:` and this is its
    controller (a detached job's keeper watches it instead)."""
    stall_after = record.spec.get("stall_after")
    if not attached or not isinstance(stall_after, int):
        return None

    def stop(reason: str) -> None:
        others = [n for n in record.nodes if not n.state.is_terminal()]
        teardown(record.id, record.master_port, others, group, reporter)

    warn = record.spec.get("on_stall") == "warn"
    return StallWatch(record, float(stall_after), warn, reporter, stop, stalled)


def _stalled(record: JobRecord, store: JobDB, reason: str, saved: str | None) -> JobFailed:
    """A stalled job, stopped: failed, every node with the reason (so that restarts:
    take it as a failure, and `orch status` says why)."""
    for node in record.nodes:
        if node.state is not JobState.LOST:
            node.state, node.error = JobState.FAILED, reason
            store.update_node(record.id, node.host.name, JobState.FAILED, error=reason)
    store.update_job(record.id, JobState.FAILED, 1)
    where = f"the stacks: {saved}; " if saved else ""
    return JobFailed(f"job {record.id} {reason}", f"{where}all output: orch logs {record.id}")


def first_failure(failures: Sequence[NodeExit], clocks: Mapping[str, HostClock]) -> NodeExit:
    """The failure that happened first on the hosts' clocks (`first_in_time`), of those
    in arrival order: a secondary failure that arrives first is not the cause. A node
    that was killed tells when it was stopped, not when anything failed: its time is
    not compared."""
    times = [(f.host, None if f.ended is None or f.killed else f.ended.ended) for f in failures]
    return failures[first_in_time(times, clocks)]


def stop_when_reachable(
    record: JobRecord,
    lost: Sequence[NodeRecord],
    group: HostGroup,
    reporter: Reporter,
    store: JobDB,
    within_s: float = LOST_RETRY_S,
) -> None:
    """Keep trying, for a while, to stop the job on nodes that were lost: their ranks
    may run on behind a partition. Every lost node is tried at once and on its own
    (retry.py), so one that waits out its connect timeout delays no other. Ctrl-C
    stops trying."""
    names = ", ".join(n.host.name for n in lost)
    by_name = {n.host.name: n for n in lost}

    def stop(name: str) -> None:
        node = by_name[name]
        ops.kill(node, group.fresh(node.host), record.id)

    pending = dict(by_name)
    tries = retry_each(by_name, stop, within_s)
    try:
        # Said inside the try: a Ctrl-C the moment it is read stops the trying, as it says.
        reporter.notice(
            f"{names}: not reachable; stopping the job there once it is "
            f"(trying for {within_s:.0f} s, Ctrl-C to stop trying)"
        )
        for tried in tries:
            if not tried.ok:
                continue
            del pending[tried.name]
            reporter.notice(f"stopped the job on {tried.name}, reachable again")
            store.update_node(record.id, tried.name, JobState.LOST, error=STOPPED_LATER)
    except KeyboardInterrupt:
        pass
    finally:
        tries.close()
    if pending:
        reporter.notice(
            f"the job may still run on {', '.join(pending)}: "
            f"stop it there with: orch kill {record.id}"
        )
