"""The Slurm backend: jobs on a Slurm cluster, through its login node; the work itself
is in slurm/. What it cannot do yet is refused from slurm/unsupported.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from orchestrator.backends.base import CheckView, HostsView, PullBars
from orchestrator.models.errors import OrchError
from orchestrator.models.inventory import Inventory
from orchestrator.models.job import JobSpec
from orchestrator.records.db import JobDB, JobRecord, new_job_id
from orchestrator.reporting.filters import LogFilter
from orchestrator.reporting.outcomes import KillOutcome, WarmStart
from orchestrator.reporting.pull import PullReport
from orchestrator.reporting.reporter import Reporter
from orchestrator.reporting.top import TopView
from orchestrator.slurm import check, jobs, nodes, outputs, top
from orchestrator.slurm import submit as submitting
from orchestrator.slurm.unsupported import refuse
from orchestrator.ssh.plan import LaunchPlan


class SlurmBackend:
    """Jobs on a Slurm cluster: sbatch through the login node, srun on the nodes."""

    name = "slurm"

    def submit(
        self,
        job: JobSpec,
        inventory: Inventory,
        reporter: Reporter,
        *,
        detach: bool = False,
        outputs_dir: Path | None = None,
        no_wait: bool = False,
    ) -> str:
        sj = submitting.slurm_job(job, inventory, new_job_id(job.name))
        submitting.submit(sj, inventory.hosts[0], reporter, detach, JobDB(), outputs_dir)
        return sj.job_id

    def dry_run(self, job: JobSpec, inventory: Inventory) -> list[str]:
        return submitting.dry_run(job, inventory)

    def plan(self, job: JobSpec, inventory: Inventory) -> LaunchPlan:
        refuse("plan", str(inventory.path))

    def status(
        self, record: JobRecord, store: JobDB, reporter: Reporter, thorough: bool = False
    ) -> JobRecord:
        return jobs.status(store, record, reporter.notice)

    def note(self, record: JobRecord) -> str:
        return jobs.note(record.spec)

    def places(self, records: Sequence[JobRecord], store: JobDB) -> dict[str, str]:
        return {}  # a pending Slurm job's reason is its note

    def logs(
        self, record: JobRecord, store: JobDB, want: LogFilter, follow: bool, reporter: Reporter
    ) -> int:
        return jobs.logs(record.id, reporter, want, follow, store)

    def kill(self, record: JobRecord, store: JobDB, reporter: Reporter) -> KillOutcome:
        return KillOutcome(record.id, notes=jobs.kill(record.id, reporter, store))

    def pull(
        self,
        record: JobRecord,
        target: Path,
        paths: Sequence[str],
        every_node: bool | None,
        reporter: Reporter,
        bars: PullBars,
    ) -> list[PullReport]:
        with jobs.connected(record, reporter.notice) as login:
            return bars(
                lambda progress: outputs.pull_outputs(record, login, target, paths, progress)
            )

    def top(
        self,
        record: JobRecord,
        store: JobDB,
        reporter: Reporter,
        interval_s: float,
        silent_s: float,
    ) -> Iterator[TopView]:
        return top.watch(store, record, reporter, interval_s, silent_s)

    def check(
        self,
        inventory: Inventory,
        job: JobSpec | None,
        view: CheckView,
        *,
        bandwidth: bool = False,
        compute: bool = False,
    ) -> bool:
        found = check.run_check(inventory, job, compute, view.notice)
        view.findings(found.lines, found.errors)
        return bool(found.errors)

    def hosts(self, inventory: Inventory, reporter: Reporter) -> HostsView:
        units, queue, errors = nodes.hosts(inventory, reporter.notice)
        return HostsView(units, queue, errors)

    def warm(
        self, job: JobSpec, inventory: Inventory, reporter: Reporter
    ) -> tuple[dict[str, WarmStart], list[OrchError]]:
        refuse("warm", str(inventory.path))
