"""Stopping a job: on failure, on Ctrl-C, and `orch kill`.

The host side decides what to signal (agent `kill`); this side picks the nodes,
reaches them in parallel and records what happened.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from functools import partial

from orchestrator.agent.kernel.replies import KillReport
from orchestrator.models.errors import HostError, Interrupted
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState
from orchestrator.nodes import ops
from orchestrator.nodes.group import HostGroup, connect_reachable
from orchestrator.nodes.ops import NodeRef
from orchestrator.records.db import JobDB, JobRecord
from orchestrator.reporting.outcomes import KillOutcome
from orchestrator.reporting.reporter import Reporter
from orchestrator.ssh import keep
from orchestrator.ssh.pull import bring_outputs
from orchestrator.transport.base import Transport

log = logging.getLogger(__name__)
STOPPED_LATER = "lost; stopped later"  # a lost node's error, once it was stopped there
CTRL_C_SEEN_S = 0.05  # the longest a Ctrl-C may wait to be seen, while a stop is waited for


def teardown(
    job_id: str,
    port: int | None,
    nodes: Sequence[NodeRef],
    group: HostGroup,
    reporter: Reporter,
    grace_s: float = ops.KILL_GRACE_S,
) -> dict[str, KillReport]:
    """Stop the job on these nodes (on reachable hosts); report failures, never raise:
    the error that led here is already on its way.

    Returns:
        Each reached host's kill report.
    """
    reachable = [n for n in nodes if n.host.name in group.transports]
    master = nodes[0].host.name if nodes and nodes[0].node_rank == 0 else None

    def kill(host: Host, transport: Transport) -> KillReport:
        node = next(n for n in reachable if n.host.name == host.name)
        return ops.kill(node, transport, job_id, grace_s, port if host.name == master else None)

    results, failures = group.try_each(kill, only=[n.host.name for n in reachable])
    for name, report in results.items():
        log.debug("[job=%s host=%s] kill took %s", job_id, name, report.seconds)
    for failure in failures:
        reporter.notice(f"could not stop the job there: {failure.message}")
    return results


def stop_interrupted(
    job_id: str,
    port: int | None,
    nodes: Sequence[NodeRef],
    group: HostGroup,
    reporter: Reporter,
    settle: Callable[[], bool] = lambda: False,
) -> None:
    """Ctrl-C on an attached submit: stop the job on every host. A second Ctrl-C skips
    the ranks' grace period (KILL at once); a third leaves without waiting.

    1. The graceful stop runs in a thread of its own, and this one waits for it: a
       Ctrl-C cuts short the wait, never the stop's calls to the hosts.
    2. The forced stop (second Ctrl-C) runs here, then the graceful one is waited for
       again: its agent `kill` on a host waits out the grace for ranks the forced one
       has just killed, so it ends within a poll. Leaving before it has would leave
       orch's own command running on that host.

    Args:
        settle: waits for the starts under way at Ctrl-C; True when there were any,
            and the job is stopped again (one may have begun since).

    Raises:
        Interrupted: a third Ctrl-C; the job may still run, and the record is left
            as it was for `orch kill` to finish.
    """
    grace_s = ops.KILL_GRACE_S
    try:
        graceful = _Beside(partial(teardown, job_id, port, nodes, group, reporter, grace_s))
        try:
            reporter.notice(
                "interrupted: stopping the job on every host "
                "(Ctrl-C again to skip the grace period)"
            )
            graceful.wait()
        except KeyboardInterrupt:
            grace_s = 0.0
            reporter.notice(
                "interrupted again: killing the job's processes now "
                "(Ctrl-C again to leave without waiting)"
            )
            teardown(job_id, port, nodes, group, reporter, grace_s)
            graceful.wait()
        if settle():
            teardown(job_id, port, nodes, group, reporter, grace_s)
    except KeyboardInterrupt:
        raise Interrupted(
            f"job {job_id} interrupted; left before it was stopped on every host",
            f"stop it: orch kill {job_id}",
        ) from None


class _Beside:
    """`work` run in a daemon thread (one that a third Ctrl-C may leave behind)."""

    def __init__(self, work: Callable[[], object]) -> None:
        self._done = threading.Event()
        self._error: Exception | None = None
        threading.Thread(target=self._run, args=(work,), name="graceful-stop", daemon=True).start()

    def _run(self, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception as exc:  # raised again by `wait`, in the thread that asked
            self._error = exc
        finally:
            self._done.set()

    def wait(self) -> None:
        """Until `work` has returned or raised (raised again here); a Ctrl-C cuts it
        short. In slices: a SIGINT that lands just before a blocking wait begins is
        seen only when it ends."""
        while not self._done.wait(CTRL_C_SEEN_S):
            pass
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def kill(store: JobDB, record: JobRecord, reporter: Reporter) -> KillOutcome:
    """`orch kill` of one job: stop it on every host, bring its `outputs:` back."""
    # A detached job's keeper first: it stops its nodes and never restarts them.
    record = keep.sync(store, record, reporter, stop=True).record
    outcome = KillOutcome(record.id)
    nodes = record.nodes
    if record.state.is_terminal():
        # An ended job may still have processes on a host that vanished and came back.
        nodes = [n for n in record.nodes if n.state is JobState.LOST]
        if not nodes:
            outcome.already = record.state
            return outcome
    group, failures = connect_reachable([n.host for n in nodes], reporter.notice)
    log.info("[job=%s] connected to %d hosts", record.id, len(group.transports))
    with group:
        reports = teardown(record.id, record.master_port, nodes, group, reporter)
        bring_outputs(record, group, None, reporter.notice)
    log.info("[job=%s] stopped on %d hosts", record.id, len(reports))
    outcome.unreachable = failures
    changes: dict[str, tuple[JobState, int | None, str | None]] = {}
    for name, report in reports.items():
        outcome.killed[name] = [(int(pid), str(cmd)) for pid, cmd in report.killed]
        if report.port_free is not None:
            outcome.port_free = report.port_free
        changes[name] = (JobState.KILLED, None, None)
    for failure in failures:
        if isinstance(failure, HostError):
            changes[failure.host] = (JobState.LOST, None, "host not answering at kill")
    store.update_nodes(record.id, changes)
    if not record.state.is_terminal():
        store.update_job(record.id, JobState.KILLED, 1)
    return outcome
