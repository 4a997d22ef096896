"""`orch submit`: plan -> connect -> probe -> push -> start -> watch.

Nothing here prints: what the user should see goes through a Reporter, which the CLI
implements. Errors are raised as OrchError subclasses and mapped to exit codes there.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from orchestrator import launch
from orchestrator.check import preflight
from orchestrator.hosts import HostGroup
from orchestrator.launch import NodeRef
from orchestrator.logstore import LogMirror
from orchestrator.manifest import Tree
from orchestrator.models.errors import Interrupted, JobFailed, OrchError
from orchestrator.models.inventory import Host, Inventory, builtin_local_inventory, load_inventory
from orchestrator.models.job import JobSpec, load_job
from orchestrator.models.states import JobState, job_state, node_state
from orchestrator.plan import LaunchPlan, build_plan, select_hosts, static_master_addr
from orchestrator.push import PushProgress, push
from orchestrator.state import JobRecord, NodeRecord, Store
from orchestrator.sync import (
    collect_garbage,
    host_key,
    scan_workdir,
    setup_key,
    setup_marker,
    snapshot_retention,
)
from orchestrator.transport import ConnectOptions, Transport
from orchestrator.watch import NodeExit, Output, Watcher

log = logging.getLogger(__name__)
TAIL_LINES = 20


class Reporter(Protocol):
    """What a running submit tells the user (implemented by the CLI).

    1. `job_started(job_id)` comes once, before any host is changed.
    2. `output()` comes with complete lines (bytes, newline-terminated but maybe the
       very last) of one rank, or of a node's torchrun (rank None), in each one's order.
    3. `notice()` is a diagnostic for stderr: progress, host keys, teardown.
    """

    def job_started(self, job_id: str) -> None: ...

    def output(self, host: str, rank: int | None, data: bytes) -> None: ...

    def notice(self, message: str) -> None: ...


def resolve_inventory(cli_path: Path | None, job: JobSpec | None) -> Inventory:
    """-i PATH, else $ORCH_INVENTORY, else the job's `inventory:`, else built-in localhost."""
    if cli_path is not None:
        return load_inventory(cli_path)
    env_path = os.environ.get("ORCH_INVENTORY")
    if env_path:
        return load_inventory(Path(env_path))
    if job is not None and job.inventory is not None:
        return load_inventory(job.inventory)
    return builtin_local_inventory()


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
    inventory = resolve_inventory(inventory_path, job)
    hosts = select_hosts(job, inventory)
    return Submission(job, hosts, new_job_id(job.name))


def dry_run(sub: Submission) -> LaunchPlan:
    """The plan as far as it is known without touching any host."""
    master = sub.hosts[0]
    master_addr = static_master_addr(master) or f"<address of {master.address}>"
    return build_plan(sub.job, sub.hosts, sub.job_id, master_addr, sub.job.rendezvous_port)


def submit(
    sub: Submission, reporter: Reporter, detach: bool = False, store: Store | None = None
) -> int:
    """Run a job on its hosts and, unless detached, stream its output until it ends.

    Returns:
        0 when every node succeeded (or, detached, once every node started).

    Raises:
        InfraError: a host is unreachable or unusable; nothing was started anywhere.
        JobFailed: a node failed; the job was stopped on every node.
        Interrupted: Ctrl-C; the job was stopped on every node.
    """
    store = store or Store()
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
            launch.start(nodes[host.name], transport)
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


def teardown(
    job_id: str,
    port: int | None,
    nodes: Sequence[NodeRef],
    group: HostGroup,
    reporter: Reporter,
    grace_s: float = launch.KILL_GRACE_S,
) -> dict[str, dict[str, Any]]:
    """Stop the job on these nodes (on reachable hosts); report failures, never raise:
    the error that led here is already on its way.

    Returns:
        Each reached host's kill report.
    """
    reachable = [n for n in nodes if n.host.name in group.transports]
    master = nodes[0].host.name if nodes and nodes[0].node_rank == 0 else None

    def kill(host: Host, transport: Transport) -> dict[str, Any]:
        node = next(n for n in reachable if n.host.name == host.name)
        return launch.kill(node, transport, job_id, grace_s, port if host.name == master else None)

    results, failures = group.try_each(kill, only=[n.host.name for n in reachable])
    for name, report in results.items():
        log.debug("[job=%s host=%s] kill took %s", job_id, name, report.get("seconds"))
    for failure in failures:
        reporter.notice(f"could not stop the job there: {failure.message}")
    return results


def watch_job(
    record: JobRecord,
    group: HostGroup,
    reporter: Reporter,
    store: Store,
    mirror: LogMirror,
    attached: bool,
) -> int:
    """Stream a job's output until every node ended; tear the job down when one fails.

    Args:
        attached: the submit that started the job: Ctrl-C kills the job (else it only
            stops following).

    Returns:
        0 when every node succeeded.

    Raises:
        JobFailed: a node failed or was lost; the job was stopped on every node.
        Interrupted: Ctrl-C on an attached submit; the job was stopped everywhere.
    """
    live = [
        n for n in record.nodes if not n.state.is_terminal() and n.host.name in group.transports
    ]
    watcher = Watcher(live, group.transports, mirror)
    tails: dict[tuple[str, int | None], deque[bytes]] = {}
    failure: NodeExit | None = None
    killer: threading.Thread | None = None
    try:
        for event in watcher.events():
            if isinstance(event, Output):
                tail = tails.setdefault((event.host, event.rank), deque(maxlen=TAIL_LINES))
                tail.extend(event.data.splitlines()[-TAIL_LINES:])
                reporter.output(event.host, event.rank, event.data)
                continue
            state = node_state(event.returncode, event.killed)
            store.update_node(record.id, event.host, state, event.returncode, event.error)
            record.node(event.host).state = state
            if event.ok or failure is not None:
                continue
            failure = event
            others = [
                n for n in record.nodes if n.host.name != event.host and not n.state.is_terminal()
            ]
            reporter.notice(
                f"{describe_exit(event)}: stopping the job on {len(others)} other node(s)"
            )
            args = (record.id, record.master_port, others, group, reporter)
            killer = threading.Thread(target=teardown, args=args, daemon=True)
            killer.start()
    except KeyboardInterrupt:
        if not attached:
            raise
        reporter.notice(
            "interrupted: stopping the job on every host (Ctrl-C again to skip the grace period)"
        )
        try:
            teardown(record.id, record.master_port, record.nodes, group, reporter)
        except KeyboardInterrupt:
            teardown(record.id, record.master_port, record.nodes, group, reporter, grace_s=0)
        for node in record.nodes:
            store.update_node(record.id, node.host.name, JobState.KILLED)
        store.update_job(record.id, JobState.KILLED)
        raise Interrupted(f"job {record.id} interrupted and stopped on every host") from None
    finally:
        watcher.close()
        if killer is not None:
            killer.join()
    final = job_state([n.state for n in record.nodes])
    if final.is_terminal():
        store.update_job(record.id, final, 0 if final is JobState.SUCCEEDED else 1)
    if failure is None and final is JobState.SUCCEEDED:
        return 0
    if failure is None:
        raise JobFailed(f"job {record.id} ended {final.value}", f"see: orch status {record.id}")
    raise JobFailed(failure_summary(record, failure, tails), f"all output: orch logs {record.id}")


def describe_exit(event: NodeExit) -> str:
    """How a node ended, in words."""
    if event.killed:
        return f"node {event.host} was killed"
    if event.returncode is None:
        return f"lost node {event.host} ({event.error or 'unknown'})"
    if event.returncode < 0:
        return f"node {event.host} was killed by {_signal_name(-event.returncode)}"
    return f"node {event.host} exited with code {event.returncode}"


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


_ROOT_RANK = re.compile(rb"^\s*rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(rb"^\s*exitcode\s*:\s*(-?\d+)")


def root_cause(torchrun_tail: Sequence[bytes]) -> tuple[int | None, int | None]:
    """The first failing rank and its exit code, from torchrun's failure report."""
    lines = list(torchrun_tail)
    start = next((i for i, line in enumerate(lines) if b"Root Cause" in line), None)
    rank = code = None
    for line in lines[start or 0 :]:
        if rank is None and (m := _ROOT_RANK.match(line)):
            rank = int(m.group(1))
        elif code is None and (m := _ROOT_EXIT.match(line)):
            code = int(m.group(1))
    return rank, code


def failure_summary(
    record: JobRecord, failure: NodeExit, tails: dict[tuple[str, int | None], deque[bytes]]
) -> str:
    """The first failing host and rank, how it ended, and the end of its output."""
    node = record.node(failure.host)
    rank, code = root_cause(list(tails.get((failure.host, None), ())))
    if rank is None:  # no torchrun report: the rank whose output ends in a traceback
        rank = next(
            (
                r
                for r in node.ranks
                if any(b"Traceback" in line for line in tails.get((node.host.name, r), ()))
            ),
            None,
        )
    what = describe_exit(failure)
    if rank is not None:
        how = (
            ""
            if code is None
            else (f", exit code {code}" if code >= 0 else f", {_signal_name(-code)}")
        )
        what += f"; first failure: rank {rank}{how}"
    lines = [f"job {record.id} failed: {what}"]
    tail = tails.get((failure.host, rank)) if rank is not None else None
    if tail:
        lines.append(f"last lines of [{failure.host} r{rank}]:")
        lines.extend("  " + line.decode("utf-8", "replace") for line in tail)
    return "\n".join(lines)


# ---------------------------------------------------------------- code push


@runtime_checkable
class ProgressReporter(Protocol):
    """A Reporter that can also show how far a code push is (optional: those without
    `progress` get no progress).

    1. `progress()` comes from the hosts' threads, for each host at the start of its
       push, after each round trip, and once with `finished` at its end.
    """

    def progress(self, update: PushProgress) -> None: ...


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

        marker = setup_marker(host, keys[host.name])
        launch.setup(nodes[host.name], transport, script, marker, tree.digest, line)

    group.each(run_setup, only=todo)


def gc(
    inventory_path: Path | None, keep: int | None, notice: Callable[[str], None]
) -> dict[str, dict[str, Any]]:
    """`orch gc`: on every host of the inventory, remove the code snapshots of finished
    jobs but the newest `keep` (default: $ORCH_KEEP_SNAPSHOTS), then the stored
    content that no snapshot uses any more. Logs and job records stay.

    Returns:
        Each host's report: snapshots removed and kept, jobs running, objects removed,
        bytes freed. Hosts that share a store (one machine and workdir under two
        names) are collected once, under the first name.

    Raises:
        InputError: a bad inventory or retention.
        HostError / MultiHostError: hosts that could not be reached or collected.
    """
    keep = snapshot_retention() if keep is None else keep
    inventory = resolve_inventory(inventory_path, None)
    stores = {host_key(h): h.name for h in reversed(inventory.hosts)}  # one name per store

    def collect(host: Host, transport: Transport) -> dict[str, Any]:
        return collect_garbage(host, transport, keep)

    with HostGroup(inventory.hosts, ConnectOptions(notice=notice)) as group:
        group.connect()
        return group.each(collect, only=stores.values())
