"""The Slurm backend: jobs on a Slurm cluster, through its login node; the work itself
is in slurm/. What it cannot do is refused from slurm/unsupported.py, before anything
is contacted."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.backends.base import CheckOptions, ExecOptions, GcOptions, PullBars
from orchestrator.models.inventory import Inventory
from orchestrator.models.job import JobSpec
from orchestrator.records.db import JobDB, JobRecord, new_job_id
from orchestrator.reporting.filters import LogFilter
from orchestrator.reporting.hosts import Environment, HostsView, PerHost, WarmInterpreter
from orchestrator.reporting.outcomes import GcOutcome, KillOutcome, WarmStart
from orchestrator.reporting.pull import PullReport
from orchestrator.reporting.reporter import Reporter
from orchestrator.slurm.unsupported import refuse

if TYPE_CHECKING:  # refused verbs' names: their modules are not imported to refuse them
    from orchestrator.bench.allreduce import AllreduceOptions, BenchListener, SizeResult
    from orchestrator.nodes.execute import HostRun
    from orchestrator.nodes.into import Forwarding, ForwardOptions, ShellOptions
    from orchestrator.reporting.check import CheckResult
    from orchestrator.reporting.stacks import StackOptions, StackView
    from orchestrator.reporting.top import TopView
    from orchestrator.ssh.plan import LaunchPlan

# Each verb imports the slurm/ modules of its own work, in its method: `orch kill --all`
# asks every backend to end its warm interpreters, and pays for none of Slurm's work.


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
        from orchestrator.slurm import submit as submitting

        sj = submitting.slurm_job(job, inventory, new_job_id(job.name))
        submitting.submit(sj, inventory.hosts[0], reporter, detach, JobDB(), outputs_dir)
        return sj.job_id

    def dry_run(self, job: JobSpec, inventory: Inventory) -> list[str]:
        from orchestrator.slurm import submit as submitting

        return submitting.dry_run(job, inventory)

    def plan(self, job: JobSpec, inventory: Inventory) -> LaunchPlan:
        refuse("plan", str(inventory.path))

    def status(
        self, record: JobRecord, store: JobDB, reporter: Reporter, thorough: bool = False
    ) -> JobRecord:
        from orchestrator.slurm import jobs

        return jobs.status(store, record, reporter.notice)

    def note(self, record: JobRecord) -> str:
        from orchestrator.slurm import jobs

        return jobs.note(record.spec)

    def places(self, records: Sequence[JobRecord], store: JobDB) -> dict[str, str]:
        return {}  # a pending Slurm job's reason is its note

    def logs(
        self, record: JobRecord, store: JobDB, want: LogFilter, follow: bool, reporter: Reporter
    ) -> int:
        from orchestrator.slurm import jobs

        return jobs.logs(record.id, reporter, want, follow, store)

    def kill(self, record: JobRecord, store: JobDB, reporter: Reporter) -> KillOutcome:
        from orchestrator.slurm import jobs

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
        from orchestrator.slurm import jobs, outputs

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
        from orchestrator.slurm import top

        return top.watch(store, record, reporter, interval_s, silent_s)

    def stack(
        self, record: JobRecord, store: JobDB, options: StackOptions, reporter: Reporter
    ) -> StackView:
        from orchestrator.slurm import stack

        return stack.take(store, record, options, reporter)

    def check(
        self, inventory: Inventory, job: JobSpec | None, options: CheckOptions, reporter: Reporter
    ) -> CheckResult:
        from orchestrator.reporting.check import CheckLine, CheckResult
        from orchestrator.slurm import check

        found = check.run_check(inventory, job, options.compute, reporter.notice)
        lines = tuple(CheckLine(line) for line in found.lines)
        return CheckResult(lines=lines, errors=tuple(found.errors), failed=bool(found.errors))

    def hosts(self, inventory: Inventory, reporter: Reporter) -> HostsView:
        from orchestrator.slurm import nodes

        return nodes.hosts(inventory, reporter.notice)

    def forward(self, record: JobRecord, options: ForwardOptions, reporter: Reporter) -> Forwarding:
        from orchestrator.slurm import into

        return into.forward(JobDB(), record, options, reporter)

    def shell(self, record: JobRecord, options: ShellOptions, reporter: Reporter) -> int:
        from orchestrator.slurm import into

        return into.shell(JobDB(), record, options, reporter)

    def exec_in_job(
        self, record: JobRecord, options: ExecOptions, reporter: Reporter
    ) -> list[HostRun]:
        from orchestrator.slurm import into

        return into.exec_in_job(JobDB(), record, options.command, reporter)

    def warm_start(
        self, job: JobSpec, inventory: Inventory, reporter: Reporter
    ) -> PerHost[WarmStart]:
        refuse("warm_start", str(inventory.path))

    def warm_list(
        self, inventory: Inventory, reporter: Reporter
    ) -> PerHost[tuple[WarmInterpreter, ...]]:
        refuse("warm_list", str(inventory.path))

    def warm_stop(self, inventory: Inventory, reporter: Reporter) -> PerHost[tuple[int, ...]]:
        refuse("warm_stop", str(inventory.path))

    def end_warm(self, records: Sequence[JobRecord], store: JobDB, reporter: Reporter) -> None:
        return  # none is kept: each job's ranks start cold in an allocation of its own

    def gc(
        self, inventory: Inventory, options: GcOptions, reporter: Reporter
    ) -> dict[str, GcOutcome]:
        refuse("gc", str(inventory.path))

    def envs(self, inventory: Inventory, reporter: Reporter) -> PerHost[tuple[Environment, ...]]:
        """The environments built on the login node, in the shared home every node runs
        its job's in."""
        from orchestrator.reporting.hosts import environments

        return environments(inventory.hosts[:1], reporter.notice)

    def exec(self, inventory: Inventory, options: ExecOptions, reporter: Reporter) -> list[HostRun]:
        refuse("exec", str(inventory.path))

    def bench_allreduce(
        self, inventory: Inventory, options: AllreduceOptions, listener: BenchListener
    ) -> list[SizeResult]:
        refuse("bench_allreduce", str(inventory.path))
