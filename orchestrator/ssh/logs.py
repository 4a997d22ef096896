"""`orch logs`: a job's output from its hosts (else the local copy), optionally followed."""

from __future__ import annotations

import time

from orchestrator.models.errors import HostError, InfraError, OrchError
from orchestrator.models.states import JobState, job_state, node_state
from orchestrator.nodes.group import HostGroup, connect_reachable
from orchestrator.records import stacks
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.records.logmirror import LogMirror, rank_of
from orchestrator.reporting.attempts import print_earlier_attempts
from orchestrator.reporting.filters import FilteredReporter, LogFilter
from orchestrator.reporting.follow import IDLE_TIMEOUT_S, NodeExit, Watcher
from orchestrator.reporting.reporter import Reporter
from orchestrator.ssh import keep
from orchestrator.ssh.reconcile import look_for_lost
from orchestrator.ssh.watch import watch_job

NEXT_ATTEMPT_POLL_S = 1.0  # how often a follow asks the keeper for the next attempt


def logs(store: JobDB, job_id: str, want: LogFilter, follow: bool, reporter: Reporter) -> int:
    """Print a job's output so far (from its hosts, else the local copy); with `follow`,
    go on until the job ends: for a job its keeper restarts, through every attempt it
    starts, each under its marker. Then a lost node found still running is stopped
    (`reconcile.look_for_lost`).

    Returns:
        0, or with `follow` the job's exit code (0 succeeded, 1 otherwise).

    Raises:
        HostError / MultiHostError: some hosts could not be reached; everything that
            could be shown was shown first (exit 3).
    """
    kept = keep.sync(store, store.get(job_id), reporter)  # attempts of a keeper's
    want.nodes(kept.record)  # an unknown node or rank is refused before anything shows
    print_earlier_attempts(kept.record, store, want, reporter)
    code = _attempt_logs(store, kept, want, follow, reporter)
    while follow and code != 0 and kept.acting:
        following = _next_attempt(store, kept.record, reporter)
        if following is None:
            break
        kept = following
        reporter.notice(f"--- attempt {kept.record.view.attempt + 1} ---")
        code = _attempt_logs(store, kept, want, follow, reporter)
    if follow:  # the job ended: where a lost node runs on, stop it
        look_for_lost(store, store.get(job_id), reporter)
    taken = stacks.saved(job_id)
    if taken:  # orch stack's, or the stall watchdog's: kept with the job's records
        more = f" ({len(taken)} in all, in {taken[-1].parent})" if len(taken) > 1 else ""
        reporter.notice(f"stacks taken of job {job_id}: {taken[-1]}{more}")
    return code


def _next_attempt(store: JobDB, record: JobRecord, reporter: Reporter) -> keep.Kept | None:
    """Wait for the job's keeper to start its next attempt (its record then has it);
    None once the keeper decided there is none."""
    known = record.view.attempt
    while True:
        time.sleep(NEXT_ATTEMPT_POLL_S)
        kept = keep.sync(store, store.get(record.id), reporter)
        if kept.record.view.attempt > known:
            return kept
        if not kept.acting:
            return None


def _attempt_logs(
    store: JobDB, kept: keep.Kept, want: LogFilter, follow: bool, reporter: Reporter
) -> int:
    """The current attempt's output so far and, with `follow`, until its nodes end."""
    record = kept.record
    nodes = record.nodes if follow else want.nodes(record)  # follow: the end needs all
    mirror = LogMirror(store.home / "logs", record.id, record.view.attempt)
    group, failures = connect_reachable([n.host for n in nodes], reporter.notice)
    try:
        with group:
            reachable = [n for n in nodes if n.host.name in group.transports]
            failures += drain(record, reachable, group, mirror, store)
            _print_mirror(nodes, mirror, want, reporter)
            if follow and not failures:
                return _follow(store, record, group, mirror, want, reporter, kept.acting)
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


def drain(
    record: JobRecord,
    nodes: list[NodeRecord],
    group: HostGroup,
    mirror: LogMirror,
    store: JobDB,
    idle_timeout: float = IDLE_TIMEOUT_S,
) -> list[OrchError]:
    """Copy what the hosts have beyond the local copy into it; note ended nodes.

    Returns:
        An error for each host that could not be read to the end.
    """
    watcher = Watcher(nodes, group.transports, mirror, once=True, idle_timeout=idle_timeout)
    failures: list[OrchError] = []
    try:
        for event in watcher.events():
            if not isinstance(event, NodeExit):
                continue
            if event.lost:
                failures.append(HostError(event.host, event.error or "lost while reading logs"))
            elif event.ended is not None:
                state = node_state(event.returncode, event.killed)
                store.update_node(record.id, event.host, state, event.returncode, event.reason)
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


def _follow(
    store: JobDB,
    record: JobRecord,
    group: HostGroup,
    mirror: LogMirror,
    want: LogFilter,
    reporter: Reporter,
    kept: bool = False,
) -> int:
    """Follow the job until it ends; `kept`: its keeper runs it (it stops and restarts
    the job: this follow only watches)."""
    fresh = store.get(record.id)
    if all(n.state.is_terminal() for n in fresh.nodes):
        return 0 if job_state([n.state for n in fresh.nodes]) is JobState.SUCCEEDED else 1
    try:
        filtered = FilteredReporter(reporter, want)
        return watch_job(
            fresh, group, filtered, store, mirror, attached=False, stop_others=not kept
        )
    except OrchError as exc:
        if exc.exit_code == 1:  # the job failed: its summary, then its exit code
            reporter.notice(exc.message)
            if kept:
                reporter.notice(
                    "the job's keeper starts it again if its restarts allow: following on"
                )
            return 1
        raise
