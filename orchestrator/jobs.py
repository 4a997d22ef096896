"""`orch status`, `orch logs` and `orch kill`: managing jobs after the fact.

Every command works from the local job record alone (the inventory may have changed
since): it reconnects to the job's hosts, asks each node's supervisor how it is, and
brings the record up to date. Hosts that do not answer are named, never hidden.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator import launch
from orchestrator.hosts import HostGroup
from orchestrator.logstore import LogMirror, rank_of
from orchestrator.models.errors import HostError, InfraError, InputError, OrchError
from orchestrator.models.states import JobState, job_state, node_state
from orchestrator.service import Reporter, teardown, watch_job
from orchestrator.state import JobRecord, NodeRecord, Store
from orchestrator.transport import ConnectOptions
from orchestrator.watch import NodeExit, Watcher

log = logging.getLogger(__name__)
SETTLED = (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)


def _connect(nodes: Sequence[NodeRecord], reporter: Reporter) -> tuple[HostGroup, list[OrchError]]:
    group = HostGroup([n.host for n in nodes], ConnectOptions(notice=reporter.notice))
    return group, group.connect(tolerate=True)


# ---------------------------------------------------------------- status


def reconcile(store: Store, record: JobRecord, reporter: Reporter) -> JobRecord:
    """Bring a job's record in line with its hosts; returns the updated record.

    A node that failed while others still run gets the job torn down, as an attached
    submit would have done: a detached job has no controller to do it.
    """
    if record.state.is_terminal():
        return record
    open_nodes = [n for n in record.nodes if n.state not in SETTLED]
    group, failures = _connect(open_nodes, reporter)
    with group:
        by_host = {n.host.name: n for n in open_nodes}
        statuses, more = group.try_each(lambda h, t: launch.node_status(by_host[h.name], t))
        unreachable = {f.host for f in [*failures, *more] if isinstance(f, HostError)}
        last_end: float | None = None
        for node in open_nodes:
            if node.host.name in unreachable:
                node.state, node.error = JobState.LOST, "host not answering"
                continue
            ended = statuses[node.host.name].get("ended")
            if ended:
                node.state = node_state(ended.get("returncode"), bool(ended.get("killed")))
                node.exit_code, node.error = ended.get("returncode"), ended.get("error")
                last_end = max(last_end or 0.0, float(ended.get("ended") or 0.0)) or None
                store.update_node(record.id, node.host.name, node.state, node.exit_code, node.error)
            elif statuses[node.host.name].get("started"):
                node.state = JobState.RUNNING
        failed = [n for n in record.nodes if n.state is JobState.FAILED]
        running = [n for n in record.nodes if n.state is JobState.RUNNING]
        if failed and running:
            reporter.notice(
                f"job {record.id}: node {failed[0].host.name} failed; stopping the others"
            )
            teardown(record.id, record.master_port, running, group, reporter)
            for node in running:
                node.state = JobState.KILLED
                store.update_node(record.id, node.host.name, JobState.KILLED)
    state = job_state([n.state for n in record.nodes])
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


def status(store: Store, job_id: str | None, reporter: Reporter) -> list[JobRecord]:
    """Every job (or one), reconciled with its hosts where it has not ended."""
    records = [store.get(job_id)] if job_id else store.jobs()
    return [reconcile(store, r, reporter) for r in records]


# ---------------------------------------------------------------- logs


@dataclass
class LogFilter:
    """Which lines `orch logs` shows."""

    node: str | None = None
    rank: int | None = None
    tail: int | None = None

    def nodes(self, record: JobRecord) -> list[NodeRecord]:
        if self.node is None:
            chosen = record.nodes
        else:
            chosen = [n for n in record.nodes if n.host.name == self.node]
            if not chosen:
                raise InputError(
                    f"job {record.id} has no node '{self.node}'",
                    "its nodes: " + ", ".join(n.host.name for n in record.nodes),
                )
        if self.rank is not None:
            chosen = [n for n in chosen if self.rank in n.ranks]
            if not chosen:
                world = sum(n.nproc for n in record.nodes)
                raise InputError(
                    f"job {record.id} has no rank {self.rank} (on the nodes asked for)",
                    f"ranks are 0 to {world - 1}",
                )
        return chosen

    def wants(self, host: str, rank: int | None) -> bool:
        """Whether to show a stream: a rank's (rank) or a node's torchrun output (None)."""
        if self.node is not None and host != self.node:
            return False
        return self.rank is None or rank == self.rank


def logs(store: Store, job_id: str, want: LogFilter, follow: bool, reporter: Reporter) -> int:
    """Print a job's output so far (from its hosts, else the local copy); with `follow`,
    go on until the job ends.

    Returns:
        0, or with `follow` the job's exit code (0 succeeded, 1 otherwise).

    Raises:
        HostError / MultiHostError: some hosts could not be reached; everything that
            could be shown was shown first (exit 3).
    """
    record = store.get(job_id)
    nodes = want.nodes(record)
    if follow:  # the job's end is known only from all of its nodes
        nodes = record.nodes
    mirror = LogMirror(store.home / "logs", record.id)
    group, failures = _connect(nodes, reporter)
    try:
        with group:
            reachable = [n for n in nodes if n.host.name in group.transports]
            failures += _drain(record, reachable, group, mirror, store)
            _print_mirror(nodes, mirror, want, reporter)
            if follow and not failures:
                return _follow(store, record, group, mirror, want, reporter)
    finally:
        mirror.close()
    if failures:
        for failure in failures:
            reporter.notice(f"could not read the logs there: {failure.message}")
        raise (
            failures[0]
            if len(failures) == 1
            else InfraError(
                f"{len(failures)} hosts could not be reached: "
                + "; ".join(f.message for f in failures),
                "the lines above are the local copy of what was seen before",
            )
        )
    return 0


def _drain(
    record: JobRecord, nodes: list[NodeRecord], group: HostGroup, mirror: LogMirror, store: Store
) -> list[OrchError]:
    """Copy what the hosts have beyond the local copy into it; note ended nodes."""
    watcher = Watcher(nodes, group.transports, mirror, once=True)
    failures: list[OrchError] = []
    try:
        for event in watcher.events():
            if not isinstance(event, NodeExit):
                continue
            if event.lost:
                failures.append(HostError(event.host, event.error or "lost while reading logs"))
            elif event.returncode is not None or event.killed:
                state = node_state(event.returncode, event.killed)
                store.update_node(record.id, event.host, state, event.returncode, event.error)
    finally:
        watcher.close()
    return failures


def _print_mirror(
    nodes: list[NodeRecord], mirror: LogMirror, want: LogFilter, reporter: Reporter
) -> None:
    for node in nodes:
        name = node.host.name
        for stream in mirror.streams(name):
            if not want.wants(name, rank_of(stream)):
                continue
            reporter.output(name, rank_of(stream), mirror.read(name, stream, want.tail))


class _Filtered:
    """A Reporter that passes on only the streams a LogFilter wants."""

    def __init__(self, inner: Reporter, want: LogFilter) -> None:
        self.inner, self.want = inner, want

    def job_started(self, job_id: str) -> None:
        self.inner.job_started(job_id)

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        if self.want.wants(host, rank):
            self.inner.output(host, rank, data)

    def notice(self, message: str) -> None:
        self.inner.notice(message)


def _follow(
    store: Store,
    record: JobRecord,
    group: HostGroup,
    mirror: LogMirror,
    want: LogFilter,
    reporter: Reporter,
) -> int:
    fresh = store.get(record.id)
    if all(n.state.is_terminal() for n in fresh.nodes):
        return 0 if job_state([n.state for n in fresh.nodes]) is JobState.SUCCEEDED else 1
    try:
        return watch_job(fresh, group, _Filtered(reporter, want), store, mirror, attached=False)
    except OrchError as exc:
        if exc.exit_code == 1:  # the job failed: its summary, then its exit code
            reporter.notice(exc.message)
            return 1
        raise


# ---------------------------------------------------------------- kill


@dataclass
class KillOutcome:
    """What `orch kill` did to one job."""

    job_id: str
    already: JobState | None = None  # the job had ended before: nothing to do
    killed: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    port_free: bool | None = None
    unreachable: list[OrchError] = field(default_factory=list)


def kill(store: Store, job_id: str | None, reporter: Reporter) -> list[KillOutcome]:
    """Stop a job (or, with job_id None, every job not yet ended) on every host."""
    records = (
        [store.get(job_id)] if job_id else [r for r in store.jobs() if not r.state.is_terminal()]
    )
    return [_kill_one(store, r, reporter) for r in records]


def _kill_one(store: Store, record: JobRecord, reporter: Reporter) -> KillOutcome:
    outcome = KillOutcome(record.id)
    nodes = record.nodes
    if record.state.is_terminal():
        # An ended job may still have processes on a host that vanished and came back.
        nodes = [n for n in record.nodes if n.state is JobState.LOST]
        if not nodes:
            outcome.already = record.state
            return outcome
    group, failures = _connect(nodes, reporter)
    log.info("[job=%s] connected to %d hosts", record.id, len(group.transports))
    with group:
        reports = teardown(record.id, record.master_port, nodes, group, reporter)
    log.info("[job=%s] stopped on %d hosts", record.id, len(reports))
    outcome.unreachable = failures
    for name, report in reports.items():
        outcome.killed[name] = [(int(pid), str(cmd)) for pid, cmd in report.get("killed", [])]
        if "port_free" in report:
            outcome.port_free = bool(report["port_free"])
        store.update_node(record.id, name, JobState.KILLED)
    for failure in failures:
        if isinstance(failure, HostError):
            store.update_node(
                record.id, failure.host, JobState.LOST, error="host not answering at kill"
            )
    if not record.state.is_terminal():
        store.update_job(record.id, JobState.KILLED, 1)
    return outcome
