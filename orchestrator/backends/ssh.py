"""The SSH backend: the inventory's hosts, each reached over its own SSH connection
(or run locally); the work itself is in ssh/ (plan, submit, watch, logs, kill, top, pull,
check)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.backends.base import CheckView, HostsView, PullBars
from orchestrator.records.db import JobDB, JobRecord
from orchestrator.ssh import keep, reconcile
from orchestrator.transport import ConnectOptions

if TYPE_CHECKING:
    from orchestrator.models.errors import OrchError
    from orchestrator.models.inventory import Inventory
    from orchestrator.models.job import JobSpec
    from orchestrator.reporting.filters import LogFilter
    from orchestrator.reporting.outcomes import KillOutcome, WarmStart
    from orchestrator.reporting.pull import PullReport
    from orchestrator.reporting.reporter import Reporter
    from orchestrator.reporting.top import TopView
    from orchestrator.ssh.plan import LaunchPlan

# Each command imports the modules of its own work, in its method: `orch kill` or
# `orch status` pays for no log filter, pull, top, lease view or ignore-file parser.


class SshBackend:
    """Jobs on the inventory's hosts: torchrun started on each over SSH."""

    name = "ssh"

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
        from orchestrator.ssh import submit as submitting  # with ssh/check/: for submit only

        sub = submitting.prepare(job, inventory, outputs_dir, no_wait)
        submitting.submit(sub, reporter, detach=detach)
        return sub.job_id

    def dry_run(self, job: JobSpec, inventory: Inventory) -> list[str]:
        from orchestrator.ssh.plan import describe
        from orchestrator.sync.ignore import collect_files

        plan = self.plan(job, inventory)
        files = collect_files(plan.job.workdir, plan.job.exclude)  # and its ignore files read
        return [*describe(plan), "", f"pushes {len(files)} files from {plan.job.workdir}"]

    def plan(self, job: JobSpec, inventory: Inventory) -> LaunchPlan:
        from orchestrator.ssh import submit as submitting

        return submitting.dry_run(submitting.prepare(job, inventory))

    def status(
        self, record: JobRecord, store: JobDB, reporter: Reporter, thorough: bool = False
    ) -> JobRecord:
        return reconcile.status(store, record, reporter, thorough)

    def note(self, record: JobRecord) -> str:
        return keep.note(record)

    def places(self, records: Sequence[JobRecord], store: JobDB) -> dict[str, str]:
        from orchestrator.ssh.queue import positions

        return positions([r.id for r in records], store)

    def logs(
        self, record: JobRecord, store: JobDB, want: LogFilter, follow: bool, reporter: Reporter
    ) -> int:
        from orchestrator.ssh.logs import logs

        return logs(store, record.id, want, follow, reporter)

    def kill(self, record: JobRecord, store: JobDB, reporter: Reporter) -> KillOutcome:
        from orchestrator.ssh import teardown

        return teardown.kill(store, record, reporter)

    def pull(
        self,
        record: JobRecord,
        target: Path,
        paths: Sequence[str],
        every_node: bool | None,
        reporter: Reporter,
        bars: PullBars,
    ) -> list[PullReport]:
        from orchestrator.nodes.group import HostGroup
        from orchestrator.reporting.receive import pull
        from orchestrator.ssh.pull import sources

        nodes = sources(record, every_node)
        with HostGroup([n.host for n in nodes], ConnectOptions(notice=reporter.notice)) as group:
            group.connect()
            return bars(lambda progress: pull(record, group, target, paths, nodes, progress))

    def top(
        self,
        record: JobRecord,
        store: JobDB,
        reporter: Reporter,
        interval_s: float,
        silent_s: float,
    ) -> Iterator[TopView]:
        from orchestrator.ssh import top

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
        probing = "probing the job's hosts" if job else f"probing {len(inventory.hosts)} hosts"
        with view.probing(probing):
            from orchestrator.ssh.check.run import run_check

            report = run_check(inventory, job, bandwidth, ConnectOptions(notice=view.notice))
        view.report(report)
        return bool(report.errors)

    def hosts(self, inventory: Inventory, reporter: Reporter) -> HostsView:
        from orchestrator.agent.kernel.lease_wire import printable
        from orchestrator.nodes.group import connect_reachable
        from orchestrator.nodes.warm import warm_interpreters
        from orchestrator.ssh.queue import host_views, queue_rows, unit_rows

        group, failures = connect_reachable(list(inventory.hosts), reporter.notice)
        with group:
            views, more = host_views(group)
            warm, _ = group.try_each(warm_interpreters)  # an older agent: none shown
        found = HostsView(errors=[*failures, *more])
        found.warm = [{"host": name, **row} for name, rows in warm.items() for row in rows]
        for host in inventory.hosts:
            if host.name in views:
                found.units += unit_rows(host, views[host.name])
                found.queue += queue_rows(host, views[host.name])
                for warning in views[host.name].warnings:
                    reporter.notice(f"warning: {printable(warning, 1000)} (host {host.name})")
        return found

    def warm(
        self, job: JobSpec, inventory: Inventory, reporter: Reporter
    ) -> tuple[dict[str, WarmStart], list[OrchError]]:
        from orchestrator.ssh.warmup import warm_up  # with ssh/check/: for the probe

        return warm_up(job, inventory, reporter)
