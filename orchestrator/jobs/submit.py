"""`orch submit`: plan -> connect -> probe -> push -> start -> watch.

Nothing here prints: what the user should see goes through a Reporter, which the CLI
implements. Errors are raised as OrchError subclasses and mapped to exit codes there.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.check.run import preflight
from orchestrator.jobs.reporter import ProgressReporter, Reporter
from orchestrator.jobs.teardown import teardown
from orchestrator.jobs.watch import watch_job
from orchestrator.models.errors import Interrupted, OrchError
from orchestrator.models.inventory import (
    Host,
    resolve_inventory,
)
from orchestrator.models.job import JobSpec, load_job
from orchestrator.models.states import JobState
from orchestrator.nodes import ops
from orchestrator.nodes.group import HostGroup
from orchestrator.plan import LaunchPlan, build_plan, select_hosts, static_master_addr
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.records.logmirror import LogMirror
from orchestrator.sync.manifest import Tree, scan_workdir
from orchestrator.sync.push import push
from orchestrator.sync.store import setup_key
from orchestrator.transport import ConnectOptions, Transport

log = logging.getLogger(__name__)


def new_job_id(name: str) -> str:
    """A short id that reads well in prefixes and commands: `digits-3fa9c2`."""
    return f"{name}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Submission:
    job: JobSpec
    hosts: Sequence[Host]
    job_id: str


def prepare(job_path: Path, inventory_path: Path | None) -> Submission:
    """Load and check everything that needs no host: job, inventory, selection."""
    job = load_job(job_path)
    inventory = resolve_inventory(inventory_path, job.inventory)
    hosts = select_hosts(job, inventory)
    return Submission(job, hosts, new_job_id(job.name))


def dry_run(sub: Submission) -> LaunchPlan:
    """The plan as far as it is known without touching any host."""
    master = sub.hosts[0]
    master_addr = static_master_addr(master) or f"<address of {master.address}>"
    return build_plan(sub.job, sub.hosts, sub.job_id, master_addr, sub.job.rendezvous_port)


def submit(
    sub: Submission, reporter: Reporter, detach: bool = False, store: JobDB | None = None
) -> int:
    """Run a job on its hosts and, unless detached, stream its output until it ends.

    Returns:
        0 when every node succeeded (or, detached, once every node started).

    Raises:
        InfraError: a host is unreachable or unusable; nothing was started anywhere.
        JobFailed: a node failed; the job was stopped on every node.
        Interrupted: Ctrl-C; the job was stopped on every node.
    """
    store = store or JobDB()
    tree = scan_workdir(sub.job.workdir, sub.job.exclude)
    options = ConnectOptions(notice=reporter.notice)
    with HostGroup(sub.hosts, options) as group:
        group.connect()
        log.info("connected to %d hosts", len(sub.hosts))
        plan = _plan_with_facts(sub, group)
        log.info(
            "probed %d hosts; master %s:%s", len(sub.hosts), plan.master_addr, plan.master_port
        )
        # Recorded before anything starts, so that `orch kill` can always find the job.
        store.add(record_of(plan))
        reporter.job_started(plan.job_id)
        nodes = {n.host.name: n for n in plan.nodes}
        log.info(
            "pushing %d files (%d kB) to %d hosts",
            len(tree.entries),
            tree.total_bytes // 1024,
            len(nodes),
        )

        def start(host: Host, transport: Transport) -> None:
            ops.start(nodes[host.name], transport)
            store.update_node(plan.job_id, host.name, JobState.RUNNING)

        try:
            push_code(plan, group, tree, reporter)
            group.each(start)
            log.info("started torchrun on %d hosts", len(nodes))
        except OrchError:
            teardown(plan.job_id, plan.master_port, plan.nodes, group, reporter)
            store.update_job(plan.job_id, JobState.FAILED)
            raise
        except KeyboardInterrupt:
            teardown(plan.job_id, plan.master_port, plan.nodes, group, reporter)
            store.update_job(plan.job_id, JobState.KILLED)
            raise Interrupted(
                "interrupted while starting the job; stopped it on every host"
            ) from None
        store.update_job(plan.job_id, JobState.RUNNING)
        if detach:
            return 0
        mirror = LogMirror(store.home / "logs", plan.job_id)
        try:
            return watch_job(store.get(plan.job_id), group, reporter, store, mirror, attached=True)
        finally:
            mirror.close()


def record_of(plan: LaunchPlan) -> JobRecord:
    """The job record of a plan, before any node started."""
    job = plan.job
    spec = {
        "path": job.path,
        "entry": job.entry,
        "args": list(job.args),
        "workdir": str(job.workdir),
    }
    nodes = [NodeRecord(n.host, n.node_rank, n.first_rank, n.nproc, n.job_dir) for n in plan.nodes]
    return JobRecord(
        plan.job_id, job.name, JobState.PENDING, plan.master_addr, plan.master_port, spec, nodes
    )


def _plan_with_facts(sub: Submission, group: HostGroup) -> LaunchPlan:
    """Probe the hosts and run check's blocking checks; refuse on any error found.

    Raises:
        HostError / MultiHostError: python or torch missing on a host.
        PreflightError: what `orch check` reports as errors (exit 3, same messages).
    """
    checked = preflight(sub.job, sub.hosts, group)
    for warning in checked.warnings:
        group.options.notice(f"warning: {warning.message}")
    return build_plan(
        sub.job, sub.hosts, sub.job_id, checked.master_addr, checked.port, checked.facts
    )


# ---------------------------------------------------------------- code push


def push_code(plan: LaunchPlan, group: HostGroup, tree: Tree, reporter: Reporter) -> None:
    """Build the job's code snapshot on every node, then run its `setup:` where it has
    not yet run for this setup text and code version. Nothing is started here.

    Raises:
        HostError / MultiHostError: a push or a setup failed, naming each such host.
        InfraError: a file changed while it was being pushed.
    """
    nodes = {n.host.name: n for n in plan.nodes}
    script = plan.job.setup
    keys = {
        name: setup_key(script, tree.digest, node.host.python)
        for name, node in nodes.items()
        if script
    }
    progress = reporter.progress if isinstance(reporter, ProgressReporter) else None
    results = push(group, tree, {name: n.job_dir for name, n in nodes.items()}, keys, progress)
    log.info(
        "pushed %s",
        ", ".join(
            f"{r.files_sent} files ({r.wire_bytes // 1024} kB) to {h}" for h, r in results.items()
        ),
    )
    if not script:
        return
    cached = [name for name, result in results.items() if result.setup_done]
    todo = [name for name in results if name not in cached]
    if cached:
        reporter.notice(f"setup: cached on {', '.join(cached)} (same setup and code ran there)")
    if not todo:
        return
    reporter.notice(f"setup: running on {', '.join(todo)}")

    def run_setup(host: Host, transport: Transport) -> None:
        def line(text: str) -> None:
            reporter.output(f"{host.name} setup", None, (text + "\n").encode())

        ops.setup(nodes[host.name], transport, script, keys[host.name], tree.digest, line)

    group.each(run_setup, only=todo)
