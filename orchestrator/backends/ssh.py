"""The SSH backend: the inventory's hosts, each reached over its own SSH connection
(or run locally); the work itself is in ssh/ (plan, submit, watch, logs, kill, top, pull,
check)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.backends.base import CheckOptions, ExecOptions, GcOptions, PullBars
from orchestrator.records.db import JobDB, JobRecord
from orchestrator.reporting.outcomes import GcOutcome
from orchestrator.transport import ConnectOptions

if TYPE_CHECKING:
    from orchestrator.bench.allreduce import AllreduceOptions, BenchListener, SizeResult
    from orchestrator.models.inventory import Inventory
    from orchestrator.models.job import JobSpec
    from orchestrator.nodes.execute import HostRun
    from orchestrator.nodes.into import Forwarding, ForwardOptions, ShellOptions
    from orchestrator.reporting.check import CheckResult
    from orchestrator.reporting.filters import LogFilter
    from orchestrator.reporting.hosts import Environment, HostsView, PerHost, WarmInterpreter
    from orchestrator.reporting.outcomes import KillOutcome, WarmStart
    from orchestrator.reporting.pull import PullReport
    from orchestrator.reporting.reporter import Reporter
    from orchestrator.reporting.stacks import StackOptions, StackView
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

        sub = submitting.prepare(_with_default_notify(job), inventory, outputs_dir, no_wait)
        submitting.submit(sub, reporter, detach=detach)
        return sub.job_id

    def dry_run(self, job: JobSpec, inventory: Inventory) -> list[str]:
        from orchestrator.ssh.plan import describe
        from orchestrator.sync.ignore import collect_files

        plan = self.plan(_with_default_notify(job), inventory)
        files = collect_files(plan.job.workdir, plan.job.exclude)  # and its ignore files read
        lines = [*describe(plan), "", f"pushes {len(files)} files from {plan.job.workdir}"]
        if plan.job.notify is not None:
            from orchestrator.agent.kernel.notify import is_webhook, redact

            target = redact(plan.job.notify) if is_webhook(plan.job.notify) else "a command"
            lines.append(
                f"notify: the job's end, failure, restarts and stalls go to {target} "
                "(attached: from here; detached: from its keeper on the master host)"
            )
        env = plan.job.environment
        if env is not None:
            source = f", installed from {env.wheels_said} with no index" if env.wheels else ""
            if env.download:
                source = (
                    ", installed with no index from wheels this machine downloads for the "
                    "hosts' platform and Python"
                )
            held = ", ".join(env.requirements) or "nothing more"
            lines.append(
                f"runs each node in its host's environment of {env.source} ({held}{source}), "
                "built where missing"
            )
        return lines

    def plan(self, job: JobSpec, inventory: Inventory) -> LaunchPlan:
        from orchestrator.ssh import submit as submitting

        return submitting.dry_run(submitting.prepare(job, inventory))

    def status(
        self, record: JobRecord, store: JobDB, reporter: Reporter, thorough: bool = False
    ) -> JobRecord:
        from orchestrator.ssh import reconcile

        return reconcile.status(store, record, reporter, thorough)

    def note(self, record: JobRecord) -> str:
        from orchestrator.ssh import keep

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

    def stack(
        self, record: JobRecord, store: JobDB, options: StackOptions, reporter: Reporter
    ) -> StackView:
        from orchestrator.ssh import stack

        return stack.take(store, record, options, reporter)

    def forward(self, record: JobRecord, options: ForwardOptions, reporter: Reporter) -> Forwarding:
        from orchestrator.nodes.into import Forwarding, running_node

        node = running_node(record, options.node, "orch forward")
        return Forwarding(node.host, options.port, options.local_port, reporter.notice)

    def shell(self, record: JobRecord, options: ShellOptions, reporter: Reporter) -> int:
        from orchestrator.nodes.into import shell

        return shell(record, options, reporter.notice)

    def exec_in_job(
        self, record: JobRecord, options: ExecOptions, reporter: Reporter
    ) -> list[HostRun]:
        from orchestrator.models.errors import ExecFailed
        from orchestrator.nodes.into import exec_in_job

        runs = exec_in_job(
            record,
            options.command,
            lambda host, line: reporter.output(host, None, (line + "\n").encode()),
            reporter.notice,
        )
        if any(not r.ok for r in runs):
            raise ExecFailed(runs)
        return runs

    def check(
        self, inventory: Inventory, job: JobSpec | None, options: CheckOptions, reporter: Reporter
    ) -> CheckResult:
        from orchestrator.ssh.check.run import run_check
        from orchestrator.ssh.check.view import check_result

        notice = ConnectOptions(notice=reporter.notice)
        return check_result(run_check(inventory, job, options.bandwidth, notice))

    def hosts(self, inventory: Inventory, reporter: Reporter) -> HostsView:
        from orchestrator.agent.kernel.lease_wire import printable
        from orchestrator.nodes.group import connect_reachable
        from orchestrator.nodes.warm import warm_rows
        from orchestrator.reporting.hosts import HostsView
        from orchestrator.ssh.queue import host_views, queue_rows, unit_rows
        from orchestrator.ssh.warmup import interpreter

        group, failures = connect_reachable(list(inventory.hosts), reporter.notice)
        with group:
            views, more = host_views(group)
            warm, _ = group.try_each(warm_rows)  # an older agent: none shown
        units, queue = [], []
        for host in inventory.hosts:
            if host.name in views:
                units += unit_rows(host, views[host.name])
                queue += queue_rows(host, views[host.name])
                for warning in views[host.name].warnings:
                    reporter.notice(f"warning: {printable(warning, 1000)} (host {host.name})")
        rows = (interpreter(name, row) for name, found in warm.items() for row in found)
        return HostsView(tuple(units), tuple(queue), tuple(rows), (*failures, *more))

    def warm_start(
        self, job: JobSpec, inventory: Inventory, reporter: Reporter
    ) -> PerHost[WarmStart]:
        from orchestrator.reporting.hosts import PerHost
        from orchestrator.ssh.warmup import warm_up  # with ssh/check/: for the probe

        return PerHost.of(*warm_up(job, inventory, reporter))

    def warm_list(
        self, inventory: Inventory, reporter: Reporter
    ) -> PerHost[tuple[WarmInterpreter, ...]]:
        from orchestrator.nodes import warm
        from orchestrator.reporting.hosts import PerHost
        from orchestrator.ssh.warmup import interpreter

        found, failures = warm.listing(list(inventory.hosts), reporter.notice)
        rows = {name: tuple(interpreter(name, r) for r in found[name]) for name in found}
        return PerHost.of(rows, failures)

    def warm_stop(self, inventory: Inventory, reporter: Reporter) -> PerHost[tuple[int, ...]]:
        from orchestrator.nodes import warm
        from orchestrator.reporting.hosts import PerHost

        stopped, failures = warm.stop(list(inventory.hosts), reporter.notice)
        return PerHost.of({name: tuple(pids) for name, pids in stopped.items()}, failures)

    def end_warm(self, records: Sequence[JobRecord], store: JobDB, reporter: Reporter) -> None:
        ahead = store.warm_hosts()  # where `orch warm JOB` started one before any job
        hosts = [n.host for r in records for n in r.nodes] + ahead
        if hosts:
            from orchestrator.nodes import warm

            stopped, _ = warm.stop(hosts, reporter.notice)
            store.forget_warm_hosts(h.name for h in ahead if h.name in stopped)

    def gc(
        self, inventory: Inventory, options: GcOptions, reporter: Reporter
    ) -> dict[str, GcOutcome]:
        from orchestrator.nodes import envs, warm
        from orchestrator.sync.gc import gc

        reports = gc(inventory, options.keep, reporter.notice, options.outputs)
        # Warm interpreters hold memory, not disk, but gc is where hosts are cleaned up.
        stopped, _ = warm.stop(list(inventory.hosts), reporter.notice)
        kept, _ = envs.listing(list(inventory.hosts), reporter.notice, envs.keep_days())
        return {
            host: GcOutcome(
                r.snapshots_removed,
                r.snapshots_kept,
                r.running,
                r.objects_removed,
                r.bytes_freed,
                r.outputs_removed,
                r.outputs_bytes_freed,
                len(stopped.get(host) or ()),
                len(kept[host].removed) if host in kept else 0,
            )
            for host, r in reports.items()
        }

    def envs(self, inventory: Inventory, reporter: Reporter) -> PerHost[tuple[Environment, ...]]:
        from orchestrator.reporting.hosts import environments

        return environments(list(inventory.hosts), reporter.notice)

    def exec(self, inventory: Inventory, options: ExecOptions, reporter: Reporter) -> list[HostRun]:
        from orchestrator.models.errors import ExecFailed
        from orchestrator.models.inventory import pick_hosts
        from orchestrator.nodes.execute import run_everywhere

        selected = pick_hosts(inventory, list(options.hosts), list(options.labels))
        runs = run_everywhere(
            selected,
            options.command,
            lambda host, line: reporter.output(host, None, (line + "\n").encode()),
            ConnectOptions(notice=reporter.notice),
        )
        if any(not r.ok for r in runs):
            raise ExecFailed(runs)
        return runs

    def bench_allreduce(
        self, inventory: Inventory, options: AllreduceOptions, listener: BenchListener
    ) -> list[SizeResult]:
        from orchestrator.bench.allreduce import run_allreduce

        return run_allreduce(inventory, options, listener, self.submit)


def _with_default_notify(job: JobSpec) -> JobSpec:
    """The job, with the user's default `notify:` (~/.config/orch/notify.yaml) where it
    has none of its own (models/notify.py)."""
    if job.notify is not None:
        return job
    from orchestrator.models.notify import default_notify

    return dataclasses.replace(job, notify=default_notify())
