"""A Slurm job's chain of attempts (`restarts:`), as the controller reads and stops it:
each attempt's record on the shared home, and `orch kill` / Ctrl-C, after which no
attempt starts. The chain itself runs on the cluster (agent/kernel/slurm_chain.py
says why a chain of batch jobs; agent/node/chain.py is its batch script's steps);
following it from one attempt to the next is restarts.py's."""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import replace
from typing import Any

from orchestrator.agent.kernel.slurm_chain import KILLED_MARK, attempt_record, state_word
from orchestrator.nodes.shell import sh_path
from orchestrator.records.db import JobRecord
from orchestrator.slurm.login import LoginNode
from orchestrator.slurm.queue import QueuedJob

log = logging.getLogger(__name__)


def job_root(record: JobRecord) -> str:
    return str(record.spec["slurm"]["job_root"])


def read_attempt(login: LoginNode, root: str, attempt: int) -> dict[str, Any] | None:
    """Attempt `attempt`'s record, or None while there is none."""
    text = login.read(f"{root}/{attempt_record(attempt)}")
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def stop_chain(record: JobRecord, login: LoginNode) -> None:
    """Before the current attempt is cancelled: mark the job killed on the shared home
    (a later attempt that starts anyway skips) and cancel the next attempt, queued
    behind this one, first: a cancelled job counts as failed to its dependency."""
    if not record.view.restarts:
        return
    root = job_root(record)
    found = read_attempt(login, root, record.view.attempt) or {}
    following = str(found.get("next") or "")
    cancel = f" && scancel {shlex.quote(following)}" if following.isdigit() else ""
    result = login.run(f": > {sh_path(root)}/{KILLED_MARK}{cancel}")
    if not result.ok:
        log.debug("[job=%s] stopping the chain: %s", record.id, result.stderr.strip())


def ended_attempt(record: JobRecord, login: LoginNode, found: QueuedJob) -> QueuedJob | None:
    """A job with restarts whose attempt squeue still calls COMPLETING, when its batch
    script has recorded its end: over, as that record says. Slurm holds a job
    COMPLETING while one of its nodes does not answer (a lost node) until it declares
    that node down, but the next attempt need not wait for that (node/chain.py: watch)."""
    if not record.view.restarts or state_word(found.slurm_state) != "COMPLETING":
        return None
    ended = read_attempt(login, job_root(record), record.view.attempt) or {}
    if "returncode" not in ended:
        return None
    word = "COMPLETED" if ended["returncode"] == 0 else "FAILED"
    return replace(found, slurm_state=word)
