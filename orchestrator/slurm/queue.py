"""Slurm's answers read into orch's terms: job states, squeue/sacct/sinfo lines. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass

from orchestrator.models.states import JobState

# What `squeue --format` and `sacct --format` are asked for, in this order, `|`-separated.
SQUEUE_FORMAT = "%i|%T|%r|%N|%P"
SACCT_FIELDS = "JobID,State,ExitCode,NodeList,Partition"
SINFO_FORMAT = "%P|%D|%a|%T"

_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
_FAILED = {
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "SPECIAL_EXIT",
    "REVOKED",
}


def map_state(slurm_state: str) -> JobState:
    """orch's state for a Slurm job state (`CANCELLED by 1000` reads as CANCELLED):
    PENDING -> pending, RUNNING -> running, COMPLETED -> succeeded, FAILED, TIMEOUT,
    NODE_FAIL, OUT_OF_MEMORY, PREEMPTED ... -> failed, CANCELLED -> killed."""
    word = slurm_state.strip().split(" ", 1)[0].rstrip("+").upper()
    if word in _PENDING:
        return JobState.PENDING
    if word in _RUNNING:
        return JobState.RUNNING
    if word == "COMPLETED":
        return JobState.SUCCEEDED
    if word == "CANCELLED":
        return JobState.KILLED
    if word in _FAILED:
        return JobState.FAILED
    return JobState.UNKNOWN


@dataclass(frozen=True)
class QueuedJob:
    """One Slurm job as squeue (or sacct, or the batch script's exit record) tells it."""

    slurm_id: str
    slurm_state: str  # Slurm's word: PENDING, RUNNING, COMPLETED, TIMEOUT ...
    reason: str = ""  # why it waits (Priority, Resources), or "None"
    nodelist: str = ""  # compressed: node[2-4]
    partition: str = ""
    exit_code: int | None = None

    @property
    def state(self) -> JobState:
        return map_state(self.slurm_state)

    @property
    def allocated(self) -> bool:
        """The allocation exists: pending, running or still completing."""
        return self.state in (JobState.PENDING, JobState.RUNNING)

    @property
    def cause(self) -> str | None:
        """For a failed job, Slurm's state as the cause (TIMEOUT, NODE_FAIL ...)."""
        return self.slurm_state.split(" ", 1)[0] if self.state is JobState.FAILED else None


def parse_squeue(text: str) -> dict[str, QueuedJob]:
    """`squeue --noheader --format=SQUEUE_FORMAT` output, by Slurm job id."""
    jobs = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5 or not fields[0]:
            continue
        slurm_id, state, reason, nodes, partition = fields
        jobs[slurm_id] = QueuedJob(slurm_id, state, reason, nodes, partition)
    return jobs


def parse_sacct(text: str, slurm_id: str) -> QueuedJob | None:
    """The job's own line of `sacct --noheader --parsable2 --format=SACCT_FIELDS`."""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5 or fields[0] != slurm_id:
            continue
        _, state, exit_code, nodes, partition = fields
        code = exit_code.split(":", 1)[0]
        return QueuedJob(
            slurm_id, state, "", nodes, partition, int(code) if code.isdigit() else None
        )
    return None


def from_exit_record(text: str | None, slurm_id: str) -> QueuedJob | None:
    """Where accounting is off and squeue has forgotten the job: the batch script's own
    record of how srun ended (slurm/exit-<id>.json), if it got to write one."""
    if not text:
        return None
    try:
        code = int(json.loads(text)["returncode"])
    except (ValueError, KeyError, TypeError):
        return None
    return QueuedJob(slurm_id, "COMPLETED" if code == 0 else "FAILED", exit_code=code)


@dataclass(frozen=True)
class Partition:
    """One partition as sinfo shows it."""

    name: str
    nodes: int
    available: bool  # up
    default: bool


def parse_sinfo(text: str) -> dict[str, Partition]:
    """`sinfo --noheader --format=SINFO_FORMAT` output (a line per partition and node
    state), summed per partition. The default partition's name ends in `*` there."""
    found: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or not fields[1].isdigit():
            continue
        raw, count, avail, _state = fields
        name = raw.rstrip("*")
        before = found.get(name)
        found[name] = Partition(
            name,
            int(count) + (before.nodes if before else 0),
            avail == "up",
            raw.endswith("*") or bool(before and before.default),
        )
    return found
