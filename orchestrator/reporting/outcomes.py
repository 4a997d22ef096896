"""What a verb did to one job, as both backends say it."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.models.errors import OrchError
from orchestrator.models.states import JobState


@dataclass
class KillOutcome:
    """What `orch kill` did to one job."""

    job_id: str
    already: JobState | None = None  # the job had ended before: nothing to do
    killed: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    port_free: bool | None = None
    unreachable: list[OrchError] = field(default_factory=list)
    # What was done, in words, where the job is not orch's to stop process by process
    # (a Slurm job: scancel, then gone from squeue).
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class WarmStart:
    """What `orch warm JOB` did on one host: the pid of the job's warm interpreter
    there, and whether it started now (else one ran already)."""

    pid: int
    started: bool
