"""What the Python API hands back: frozen snapshots, never the live records.

`JobStatus` is what `orch status` shows (and `--json` prints), `LogLine` one line of
what `orch logs` prints, `KillResult` what `orch kill` reports. Each is built from the
service layer's own result (a JobRecord, a KillOutcome) at the boundary, so that a
caller never holds, or changes, what the job store and the teardown work with.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from orchestrator.models.errors import OrchError
from orchestrator.models.states import STILL_RUNNING, JobState
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.reporting.outcomes import KillOutcome


class WaitTimeout(OrchError, TimeoutError):
    """`Job.wait(timeout)` ran out of time; the job goes on (as `subprocess`'s wait)."""


class LineKind(StrEnum):
    """Whose line it is."""

    RANK = "rank"  # a rank's output (its stdout and stderr, as its host's file holds them)
    NODE = "node"  # the node's torchrun's own output
    SETUP = "setup"  # the job's `setup:` on that host (an attached submit's only)


@dataclass(frozen=True)
class LogLine:
    """One line of a job's output, as `orch logs` prints it without its prefix.

    `text` has no newline and no colour codes; a progress bar's line (redrawn with
    `\\r`) is what a terminal would leave on screen: its last state.
    """

    host: str
    rank: int | None  # the global rank; None for the node's own (NODE, SETUP) lines
    kind: LineKind
    text: str

    def __str__(self) -> str:
        """The line as `orch logs` prints it: `[node2 r3] text`, `[node1] text`."""
        if self.kind is LineKind.SETUP:
            return f"[{self.host} setup] {self.text}"
        who = self.host if self.rank is None else f"{self.host} r{self.rank}"
        return f"[{who}] {self.text}"


@dataclass(frozen=True)
class NodeStatus:
    """One node of a job, as a row of `orch status JOB`."""

    host: str
    address: str
    node_rank: int
    ranks: range  # the global ranks it runs
    state: JobState
    exit_code: int | None = None  # torchrun's; negative: the signal that ended it
    error: str | None = None  # why the outcome is unknown (lost), where it is
    idle_s: float | None = None  # running: seconds since its ranks last printed (its host's clock)

    @property
    def signal(self) -> str | None:
        """The name of the signal that ended the node (`SIGKILL`), if one did."""
        if self.exit_code is None or self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return f"signal {-self.exit_code}"

    @property
    def still_running(self) -> bool:
        """A lost node found running after the job ended (behind a healed partition):
        `orch kill` stops it."""
        return self.error == STILL_RUNNING

    @classmethod
    def of(cls, node: NodeRecord) -> NodeStatus:
        return cls(
            node.host.name,
            node.host.address,
            node.node_rank,
            node.ranks,
            node.state,
            node.exit_code,
            node.error,
            node.idle_s,
        )


@dataclass(frozen=True)
class EarlierAttempt:
    """An attempt of a job with `restarts:` that ended and was followed by another."""

    attempt: int  # 0 for the first, as the ranks' ORCH_ATTEMPT
    nodes: Mapping[str, JobState] = field(hash=False)  # host -> how its node ended


@dataclass(frozen=True)
class JobStatus:
    """A job as `orch status` shows it, at the moment it was asked.

    `attempt` counts from 0 (the ranks' ORCH_ATTEMPT) up to `restarts`; `earlier` holds
    the attempts before it. `spec` is the job as recorded (`orch status --json`).
    """

    id: str
    name: str
    state: JobState
    exit_code: int | None
    created: float
    started: float | None
    ended: float | None
    duration: float | None  # seconds from start to end, or to now while it runs
    master_addr: str
    master_port: int | None
    nodes: tuple[NodeStatus, ...]
    attempt: int = 0
    restarts: int = 0
    earlier: tuple[EarlierAttempt, ...] = ()
    spec: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # What `orch status` adds to the state, from the job's backend: for a Slurm job,
    # ` (slurm 42, Resources)`, its Slurm id and why it waits or how Slurm ended it.
    note: str = ""

    @property
    def ok(self) -> bool:
        """Whether the job succeeded."""
        return self.state is JobState.SUCCEEDED

    @classmethod
    def of(cls, record: JobRecord, note: str = "") -> JobStatus:
        view = record.view
        earlier = tuple(
            EarlierAttempt(a.attempt, {str(n["host"]): JobState.parse(n["state"]) for n in a.nodes})
            for a in view.attempts
        )
        duration = None
        if record.started is not None:
            duration = (record.ended or time.time()) - record.started
        return cls(
            record.id,
            record.name,
            record.state,
            record.exit_code,
            record.created,
            record.started,
            record.ended,
            duration,
            record.master_addr,
            record.master_port,
            tuple(NodeStatus.of(n) for n in record.nodes),
            attempt=view.attempt,
            restarts=view.restarts,
            earlier=earlier,
            spec=dict(record.spec),
            note=note,
        )


class KilledProcess(NamedTuple):
    """A process `orch kill` signalled on a host."""

    pid: int  # in the host's own process table
    command: str  # its command line


@dataclass(frozen=True)
class KillResult:
    """What `orch kill` did to one job.

    `already` is the state of a job that had ended before: then nothing was touched.
    Hosts that could not be reached are in `unreachable` (their errors), not raised:
    the others were stopped all the same.
    """

    job_id: str
    already: JobState | None = None
    killed: Mapping[str, tuple[KilledProcess, ...]] = field(default_factory=dict, hash=False)
    port_free: bool | None = None  # whether the rendezvous port is free again (master)
    unreachable: tuple[OrchError, ...] = ()
    # What was done, in words, for a job that is not orch's to stop process by process
    # (a Slurm job: scancel, then gone from squeue).
    notes: tuple[str, ...] = ()

    @classmethod
    def of(cls, outcome: KillOutcome) -> KillResult:
        return cls(
            outcome.job_id,
            outcome.already,
            {
                host: tuple(KilledProcess(pid, cmd) for pid, cmd in procs)
                for host, procs in outcome.killed.items()
            },
            outcome.port_free,
            tuple(outcome.unreachable),
            tuple(outcome.notes),
        )
