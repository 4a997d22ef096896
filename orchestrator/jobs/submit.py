"""`orch submit`: plan -> connect -> probe -> push -> start -> watch.

Nothing here prints: what the user should see goes through a Reporter, which the CLI
implements. Errors are raised as OrchError subclasses and mapped to exit codes there.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.check.run import preflight
from orchestrator.jobs.pull import bring_outputs
from orchestrator.jobs.reporter import ProgressReporter, Reporter
from orchestrator.jobs.teardown import teardown
from orchestrator.jobs.watch import watch_job
from orchestrator.models.errors import (
    HostError,
    Interrupted,
    JobFailed,
    OrchError,
    RemoteCommandError,
)
from orchestrator.models.inventory import (
    Host,
    resolve_inventory,
)
from orchestrator.models.job import JobSpec, load_job
from orchestrator.models.states import JobState
from orchestrator.nodes import ops
from orchestrator.nodes.group import HostGroup
from orchestrator.plan import (
    LaunchPlan,
    NodeLaunch,
    build_plan,
    fs_groups,
    select_hosts,
    static_master_addr,
)
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.records.logmirror import LogMirror
from orchestrator.sync.manifest import Tree, scan_workdir
from orchestrator.sync.push import PushResult, Relay, push
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
    outputs_dir: Path | None = None  # where `outputs:` go (default ./orch-outputs/ID)


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
    port = sub.job.rendezvous_port
    # Only what the inventory says of shared filesystems: finding out takes a probe.
    shared = fs_groups(sub.hosts, {})
    return build_plan(sub.job, sub.hosts, sub.job_id, master_addr, port, shared=shared)


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
            _start(nodes[host.name], transport)
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
            code = watch_job(store.get(plan.job_id), group, reporter, store, mirror, attached=True)
        except JobFailed:
            bring_outputs(store.get(plan.job_id), group, sub.outputs_dir, reporter.notice)
            raise
        finally:
            mirror.close()
        bring_outputs(store.get(plan.job_id), group, sub.outputs_dir, reporter.notice)
        return code


def record_of(plan: LaunchPlan) -> JobRecord:
    """The job record of a plan, before any node started."""
    job = plan.job
    spec = {
        "path": job.path,
        "entry": job.entry,
        "args": list(job.args),
        "workdir": str(job.workdir),
        "outputs": list(job.outputs),
        "outputs_from": job.outputs_from,
    }
    nodes = [
        NodeRecord(
            replace(n.host, lost_after=job.lost_after or n.host.lost_after),
            n.node_rank,
            n.first_rank,
            n.nproc,
            n.job_dir,
        )
        for n in plan.nodes
    ]
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
        sub.job,
        sub.hosts,
        sub.job_id,
        checked.master_addr,
        checked.port,
        checked.facts,
        checked.shared,
    )


def _start(node: NodeLaunch, transport: Transport) -> None:
    """Start a node; where it was to share another's snapshot and that is not there,
    say that the inventory's `shared_fs:` is wrong."""
    try:
        ops.start(node, transport)
    except RemoteCommandError as exc:
        if node.snapshot_host == node.host.name or node.host.shared_fs is None:
            raise
        raise HostError(
            node.host.name,
            f"the job's code is not on {node.host.name}: the inventory says its workdir "
            f"{node.host.workdir} is on the filesystem of {node.snapshot_host} "
            f"(shared_fs: {node.host.shared_fs}), where it was pushed",
            f"correct shared_fs: for {node.host.name}, or leave it out for orch to find out",
        ) from exc


# ---------------------------------------------------------------- code push


def push_code(plan: LaunchPlan, group: HostGroup, tree: Tree, reporter: Reporter) -> None:
    """Build the job's code snapshot on every node, then run its `setup:` where it has
    not yet run for this setup text and code version. Nothing is started here.

    Nodes whose hosts share a filesystem share one snapshot: the code goes to the
    first of them, and setup runs there once (once per interpreter).

    Raises:
        HostError / MultiHostError: a push or a setup failed, naming each such host.
        InfraError: a file changed while it was being pushed.
    """
    snapshots = plan.snapshots()
    script = plan.job.setup
    keys = {
        n.host.name: setup_key(script, tree.digest, n.host.python) for n in plan.nodes if script
    }
    progress = reporter.progress if isinstance(reporter, ProgressReporter) else None
    results = push(
        group,
        tree,
        {name: nodes[0].snapshot_dir for name, nodes in snapshots.items()},
        keys,
        progress,
        shares={name: nodes[0].shares for name, nodes in snapshots.items() if nodes[0].shares},
        # The other hosts fetch from the master, at the address their ranks reach it.
        relay=Relay(plan.master.snapshot_host, plan.master_addr),
    )
    log.info(
        "pushed %s",
        ", ".join(
            f"{r.files_sent} files ({r.wire_bytes // 1024} kB) to {h}" for h, r in results.items()
        ),
    )
    relayed = {h: r for h, r in results.items() if r.relayed}
    if relayed:
        log.info(
            "relayed %s",
            ", ".join(
                f"{r.relayed} files ({r.relayed_bytes // 1024} kB) to {h}"
                for h, r in relayed.items()
            ),
        )
    for name, nodes in snapshots.items():
        if len(nodes) > 1:
            others = ", ".join(n.host.name for n in nodes[1:])
            reporter.notice(f"code: {others} share the filesystem of {name}: one copy for all")
    if script:
        _run_setup(plan, group, snapshots, keys, results, tree.digest, reporter)


def _run_setup(
    plan: LaunchPlan,
    group: HostGroup,
    snapshots: dict[str, tuple[NodeLaunch, ...]],
    keys: dict[str, str],
    results: dict[str, PushResult],
    digest: str,
    reporter: Reporter,
) -> None:
    """Run `setup:` once per snapshot and interpreter (in turn where a snapshot needs
    several: never twice at once in one directory), where it has not run yet."""
    cached, reused = [], []
    todo: dict[str, list[NodeLaunch]] = {}
    for name, nodes in snapshots.items():
        runs: dict[str, str] = {}  # setup key -> the node that runs it
        for node in nodes:
            key = keys[node.host.name]
            if key in runs:
                reused.append(f"{node.host.name} uses {runs[key]}'s")
            elif node is nodes[0] and results[name].setup_done:
                cached.append(name)
            else:
                todo.setdefault(name, []).append(node)
            runs.setdefault(key, node.host.name)
    if cached:
        reporter.notice(f"setup: cached on {', '.join(cached)} (same setup and code ran there)")
    if reused:
        reporter.notice(f"setup: {'; '.join(reused)} (one filesystem)")
    if not todo:
        return
    reporter.notice(
        f"setup: running on {', '.join(n.host.name for ns in todo.values() for n in ns)}"
    )
    script = plan.job.setup
    assert script is not None

    def run_setup(host: Host, _transport: Transport) -> None:
        for node in todo[host.name]:

            def line(text: str, name: str = node.host.name) -> None:
                reporter.output(f"{name} setup", None, (text + "\n").encode())

            transport = group.transports[node.host.name]
            ops.setup(node, transport, script, keys[node.host.name], digest, line)

    group.each(run_setup, only=todo)
