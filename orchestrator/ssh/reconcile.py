"""`orch status`, `orch logs` and `orch kill`: managing jobs after the fact.

Every command works from the local job record alone (the inventory may have changed
since): it reconnects to the job's hosts, asks each node's supervisor how it is, and
brings the record up to date. Hosts that do not answer are named, never hidden.
"""

from __future__ import annotations

import logging

from orchestrator.models.clocks import clocks_from_json
from orchestrator.models.errors import HostError
from orchestrator.models.states import STILL_RUNNING, JobState, job_state, node_state
from orchestrator.nodes import ops
from orchestrator.nodes.group import FRESH_TIMEOUT_S, connect_reachable
from orchestrator.records.db import JobDB, JobRecord
from orchestrator.reporting.failure import first_in_time
from orchestrator.reporting.reporter import Reporter
from orchestrator.ssh import keep
from orchestrator.ssh.teardown import STOPPED_LATER, teardown

log = logging.getLogger(__name__)
SETTLED = (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)


# ---------------------------------------------------------------- status


def reconcile(store: JobDB, record: JobRecord, reporter: Reporter) -> JobRecord:
    """Bring a job's record in line with its hosts; returns the updated record.

    A node that failed while others still run gets the job torn down, as an attached
    submit would have done: a detached job has no controller to do it.
    """
    if record.state.is_terminal():
        return record
    kept = keep.sync(store, record, reporter)  # a detached job's restarts, by its keeper
    record = kept.record
    open_nodes = [n for n in record.nodes if n.state not in SETTLED]
    group, failures = connect_reachable([n.host for n in open_nodes], reporter.notice)
    with group:
        by_host = {n.host.name: n for n in open_nodes}
        statuses, more = group.try_each(lambda h, t: ops.node_status(by_host[h.name], t))
        unreachable = {f.host for f in [*failures, *more] if isinstance(f, HostError)}
        last_end: float | None = None
        ended_at: dict[str, float | None] = {}  # on the host's clock
        for node in open_nodes:
            if node.host.name in unreachable:
                node.state, node.error = JobState.LOST, "host not answering"
                continue
            ended = statuses[node.host.name].ended
            if ended:
                node.state = node_state(ended.returncode, ended.killed)
                node.exit_code, node.error = ended.returncode, ended.error
                last_end = max(last_end or 0.0, ended.ended or 0.0) or None
                ended_at[node.host.name] = ended.ended
                store.update_node(record.id, node.host.name, node.state, node.exit_code, node.error)
            elif statuses[node.host.name].started:
                node.state = JobState.RUNNING
                node.idle_s = statuses[node.host.name].idle_s
        failed = [n for n in record.nodes if n.state is JobState.FAILED]
        running = [n for n in record.nodes if n.state is JobState.RUNNING]
        if failed and running and not kept.acting:
            clocks = clocks_from_json(record.spec.get("clocks"))
            first = first_in_time(
                [(n.host.name, ended_at.get(n.host.name)) for n in failed], clocks
            )
            reporter.notice(
                f"job {record.id}: node {failed[first].host.name} failed; stopping the others"
            )
            teardown(record.id, record.master_port, running, group, reporter)
            for node in running:
                node.state = JobState.KILLED
                store.update_node(record.id, node.host.name, JobState.KILLED)
    state = job_state([n.state for n in record.nodes])
    if kept.acting and state.is_terminal() and state is not JobState.SUCCEEDED:
        # Between two attempts: the keeper decides what follows. A success is final
        # (nothing restarts it), though its keeper may not have recorded it yet.
        state = JobState.RUNNING
    # A host that does not answer keeps its node LOST in this answer only; the job
    # becomes lost only once every other node has ended.
    if state.is_terminal():
        store.update_job(record.id, state, _exit_code(record), ended=last_end)
    elif state is JobState.RUNNING and record.state is JobState.PENDING:
        store.update_job(record.id, state)
    return store.get(record.id) if state.is_terminal() else _with_state(record, state)


def _with_state(record: JobRecord, state: JobState) -> JobRecord:
    record.state = state
    return record


def _exit_code(record: JobRecord) -> int:
    codes = [n.exit_code for n in record.nodes if n.exit_code not in (None, 0)]
    if all(n.state is JobState.SUCCEEDED for n in record.nodes):
        return 0
    return codes[0] if codes else 1


def status(
    store: JobDB, record: JobRecord, reporter: Reporter, thorough: bool = False
) -> JobRecord:
    """A job reconciled with its hosts where it has not ended; `thorough` (the job
    asked for by name), and it ended: its lost nodes are looked for too (they may run on)."""
    record = reconcile(store, record, reporter)
    return look_for_lost(store, record, reporter) if thorough else record


def look_for_lost(store: JobDB, record: JobRecord, reporter: Reporter) -> JobRecord:
    """For a job that ended, its lost nodes that still run where they were lost (behind
    a partition that healed, say): stopped there, as `orch kill` would, and said so in
    one line. Their error then says STOPPED_LATER (and they are not looked for again);
    STILL_RUNNING where the stop failed (why is noticed), with the hint to `orch kill`."""
    lost = [n for n in record.nodes if n.state is JobState.LOST and n.error != STOPPED_LATER]
    if not record.state.is_terminal() or not lost:
        return record
    # Lost once: a host still behind its partition costs a short timeout, not the usual.
    group, _ = connect_reachable([n.host for n in lost], lambda _: None, FRESH_TIMEOUT_S)
    with group:
        by_host = {n.host.name: n for n in lost}
        statuses, _ = group.try_each(lambda h, t: ops.node_status(by_host[h.name], t))
        running = [by_host[name] for name, found in statuses.items() if found.running]
        reports = teardown(record.id, None, running, group, reporter) if running else {}
    stopped = [name for name, report in reports.items() if not report.remaining]
    for name, found in statuses.items():
        node = by_host[name]
        if name in stopped:
            node.error = STOPPED_LATER
        else:
            node.error = STILL_RUNNING if found.running else "lost; ended there since"
        store.update_node(record.id, name, JobState.LOST, node.exit_code, node.error)
    if stopped:
        reporter.notice(
            f"stopped the job on {', '.join(stopped)}: lost earlier, found still running there"
        )
    if any(n.error == STILL_RUNNING for n in lost):
        reporter.notice(f"hint: the job still runs there: stop it with: orch kill {record.id}")
    return record


# ---------------------------------------------------------------- logs


# ---------------------------------------------------------------- kill
