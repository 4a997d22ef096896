"""`orch submit`: plan -> connect -> probe -> push -> start -> watch.

Nothing here prints: what the user should see goes through a Reporter, which the CLI
implements. Errors are raised as OrchError subclasses and mapped to exit codes there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.agent.kernel import placement
from orchestrator.agent.kernel.lease_wire import LeaseStart
from orchestrator.agent.kernel.placement import restart_delay
from orchestrator.models.clocks import HostClock
from orchestrator.models.environment import WheelTarget
from orchestrator.models.errors import (
    HostError,
    InfraError,
    InputError,
    Interrupted,
    JobFailed,
    OrchError,
    RemoteCommandError,
)
from orchestrator.models.inventory import Host, Inventory, pick_hosts
from orchestrator.models.job import JobSpec
from orchestrator.models.states import JobState
from orchestrator.nodes import ops
from orchestrator.nodes.group import HostGroup
from orchestrator.nodes.into import open_forwards
from orchestrator.records.db import JobDB, JobRecord, NodeRecord, new_job_id
from orchestrator.records.logmirror import LogMirror
from orchestrator.reporting.notify import JobNotify
from orchestrator.reporting.reporter import ProgressReporter, Reporter, phase
from orchestrator.ssh.check.run import preflight
from orchestrator.ssh.environment import ensure_environment
from orchestrator.ssh.keep import start_keeper
from orchestrator.ssh.plan import (
    LaunchPlan,
    NodeLaunch,
    build_plan,
    fs_groups,
    select_hosts,
    static_master_addr,
)
from orchestrator.ssh.pull import bring_outputs
from orchestrator.ssh.queue import start_nodes
from orchestrator.ssh.teardown import stop_interrupted, teardown
from orchestrator.ssh.watch import watch_job
from orchestrator.sync.manifest import Tree, scan_workdir
from orchestrator.sync.push import PushResult, push
from orchestrator.sync.relay import Relay
from orchestrator.sync.store import environment_digest_of, setup_inputs_digest, setup_key
from orchestrator.sync.wheels import carried, downloaded
from orchestrator.transport import ConnectOptions, Transport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submission:
    job: JobSpec
    hosts: Sequence[Host]
    job_id: str
    outputs_dir: Path | None = None  # where `outputs:` go (default ./orch-outputs/ID)
    # Every host the job's selection matches, in order: `hosts` first; the others are
    # spares that a restart may take in place of a host that failed or went silent.
    candidates: Sequence[Host] = ()
    no_wait: bool = False  # GPUs or slots held: fail at once (QueueBusy), not wait in line


def prepare(
    job: JobSpec, inventory: Inventory, outputs_dir: Path | None = None, no_wait: bool = False
) -> Submission:
    """Check everything that needs no host: the job's selection of the inventory's hosts
    (and, for a job with restarts, the spares a restart may take)."""
    hosts = select_hosts(job, inventory)
    candidates = pick_hosts(inventory, job.hosts, job.labels) if job.restarts else hosts
    return Submission(job, hosts, new_job_id(job.name), outputs_dir, candidates, no_wait)


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
    """Run a job on its hosts and, unless detached, stream its output until it ends;
    when a node fails or is lost, start it again as the job's `restarts:` allow.

    Returns:
        0 when every node succeeded (or, detached, once every node started).

    Raises:
        InfraError: a host is unreachable or unusable; nothing was started anywhere.
        JobFailed: a node failed; the job was stopped on every node.
        Interrupted: Ctrl-C; the job was stopped on every node.
    """
    store = store or JobDB()
    tree = carried(sub.job, scan_workdir(sub.job.workdir, sub.job.exclude))
    environment_digest_of(sub.job, tree)  # `wheels:` that carry none: refused before any host
    if detach or sub.job.notify is None:  # a detached job's keeper tells its events
        return _attempts(sub, tree, reporter, detach, store, None)
    word = JobNotify(sub.job.notify, sub.job_id, reporter)
    try:
        code = _attempts(sub, tree, reporter, detach, store, word)
    except OrchError as exc:
        recorded = _recorded(store, sub.job_id)
        if recorded is not None:  # it started: its end is word; a refusal before is not
            state = recorded.state.value if recorded.state.is_terminal() else "failed"
            word.ended(state, exc.exit_code, [exc.message])  # its hint: the "more:" line
        raise
    word.ended("succeeded", code, [])
    return code


def _attempts(
    sub: Submission,
    tree: Tree,
    reporter: Reporter,
    detach: bool,
    store: JobDB,
    word: JobNotify | None,
) -> int:
    """The job's attempts, one after another as its restarts allow (`submit`)."""
    hosts, attempt = list(sub.hosts), 0
    while True:
        try:
            return _attempt(sub, hosts, attempt, tree, reporter, detach, store, word)
        except _Restart as restart:
            hosts, attempt = restart.hosts, attempt + 1
            delay = restart_delay(attempt)
            when = f"in {delay:.0f} s" if delay else "now"
            reporter.notice(
                f"{restart.reason}: starting the job again {when} as attempt "
                f"{attempt + 1} of {sub.job.restarts + 1}, on {', '.join(h.name for h in hosts)}"
            )
            if word is not None:
                word.restarted(restart.reason, attempt + 1)
            try:
                time.sleep(delay)
            except KeyboardInterrupt:
                raise Interrupted("interrupted before the job started again") from None


def _killed(store: JobDB, job_id: str) -> bool:
    """Whether `orch kill` ended the job (its record says so)."""
    recorded = _recorded(store, job_id)
    return recorded is not None and recorded.state is JobState.KILLED


def _recorded(store: JobDB, job_id: str) -> JobRecord | None:
    try:
        return store.get(job_id)
    except InputError:  # never recorded: refused before anything started
        return None


class _Restart(Exception):
    """The attempt failed and the job starts again, on `hosts`."""

    def __init__(self, hosts: list[Host], reason: str) -> None:
        super().__init__(reason)
        self.hosts, self.reason = hosts, reason


def next_hosts(
    current: Sequence[Host], candidates: Sequence[Host], bad: set[str], lost: set[str]
) -> list[Host] | None:
    """The hosts of the next attempt, by the rule a detached job's keeper follows too
    (agent/placement.py: `next_hosts`); None when too few are left."""
    by_name = {h.name: h for h in [*candidates, *current]}
    names = placement.next_hosts([h.name for h in current], [h.name for h in candidates], bad, lost)
    return None if names is None else [by_name[n] for n in names]


def _attempt(
    sub: Submission,
    hosts: list[Host],
    attempt: int,
    tree: Tree,
    reporter: Reporter,
    detach: bool,
    store: JobDB,
    word: JobNotify | None = None,
) -> int:
    """One start of the job on `hosts`: probe, push, start, follow; `word` hears of a
    stall.

    Raises:
        _Restart: it failed, and the job's restarts allow another attempt.
    """
    options = ConnectOptions(notice=reporter.notice)
    with HostGroup(hosts, options) as group:
        phase(reporter, f"connecting to {_count(hosts, 'host')}")
        group.connect()
        log.info("connected to %d hosts", len(hosts))
        phase(reporter, f"checking {_count(hosts, 'host')}")
        plan, clocks, targets = plan_with_facts(sub, group, hosts, attempt)
        log.info("probed %d hosts; master %s:%s", len(hosts), plan.master_addr, plan.master_port)
        # `wheels: download`: here, before anything is recorded or started anywhere.
        tree = downloaded(sub.job, tree, targets, reporter.notice)
        # Recorded before anything starts, so that `orch kill` can always find the job.
        if attempt == 0:
            store.add(record_of(plan))
            reporter.job_started(plan.job_id)
        else:
            store.restart(record_of(plan))
        # Which node failed first is told on the hosts' clocks, through these (watch.py).
        store.update_spec(plan.job_id, clocks={h: c.to_json() for h, c in clocks.items()})
        nodes = {n.host.name: n for n in plan.nodes}
        log.info(
            "pushing %d files (%d kB) to %d hosts",
            len(tree.entries),
            tree.total_bytes // 1024,
            len(nodes),
        )

        def start(host: Host, transport: Transport) -> LeaseStart:
            started = _start(nodes[host.name], transport)
            store.update_node(plan.job_id, host.name, JobState.RUNNING)
            return started

        try:
            phase(reporter, f"pushing {tree.total_bytes / 1e6:.1f} MB of code")
            plan = push_code(plan, group, tree, reporter)
            nodes = {n.host.name: n for n in plan.nodes}
            if _killed(store, plan.job_id):  # `orch kill` while it was pushed or built
                raise JobFailed(f"job {plan.job_id} was killed before it started", "")
            phase(reporter, f"starting {_count(plan.nodes, 'node')}")
            queued = start_nodes(plan, group, reporter, store, start, sub.no_wait, detach)
            if not queued:
                log.info("started torchrun on %d hosts", len(nodes))
        except OrchError as exc:
            teardown(plan.job_id, plan.master_port, plan.nodes, group, reporter)
            if _killed(store, plan.job_id):
                # Its end, whatever a node's start said of it (a node that `orch kill`
                # reached first refuses to start).
                raise JobFailed(
                    f"job {plan.job_id} was killed (orch kill) before it started; nothing "
                    "was started on any host",
                    "submit it again to run it (an environment built meanwhile is kept)",
                ) from exc
            store.update_job(plan.job_id, JobState.FAILED)
            raise
        except KeyboardInterrupt:
            stop_interrupted(
                plan.job_id, plan.master_port, plan.nodes, group, reporter, group.settle
            )
            store.update_job(plan.job_id, JobState.KILLED)
            raise Interrupted(
                "interrupted while starting the job; stopped it on every host"
            ) from None
        if not queued:
            store.update_job(plan.job_id, JobState.RUNNING)
        if detach:
            _keep(sub, plan, group, tree, reporter, store, queued)
            if sub.job.forward:
                reporter.notice(
                    f"forward: opens with an attached submit; now: orch forward {plan.job_id} "
                    f"{sub.job.forward[0][0]}"
                )
            return 0
        mirror = LogMirror(store.home / "logs", plan.job_id, attempt)
        forwards = open_forwards(store.get(plan.job_id), sub.job.forward, reporter.notice)
        try:
            record = store.get(plan.job_id)
            stalled = word.stalled if word is not None else None
            code = watch_job(record, group, reporter, store, mirror, attached=True, stalled=stalled)
        except JobFailed:
            record = store.get(plan.job_id)
            again = _restart_of(sub, record, hosts, attempt)
            if again is not None:
                raise again from None
            bring_outputs(record, group, sub.outputs_dir, reporter.notice)
            raise
        finally:
            mirror.close()
            for forwarding in forwards:
                forwarding.close()
        bring_outputs(store.get(plan.job_id), group, sub.outputs_dir, reporter.notice)
        return code


def _keep(
    sub: Submission,
    plan: LaunchPlan,
    group: HostGroup,
    tree: Tree,
    reporter: Reporter,
    store: JobDB,
    queued: bool,
) -> None:
    """A detached job's keeper on its hosts, where it needs one: to restart it without
    this controller (`restarts:`), or to start the nodes of a queued job of several
    together in their turn (a node of one takes its turn alone). Where the keeper does
    not start, the job is stopped on every node and failed: it does not run without.

    Raises:
        OrchError: what kept the keeper from starting.
    """
    several = len(plan.nodes) > 1
    if not (sub.job.restarts or (queued and several) or sub.job.stall_after or sub.job.notify):
        return  # `stall_after:`, `notify:`: the keeper watches the detached job for them too
    line = None if not queued else "together" if several else "alone"

    def push(p: LaunchPlan, g: HostGroup) -> LaunchPlan:
        # The spares' code (and environment) for a later attempt: the keeper renders
        # that attempt's nodes on the hosts, from their templates.
        return push_code(p, g, tree, reporter)

    try:
        start_keeper(plan, sub.candidates, group, tree.digest, push, reporter, store, line)
    except OrchError:
        teardown(plan.job_id, plan.master_port, plan.nodes, group, reporter)
        store.update_job(plan.job_id, JobState.FAILED)
        raise


def _restart_of(
    sub: Submission, record: JobRecord, hosts: list[Host], attempt: int
) -> _Restart | None:
    """The next attempt, when a node failed or was lost (not `orch kill`) and the job's
    restarts allow one more; None otherwise."""
    if attempt >= sub.job.restarts or record.state is JobState.KILLED:
        return None
    failed, lost = placement.failed_hosts({n.host.name: n.state.value for n in record.nodes})
    if not failed:
        return None
    chosen = next_hosts(hosts, sub.candidates or hosts, failed, lost)
    if chosen is None:
        return None
    what = "lost" if failed <= lost else "failed"
    return _Restart(chosen, f"attempt {attempt + 1} {what} on {', '.join(sorted(failed))}")


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
        "metrics": list(job.metrics),
        "restarts": job.restarts,
        "attempt": int(plan.nodes[0].env.get("ORCH_ATTEMPT", "0")),
        "stall_after": job.stall_after,
        "on_stall": job.on_stall,
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


def plan_with_facts(
    sub: Submission, group: HostGroup, hosts: Sequence[Host], attempt: int
) -> tuple[LaunchPlan, dict[str, HostClock], dict[str, WheelTarget]]:
    """Probe the hosts and run check's blocking checks; refuse on any error found.

    Returns:
        The plan, each host's clock as the probe measured it (where it could), and,
        for a job with `wheels: download`, what each host's python installs.

    Raises:
        HostError / MultiHostError: python or torch missing on a host.
        PreflightError: what `orch check` reports as errors (exit 3, same messages).
    """
    checked = preflight(sub.job, hosts, group)
    for warning in checked.warnings:
        group.options.notice(f"warning: {warning.message}")
    plan = build_plan(
        sub.job,
        hosts,
        sub.job_id,
        checked.master_addr,
        checked.port,
        checked.facts,
        checked.shared,
        attempt,
    )
    clocks = {name: f.clock for name, f in checked.facts.items() if f.clock is not None}
    targets = {n: f.wheel_target for n, f in checked.facts.items() if f.wheel_target is not None}
    env = sub.job.environment
    if env is not None and env.download:
        silent = [h.name for h in hosts if h.name not in targets]
        if silent:
            raise InfraError(
                f"environment: {', '.join(silent)} did not say what wheels its python "
                "installs (wheels: download)",
                "check that its python's sysconfig works (orch check -i INVENTORY); or "
                "give the job a directory of wheels (wheels: DIR)",
            )
    return plan, clocks, targets


def _start(node: NodeLaunch, transport: Transport) -> LeaseStart:
    """Start a node; where it was to share another's snapshot and that is not there,
    say that the inventory's `shared_fs:` is wrong."""
    try:
        return ops.start(node, transport)
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


def push_code(plan: LaunchPlan, group: HostGroup, tree: Tree, reporter: Reporter) -> LaunchPlan:
    """Build the job's code snapshot on every node, then its environment where it has
    one (docs/ENVIRONMENTS.md), then run its `setup:` where it has not yet run for this
    setup text, code version, interpreter and environment. Nothing is started here.

    Returns:
        The plan, each node with its environment's python where the job has one.

    Nodes whose hosts share a filesystem share one snapshot: the code goes to the
    first of them, and setup runs there once (once per interpreter).

    Raises:
        HostError / MultiHostError: a push or a setup failed, naming each such host.
        InfraError: a file changed while it was being pushed.
    """
    snapshots = plan.snapshots()
    script = plan.job.setup
    env_digest = environment_digest_of(plan.job, tree)
    # Keyed by the code version, or with `setup_inputs:` by those files alone.
    inputs = plan.job.setup_inputs
    version = (
        tree.digest
        if inputs is None
        else setup_inputs_digest(((e.path, e.value) for e in tree.entries), inputs)
    )
    keys = {
        n.host.name: setup_key(
            script,
            version,
            # (Without an environment, the key of before: setups done stay cached.)
            n.host.python if env_digest is None else f"{n.host.python}\0{env_digest}",
        )
        for n in plan.nodes
        if script
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
        env=env_digest,
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
    if env_digest is not None:
        ready = {h: r.env_python for h, r in results.items() if r.env_python}
        plan = ensure_environment(plan, group, env_digest, reporter, ready)
        snapshots = plan.snapshots()
    if script:
        _run_setup(plan, group, snapshots, keys, results, tree.digest, reporter)
    return plan


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
        what = "code" if plan.job.setup_inputs is None else "setup_inputs"
        reporter.notice(f"setup: cached on {', '.join(cached)} (same setup and {what} ran there)")
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
            ops.setup(node, transport, script, keys[node.host.name], digest, line, node.python)

    group.each(run_setup, only=todo)


def _count(items: Sequence[object], what: str) -> str:
    return f"{len(items)} {what}{'s' if len(items) != 1 else ''}"
