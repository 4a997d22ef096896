"""Following a Slurm job: its wait in the queue, then every rank's output, then its end.

The ranks' log files are on the shared home, in each node's directory under the job
root; the host agent's `follow` streams them from the login node, one channel per node
on the login node's one connection, exactly as it does for SSH hosts (so `Watcher`,
the log mirror and the `[node r3]` prefixes are the same). A node's stream ends once
its launcher wrote `exit.json`. A launcher Slurm killed outright (kill-on-bad-exit,
scancel past KillWait) writes none: once squeue shows the allocation gone, this
module writes the missing records, so each stream drains what is left and ends.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.agent.kernel.slurm import expand_nodelist, node_dir_name
from orchestrator.agent.kernel.slurm_chain import attempt_dir
from orchestrator.models.errors import InfraError, Interrupted, JobFailed
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState, node_state
from orchestrator.nodes.shell import sh_path
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.records.logmirror import LogMirror
from orchestrator.reporting.failure import TAIL_LINES, failure_summary
from orchestrator.reporting.follow import NodeExit, Notice, Output, Watcher
from orchestrator.reporting.reporter import Reporter, phase
from orchestrator.slurm.chain import ended_attempt, stop_chain
from orchestrator.slurm.failures import ended_by_slurm, slurm_ending
from orchestrator.slurm.login import LoginNode
from orchestrator.slurm.queue import QueuedJob
from orchestrator.transport import ConnectOptions, Transport, open_transport

log = logging.getLogger(__name__)
# squeue, while the job waits or runs. Not more often: squeue every 0.1 s after sbatch
# held the job's start back by about 2 s on the test cluster (slurmctld answers each
# query under its job lock), and the ranks print nothing for a second or more anyway.
POLL_S = 0.5
NOTICE_EVERY_S = 30.0  # a pending job's reason again, when stderr is no terminal


def slurm_id_of(record: JobRecord) -> str:
    """The Slurm job id of a Slurm job's record.

    Raises:
        InfraError: the record has none (sbatch never answered).
    """
    slurm_id = (record.view.own or {}).get("job_id")
    if not slurm_id:
        raise InfraError(
            f"job {record.id} never got a Slurm job id (sbatch did not answer)",
            "look for it with squeue on the login node",
        )
    return str(slurm_id)


def note_slurm(store: JobDB, record: JobRecord, **changes: object) -> None:
    """Merge `changes` into the job's Slurm details, in the store and in `record`."""
    info = {**store.get(record.id).spec.get("slurm", {}), **changes}
    store.update_spec(record.id, slurm=info)
    record.spec["slurm"] = info


def nodes_of(record: JobRecord, login: Host, nodelist: str) -> list[NodeRecord]:
    """The job's nodes in node-rank order (SLURM_NODEID follows the node list's order),
    each reached through the login node, in its directory of the job root."""
    info = record.spec["slurm"]
    nproc, root = int(info["nproc"]), str(info["job_root"])
    return [
        NodeRecord(
            replace(login, name=name),
            rank,
            rank * nproc,
            nproc,
            f"{root}/{attempt_dir(node_dir_name(name), record.view.attempt)}",
            JobState.RUNNING,
        )
        for rank, name in enumerate(expand_nodelist(nodelist))
    ]


def wait_until_started(
    record: JobRecord, login: LoginNode, reporter: Reporter, store: JobDB
) -> QueuedJob:
    """While Slurm holds the job in its queue: one status line of its state, reason and
    wait. Returns once it runs, or has ended.

    Raises:
        InfraError: Slurm knows nothing of the job.
    """
    slurm_id, root = slurm_id_of(record), str(record.spec["slurm"]["job_root"])
    started, said, said_at = time.monotonic(), "", 0.0
    while True:
        found = login.query(slurm_id, root)
        if found is None:
            raise InfraError(
                f"Slurm has no job {slurm_id} (orch job {record.id}) on {login.host.name}",
                "it may have ended long ago; its logs: orch logs " + record.id,
            )
        if found.state is not JobState.PENDING:
            return found
        waited = time.monotonic() - started
        line = "pending" + (f": {found.reason}" if found.reason not in ("", "None") else "")
        phase(reporter, f"{line} (waited {waited:.0f} s)")
        if line != said or time.monotonic() - said_at > NOTICE_EVERY_S:
            reporter.notice(f"slurm job {slurm_id} {line}")
            said, said_at = line, time.monotonic()
        time.sleep(POLL_S)


@dataclass
class _End:
    """How the Slurm job ended, once squeue (or sacct, or the exit record) says so."""

    found: QueuedJob | None = None


def follow_job(
    record: JobRecord,
    login: LoginNode,
    reporter: Reporter,
    store: JobDB,
    mirror: LogMirror,
    attached: bool,
) -> int:
    """Wait for the job to start, stream every rank's output until the allocation is
    gone, and say how it ended.

    Args:
        attached: the submit that queued it: Ctrl-C cancels the job (else it only stops
            following).

    Returns:
        0 when the job succeeded.

    Raises:
        JobFailed: a rank failed (the failing node, rank and its last lines) or Slurm
            ended the job (TIMEOUT, NODE_FAIL, CANCELLED ...).
        Interrupted: Ctrl-C on an attached submit; the allocation is gone.
    """
    try:
        found = wait_until_started(record, login, reporter, store)
        if found.state is JobState.RUNNING:
            store.update_job(record.id, JobState.RUNNING)
        if found.nodelist:  # for orch logs, once squeue has forgotten the job
            note_slurm(store, record, nodelist=found.nodelist, state=found.slurm_state)
        nodes = nodes_of(record, login.host, found.nodelist)
        if nodes:
            login.prepare_node_dirs(
                str(record.spec["slurm"]["job_root"]),
                [n.host.name for n in nodes],
                record.view.attempt,
            )
        end, exits, tails = _stream(record, nodes, login, reporter, mirror)
    except KeyboardInterrupt:
        if not attached:
            raise
        reporter.notice("interrupted: cancelling the Slurm job (scancel)")
        cancel(record, login, store)
        raise Interrupted(
            f"job {record.id} interrupted: Slurm job {slurm_id_of(record)} cancelled, "
            "its allocation gone"
        ) from None
    return conclude(record, nodes, end, exits, tails, store)


def _stream(
    record: JobRecord,
    nodes: list[NodeRecord],
    login: LoginNode,
    reporter: Reporter,
    mirror: LogMirror,
) -> tuple[_End, dict[str, NodeExit], dict[tuple[str, int | None], deque[bytes]]]:
    """Every node's output until each stream ended, squeue polled beside it."""
    transports: dict[str, Transport] = {n.host.name: login.transport for n in nodes}
    end = _End()
    stop = threading.Event()
    poller = threading.Thread(
        target=_poll_end, args=(record, nodes, login, end, stop), daemon=True, name="slurm-poll"
    )
    watcher = Watcher(nodes, transports, mirror, reconnect=_reconnect(login, transports))
    poller.start()
    exits: dict[str, NodeExit] = {}
    tails: dict[tuple[str, int | None], deque[bytes]] = {}
    try:
        for event in watcher.events():
            if isinstance(event, Notice):
                reporter.notice(event.message)
            elif isinstance(event, Output):
                tail = tails.setdefault((event.host, event.rank), deque(maxlen=TAIL_LINES))
                tail.extend(event.data.split(b"\n")[-TAIL_LINES - 1 : -1])
                reporter.output(event.host, event.rank, event.data)
            elif isinstance(event, NodeExit):
                exits[event.host] = event
    finally:
        stop.set()
        watcher.close()
        poller.join()
    if end.found is None:  # every node ended before squeue said so: until it does
        slurm_id, root = slurm_id_of(record), str(record.spec["slurm"]["job_root"])
        login.wait_gone(slurm_id, root)
        end.found = login.query(slurm_id, root)
    return end, exits, tails


def _poll_end(
    record: JobRecord,
    nodes: list[NodeRecord],
    login: LoginNode,
    end: _End,
    stop: threading.Event,
) -> None:
    """Until the allocation is gone: then the nodes whose launcher wrote no exit record
    (Slurm killed it) get one, so that their streams drain and end."""
    slurm_id, root = slurm_id_of(record), str(record.spec["slurm"]["job_root"])
    while not stop.wait(POLL_S):
        try:
            found = login.query(slurm_id, root)
        except Exception:  # the connection: the watcher reconnects; try again
            log.debug("[job=%s] squeue failed", record.id, exc_info=True)
            continue
        if found is not None and found.allocated:
            found = ended_attempt(record, login, found)  # restarts: over, Slurm still busy
            if found is None:
                continue
        end.found = found
        state = found.slurm_state if found else "gone from the queue"
        mark = json.dumps({"returncode": -9, "error": f"stopped by Slurm ({state})"})
        for node in nodes:
            exit_file = f"{sh_path(node.job_dir)}/exit.json"
            login.run(f"[ -e {exit_file} ] || echo {shlex.quote(mark)} > {exit_file}")
        return


def _reconnect(login: LoginNode, transports: dict[str, Transport]) -> Callable[[Host], Transport]:
    """A fresh connection to the login node for a node's stream that went silent."""

    def fresh(host: Host) -> Transport:
        transport = open_transport(login.host, ConnectOptions(connect_timeout=3.0))
        transport.connect()
        transports[host.name] = transport
        login.transport = transport  # squeue and scancel go over it too from now on
        return transport

    return fresh


def conclude(
    record: JobRecord,
    nodes: list[NodeRecord],
    end: _End,
    exits: dict[str, NodeExit],
    tails: dict[tuple[str, int | None], deque[bytes]],
    store: JobDB,
) -> int:
    """Record how the job ended; 0 when it succeeded.

    Raises:
        JobFailed: naming the first node that failed, its rank and last lines; or
            Slurm's own word (TIMEOUT, CANCELLED ...) when no rank failed.
    """
    for node in nodes:
        ended = exits.get(node.host.name)
        if ended is not None:
            node.state = node_state(ended.returncode, ended.killed)
            node.exit_code = ended.returncode
    found = end.found
    slurm_state = found.slurm_state if found else "UNKNOWN"
    state = found.state if found else JobState.UNKNOWN
    failed = [e for e in exits.values() if not e.ok and not e.killed]
    if state is JobState.SUCCEEDED and not failed:
        store.update_job(record.id, JobState.SUCCEEDED, 0)
        note_slurm(store, record, state=slurm_state)
        return 0
    final = JobState.KILLED if state is JobState.KILLED else JobState.FAILED
    store.update_job(record.id, final, 1)
    note_slurm(store, record, state=slurm_state)
    first = _first_failure(failed)
    if first is not None and final is JobState.FAILED and not ended_by_slurm(slurm_state):
        record.nodes = nodes
        raise JobFailed(failure_summary(record, first, tails), f"all output: orch logs {record.id}")
    stopped = [  # the nodes whose launcher never said how it ended: Slurm stopped them
        name
        for name, e in exits.items()
        if e.ended is not None and str(e.ended.error or "").startswith("stopped by Slurm")
    ]
    slurm_id = slurm_id_of(record)
    output = f"{record.spec['slurm']['job_root']}/slurm/batch-{slurm_id}.out"
    raise JobFailed(*slurm_ending(record.id, final.value, slurm_id, slurm_state, stopped, output))


def _first_failure(failed: list[NodeExit]) -> NodeExit | None:
    """The node whose ranks failed first: an exit code of its own before one Slurm's
    kill gave it, then the earliest."""

    def order(e: NodeExit) -> tuple[int, float]:
        own = e.returncode is not None and e.returncode > 0
        return (0 if own else 1, (e.ended.ended or 0.0) if e.ended else float("inf"))

    return min(failed, key=order) if failed else None


def cancel(record: JobRecord, login: LoginNode, store: JobDB) -> bool:
    """scancel the job, marking its nodes killed first; True once squeue shows its
    allocation gone."""
    slurm_id, root = slurm_id_of(record), str(record.spec["slurm"]["job_root"])
    stop_chain(record, login)  # restarts: no later attempt starts after this
    found = login.squeue([slurm_id]).get(slurm_id)
    if found is not None and found.nodelist:
        names = expand_nodelist(found.nodelist)
        attempt = record.view.attempt
        marks = " ".join(
            f"{sh_path(root)}/{attempt_dir(node_dir_name(n), attempt)}/killed" for n in names
        )
        login.run(f'for f in {marks}; do [ -d "${{f%/killed}}" ] && : > "$f"; done; true')
    login.scancel(slurm_id)
    gone = login.wait_gone(slurm_id, root)
    store.update_job(record.id, JobState.KILLED, 1)
    note_slurm(store, record, state="CANCELLED")
    return gone
