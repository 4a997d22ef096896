"""A Slurm job's outputs: one ORCH_OUTPUT_DIR on the shared home (`<job root>/outputs`),
which every node of the job writes into, copied back through the login node by the
same agent command and receiver as over SSH (reporting/receive.py): when an attached
submit's job ends (succeeded, failed or cancelled), on `orch kill`, and by `orch pull`.

The compute nodes share one directory, as SSH hosts sharing a home do: it comes back
once, into the target itself, whatever `outputs: {from: ...}` says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.agent.kernel.slurm import SLURM_DIR
from orchestrator.models.states import JobState
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.reporting.pull import Progress, PullReport
from orchestrator.reporting.receive import bring_back, pull
from orchestrator.slurm.login import LoginNode
from orchestrator.transport import ConnectOptions


def source(record: JobRecord, login: LoginNode) -> NodeRecord:
    """The login node as the one node to copy from: a job directory in the job root
    (its `slurm/`), whose output directory beside it is the job's."""
    root = str(record.spec["slurm"]["job_root"])
    return NodeRecord(login.host, 0, 0, 1, f"{root}/{SLURM_DIR}", JobState.RUNNING)


def _group(login: LoginNode) -> HostGroup:
    """A group of the login node over its connection that is already open."""
    group = HostGroup([login.host], ConnectOptions())
    group.transports[login.host.name] = login.transport
    return group


def bring_outputs(
    record: JobRecord, login: LoginNode, target: Path | None, notice: Callable[[str], None]
) -> None:
    """At the job's end: what its `outputs:` name, into `target` (default
    ./orch-outputs/ID); a failure is a notice, the job's own result stands."""
    bring_back(record, _group(login), [source(record, login)], target, notice)


def pull_outputs(
    record: JobRecord,
    login: LoginNode,
    target: Path,
    paths: Sequence[str],
    progress: Progress | None,
) -> list[PullReport]:
    """`orch pull`: what `paths` select (all when empty) into `target`.

    Raises:
        InputError: a path is not inside the output directory.
        HostError: the login node's agent failed.
    """
    return pull(record, _group(login), target, paths, [source(record, login)], progress)
