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
    there, whether it started now (else one ran already), and what it imports (the
    job's `preload:`)."""

    pid: int
    started: bool
    imports: tuple[str, ...] = ()


@dataclass(frozen=True)
class GcOutcome:
    """What `orch gc` freed on one host (one name of those that share a store)."""

    snapshots_removed: int = 0
    snapshots_kept: int = 0
    running: int = 0  # jobs running there, whose code stays
    objects_removed: int = 0
    bytes_freed: int = 0
    outputs_removed: int = 0  # with `outputs`: ended jobs' output directories
    outputs_bytes_freed: int = 0
    warm_ended: int = 0  # warm interpreters ended (they hold memory, not disk)
    envs_removed: int = 0  # environments unused for ORCH_KEEP_ENVS_DAYS
