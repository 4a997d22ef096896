"""A Slurm job with `restarts:` from the controller's side: following it from one
attempt to the next, and bringing a detached job's record up to the attempt its chain
has reached. The chain runs on the cluster without the controller (chain.py, and
agent/kernel/slurm_chain.py for why a chain of batch jobs); this module only reads it.

Each attempt is one Slurm job. When an attempt ends in a state a restart follows
(FAILED, NODE_FAIL ...) and its record names the next attempt's Slurm job, the job's
record moves on to that attempt exactly as over SSH (`orch status` shows "attempt 2 of
3 (attempt 1 failed on node3)", `orch logs` each attempt under its marker, ORCH_ATTEMPT
counts from 0): the ended attempt's nodes go into spec["attempts"], with their logs
in the attempt's own local copy.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from orchestrator.agent.kernel.layout import EXIT
from orchestrator.agent.kernel.slurm import expand_nodelist, node_dir_name
from orchestrator.agent.kernel.slurm_chain import (
    attempt_dir,
    culprits,
    restartable,
    state_word,
    usable,
)
from orchestrator.models.errors import Interrupted, JobFailed, OrchError
from orchestrator.models.states import JobState
from orchestrator.nodes.shell import sh_path
from orchestrator.records.db import JobDB, JobRecord
from orchestrator.records.logmirror import LogMirror
from orchestrator.reporting.follow import IDLE_TIMEOUT_S, Watcher
from orchestrator.reporting.reporter import Reporter, phase
from orchestrator.slurm.chain import job_root, read_attempt, stop_chain
from orchestrator.slurm.follow import POLL_S, follow_job, nodes_of, note_slurm, slurm_id_of
from orchestrator.slurm.login import LoginNode
from orchestrator.slurm.queue import map_state

log = logging.getLogger(__name__)


def follow_attempts(
    record: JobRecord, login: LoginNode, reporter: Reporter, store: JobDB, attached: bool
) -> int:
    """follow_job, attempt after attempt, while the job's chain restarts it.

    Returns:
        0 when an attempt succeeded.

    Raises:
        JobFailed: the last attempt failed (its failure), or one ended in a way no
            restart follows (TIMEOUT, CANCELLED ...).
        Interrupted: Ctrl-C on an attached submit; no attempt runs or follows.
    """
    while True:
        mirror = LogMirror(store.home / "logs", record.id, record.view.attempt)
        try:
            return follow_job(record, login, reporter, store, mirror, attached)
        except JobFailed:
            try:
                following = next_attempt(store, store.get(record.id), login, reporter)
            except KeyboardInterrupt:
                if not attached:
                    raise
                stop_chain(store.get(record.id), login)
                store.update_job(record.id, JobState.KILLED, 1)
                raise Interrupted(
                    f"job {record.id} interrupted between attempts: the next one cancelled"
                ) from None
            if following is None:
                raise
            record = following
        finally:
            mirror.close()


def next_attempt(
    store: JobDB, record: JobRecord, login: LoginNode, reporter: Reporter
) -> JobRecord | None:
    """Once the current attempt ended: the record moved on to the next attempt, which
    Slurm has queued or started; None when no attempt follows (none left, a kill, an
    end no restart follows, or the next attempt skipped)."""
    view = record.view
    if view.attempt >= view.restarts or record.state is JobState.KILLED:
        return None
    root = job_root(record)
    ended = read_attempt(login, root, view.attempt) or {}
    state = _ended_state(record, login, store)
    following = str(ended.get("next") or "")
    if not restartable(state) or not following:
        if ended.get("next_error"):
            reporter.notice(f"warning: {ended['next_error']}")
        return None
    nodes = attempt_nodes(record, login, ended, state)
    failed = sorted(h for h, s in nodes.items() if s in (JobState.FAILED, JobState.LOST))
    lost = failed and all(nodes[h] is JobState.LOST for h in failed)
    excluded = sorted({*(ended.get("excluded") or []), *(h for h in failed if lost)})
    reporter.notice(
        f"attempt {view.attempt + 1} {'lost' if lost else 'failed'} on "
        f"{', '.join(failed) or 'its nodes'} (slurm {state}): starting the job again as "
        f"attempt {view.attempt + 2} of {view.restarts + 1}, Slurm job {following}"
        + (f", leaving out {', '.join(excluded)}" if excluded else "")
    )
    begun = _wait_for_next(login, root, view.attempt + 1, following, reporter)
    if begun is not None and begun.get("skipped"):
        reporter.notice(f"attempt {view.attempt + 2} did not start: {begun['skipped']}")
        return None
    return advance(store, record, login, following, nodes)


def sync_chain(store: JobDB, record: JobRecord, login: LoginNode) -> JobRecord:
    """A job whose attempts went on without this controller (detached, or its submit
    gone): its record moved on to the latest attempt the chain started or queued,
    each ended attempt's logs copied into its local copy."""
    while record.view.restarts and record.view.attempt < record.view.restarts:
        root, view = job_root(record), record.view
        ended = read_attempt(login, root, view.attempt) or {}
        following = str(ended.get("next") or "")
        if not following:
            break
        begun = read_attempt(login, root, view.attempt + 1)
        if begun is not None and begun.get("skipped"):
            break
        if begun is None:  # queued behind the current attempt: only once that failed
            found = login.squeue([following]).get(following)
            if found is None or not found.allocated:
                break
            state = _ended_state(record, login, store)
            if not restartable(state):
                break
        else:
            state = _ended_state(record, login, store)
        record = advance(
            store, record, login, following, attempt_nodes(record, login, ended, state)
        )
    return record


def advance(
    store: JobDB,
    record: JobRecord,
    login: LoginNode,
    following: str,
    nodes: dict[str, JobState],
) -> JobRecord:
    """Move the record on to the next attempt (Slurm job `following`), the ended one's
    nodes kept in spec["attempts"] and its logs in its local copy."""
    view = record.view
    names = list(nodes)
    _keep_logs(record, login, store, ",".join(names))
    info = record.spec["slurm"]
    ended = {
        "attempt": view.attempt,
        "nodelist": ",".join(names) or info.get("nodelist") or "",
        "slurm_id": info.get("job_id"),
        "nodes": [
            {
                "host": name,
                "node_rank": rank,
                "job_dir": f"{job_root(record)}/{attempt_dir(node_dir_name(name), view.attempt)}",
                "state": nodes[name].value,
                "exit_code": None,
                "error": None,
            }
            for rank, name in enumerate(names)
        ],
    }
    spec = {"attempt": view.attempt + 1}
    store.restart(JobRecord(record.id, record.name, JobState.PENDING, "", None, spec, []))
    attempts = [*store.get(record.id).spec.get("attempts", [])[:-1], ended]
    slurm = {**info, "job_id": following, "nodelist": "", "state": "PENDING", "reason": ""}
    store.update_spec(record.id, attempts=attempts, slurm=slurm)
    return store.get(record.id)


def _ended_state(record: JobRecord, login: LoginNode, store: JobDB) -> str:
    """Slurm's word for how the current attempt's job ended (FAILED, NODE_FAIL ...)."""
    noted = str(record.spec["slurm"].get("state") or "")
    if noted and map_state(noted).is_terminal():
        return state_word(noted)
    found = login.query(slurm_id_of(record), job_root(record))
    if found is None:
        return state_word(noted)
    note_slurm(store, record, state=found.slurm_state)
    return state_word(found.slurm_state)


def attempt_nodes(
    record: JobRecord, login: LoginNode, ended: dict[str, Any], state: str
) -> dict[str, JobState]:
    """How each node of the ended attempt ended, in node-rank order: the node it
    failed on `failed` (`lost` where Slurm took the node out, or ended the job for a
    node), the others stopped with it (`killed`)."""
    nodelist = str(ended.get("nodelist") or record.spec["slurm"].get("nodelist") or "")
    names = expand_nodelist(nodelist)
    if not names:
        return {}
    down = _unusable(login, names)
    if down:  # Slurm took nodes out: those were lost, the others stopped with them
        return {n: JobState.LOST if n in down else JobState.KILLED for n in names}
    failed = ended.get("failed")
    if not isinstance(failed, list):  # its batch script did not live to say
        failed = culprits(_exits(login, record, names))
    lost = state == "NODE_FAIL"
    return {
        n: (JobState.LOST if lost else JobState.FAILED) if n in failed else JobState.KILLED
        for n in names
    }


def _exits(login: LoginNode, record: JobRecord, names: list[str]) -> dict[str, Any]:
    """Each node's exit record of the current attempt; None where it wrote none (the
    marks the follow leaves for a node Slurm stopped count as none)."""
    root, attempt = job_root(record), record.view.attempt
    files = " ".join(
        f"{sh_path(root)}/{attempt_dir(node_dir_name(n), attempt)}/{EXIT}" for n in names
    )
    result = login.run(f'for f in {files}; do cat "$f" 2>/dev/null || printf null; echo; done')
    lines = result.stdout.splitlines()
    exits: dict[str, Any] = {}
    for name, line in zip(names, lines + ["null"] * len(names), strict=False):
        try:
            found = json.loads(line)
        except ValueError:
            found = None
        stopped = isinstance(found, dict) and str(found.get("error", "")).startswith("stopped by")
        exits[name] = None if stopped or not isinstance(found, dict) else found
    return exits


def _unusable(login: LoginNode, names: list[str]) -> set[str]:
    """Which of these nodes Slurm now calls down, drained or not responding."""
    result = login.run(f"sinfo --noheader --Node --nodes={','.join(names)} --format='%N %t'")
    states = dict(line.split(None, 1) for line in result.stdout.splitlines() if " " in line)
    return {name for name, state in states.items() if not usable(state.strip())}


def _wait_for_next(
    login: LoginNode, root: str, attempt: int, slurm_id: str, reporter: Reporter
) -> dict[str, Any] | None:
    """Until the next attempt's batch script has begun (its record), or its job is
    gone without one; while it waits in Slurm's queue, why."""
    while True:
        begun = read_attempt(login, root, attempt)
        if begun is not None:
            return begun
        found = login.squeue([slurm_id]).get(slurm_id)
        if found is None or not found.allocated:
            return read_attempt(login, root, attempt)
        reason = f": {found.reason}" if found.reason not in ("", "None") else ""
        phase(reporter, f"attempt {attempt + 1}: {found.slurm_state.lower()}{reason}")
        time.sleep(POLL_S)


def _keep_logs(record: JobRecord, login: LoginNode, store: JobDB, nodelist: str) -> None:
    """The current attempt's logs into its local copy, as far as the shared home has
    them (what an attached follow saw is there already)."""
    nodes = nodes_of(record, login.host, nodelist)
    if not nodes:
        return
    mirror = LogMirror(store.home / "logs", record.id, record.view.attempt)
    transports = {n.host.name: login.transport for n in nodes}
    watcher = Watcher(nodes, transports, mirror, once=True, idle_timeout=IDLE_TIMEOUT_S)
    try:
        for _event in watcher.events():
            pass
    except OrchError as exc:
        log.info("[job=%s] logs of attempt %d: %s", record.id, record.view.attempt, exc.message)
    finally:
        watcher.close()
        mirror.close()
