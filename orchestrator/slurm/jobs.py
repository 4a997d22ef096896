"""`orch status`, `orch logs` and `orch kill` of recorded Slurm jobs, through each job's
login node: squeue (else sacct, else the batch script's exit record) for the state,
the agent's `follow` over the shared home for the output, scancel to stop it.

A Slurm job's record has no node rows (Slurm picks the nodes when it starts the job):
its spec["slurm"] holds the Slurm job id, the partition, the login node and, once
known, the node list, state and reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from orchestrator.models.errors import HostError, InfraError, JobFailed
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.records.logmirror import LogMirror, rank_of
from orchestrator.reporting.attempts import print_earlier_attempts
from orchestrator.reporting.filters import FilteredReporter, LogFilter
from orchestrator.reporting.follow import IDLE_TIMEOUT_S, NodeExit, Watcher
from orchestrator.reporting.reporter import Reporter
from orchestrator.slurm.follow import cancel, nodes_of, slurm_id_of
from orchestrator.slurm.login import LoginNode
from orchestrator.slurm.outputs import bring_outputs
from orchestrator.slurm.queue import QueuedJob
from orchestrator.slurm.restarts import follow_attempts, sync_chain
from orchestrator.transport import ConnectOptions, Transport


def login_host(record: JobRecord) -> Host:
    """The login node as the job was submitted through it."""
    data = dict(record.spec["slurm"]["host"])
    known = {f.name for f in dataclasses.fields(Host)}
    data = {k: v for k, v in data.items() if k in known}
    data["gpus"] = tuple(data.get("gpus", ()))
    data["labels"] = tuple(data.get("labels", ()))
    return Host(**data)


@contextmanager
def connected(record: JobRecord, notice: Callable[[str], None]) -> Iterator[LoginNode]:
    """The job's login node, connected.

    Raises:
        HostError: it cannot be reached (exit 3).
    """
    host = login_host(record)
    with HostGroup([host], ConnectOptions(notice=notice)) as group:
        group.connect()
        yield LoginNode(host, group.transports[host.name])


def refresh(store: JobDB, record: JobRecord, login: LoginNode) -> JobRecord:
    """Bring a Slurm job's record in line with Slurm: state, reason, nodes; with
    `restarts:`, at the attempt its chain reached (restarts.sync_chain)."""
    if not record.spec["slurm"].get("job_id"):
        return record
    if _may_restart(record):
        record = sync_chain(store, record, login)
    if record.state.is_terminal():
        return record
    slurm_id = slurm_id_of(record)
    found = login.query(slurm_id, str(record.spec["slurm"]["job_root"]))
    info: dict[str, Any] = dict(record.spec["slurm"])
    if found is None:
        info["state"] = "gone from squeue"
        store.update_spec(record.id, slurm=info)
        store.update_job(record.id, JobState.UNKNOWN)
        return store.get(record.id)
    info.update(state=found.slurm_state, reason=found.reason)
    if found.nodelist:
        info["nodelist"] = found.nodelist
    store.update_spec(record.id, slurm=info)
    if found.state is not record.state:
        exit_code = None if not found.state.is_terminal() else (0 if _ok(found) else 1)
        store.update_job(record.id, found.state, exit_code)
    return store.get(record.id)


def status(store: JobDB, record: JobRecord, notice: Callable[[str], None]) -> JobRecord:
    """`orch status` of a Slurm job: asked of its login node when it has not ended, with
    its nodes from Slurm's node list."""
    if not record.state.is_terminal() or _may_restart(record):
        try:
            with connected(record, notice) as login:
                record = refresh(store, record, login)
        except HostError as exc:
            notice(f"job {record.id}: {exc.message}")
    nodelist = str(record.spec["slurm"].get("nodelist") or "")
    record.nodes = [
        dataclasses.replace(n, state=record.state)
        for n in nodes_of(record, login_host(record), nodelist)
    ]
    return record


def _may_restart(record: JobRecord) -> bool:
    """A job not killed or done, with restarts left: its chain may have started
    another attempt since this record was last brought up to date."""
    view = record.view
    done = (JobState.KILLED, JobState.SUCCEEDED)
    return view.attempt < view.restarts and record.state not in done


def note(spec: Mapping[str, Any]) -> str:
    """What `orch status` adds to a Slurm job's state: its Slurm id, and why it waits
    (pending) or Slurm's word for how it ended (failed: TIMEOUT, NODE_FAIL ...)."""
    info = spec.get("slurm") if spec.get("backend") == "slurm" else None
    if not info:
        return ""
    parts = [f"slurm {info.get('job_id') or '?'}"]
    state = str(info.get("state") or "")
    reason = str(info.get("reason") or "")
    if state == "PENDING" and reason not in ("", "None"):
        parts.append(reason)
    elif state and state not in ("PENDING", "RUNNING", "COMPLETED", "COMPLETING"):
        parts.append(state)
    return f" ({', '.join(parts)})"


def kill(job_id: str, reporter: Reporter, store: JobDB | None = None) -> list[str]:
    """`orch kill` of a Slurm job: scancel, then until squeue shows it gone; then its
    `outputs:` come back (./orch-outputs/ID), as over SSH.

    Returns:
        What to tell the user, a line each.

    Raises:
        HostError: the login node cannot be reached.
        InfraError: the allocation was still there after the wait.
    """
    store = store or JobDB()
    record = store.get(job_id)
    if record.state.is_terminal():
        return [f"job {record.id} had already ended ({record.state.value}): nothing to kill"]
    slurm_id = slurm_id_of(record)
    with connected(record, reporter.notice) as login:
        gone = cancel(record, login, store)
        bring_outputs(store.get(record.id), login, None, reporter.notice)
    if not gone:
        raise InfraError(
            f"Slurm job {slurm_id} (orch job {record.id}) is still in squeue after scancel",
            f"look at it on the login node: squeue -j {slurm_id}",
        )
    return [f"slurm job {slurm_id} cancelled: gone from squeue", f"job {record.id} killed"]


def logs(
    job_id: str, reporter: Reporter, want: LogFilter, follow: bool, store: JobDB | None = None
) -> int:
    """`orch logs [-f]` of a Slurm job: what its ranks wrote (from the shared home through
    the login node, else the local copy); with `follow`, on until the job ends.

    Returns:
        0, or with `follow` the job's exit code (0 succeeded, 1 otherwise).
    """
    store = store or JobDB()
    record = store.get(job_id)
    with connected(record, reporter.notice) as login:
        record = refresh(store, record, login)
        mirror = LogMirror(store.home / "logs", record.id, record.view.attempt)
        try:
            nodelist = str(record.spec["slurm"].get("nodelist") or "")
            nodes = nodes_of(record, login.host, nodelist)
            record.nodes = nodes
            chosen = want.nodes(record) if not follow else nodes
            if chosen:
                login.prepare_node_dirs(
                    str(record.spec["slurm"]["job_root"]),
                    [n.host.name for n in chosen],
                    record.view.attempt,
                )
            _drain(chosen, login.transport, mirror)
            print_earlier_attempts(record, store, want, reporter)
            for node in want.nodes(record):
                for stream in mirror.streams(node.host.name):
                    if want.wants(node.host.name, rank_of(stream)):
                        data = mirror.read(node.host.name, stream, want.tail)
                        reporter.output(node.host.name, rank_of(stream), data)
        finally:
            mirror.close()
        if not follow:
            return 0
        if record.state.is_terminal():
            return 0 if record.state is JobState.SUCCEEDED else 1
        try:
            return follow_attempts(
                record, login, FilteredReporter(reporter, want), store, attached=False
            )
        except JobFailed as exc:
            reporter.notice(exc.message)
            return 1


def _drain(nodes: list[NodeRecord], transport: Transport, mirror: LogMirror) -> None:
    """Copy what the shared home holds beyond the local copy into it."""
    if not nodes:
        return
    transports = {n.host.name: transport for n in nodes}
    watcher = Watcher(nodes, transports, mirror, once=True, idle_timeout=IDLE_TIMEOUT_S)
    try:
        for event in watcher.events():
            if isinstance(event, NodeExit) and event.lost:
                raise HostError(event.host, event.error or "lost while reading logs")
    finally:
        watcher.close()


def _ok(found: QueuedJob) -> bool:
    return found.state is JobState.SUCCEEDED
