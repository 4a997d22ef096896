"""`orch submit`: plan -> connect -> probe -> push -> start -> watch.

Nothing here prints: what the user should see goes through a Reporter, which the CLI
implements. Errors are raised as OrchError subclasses and mapped to exit codes there.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator import launch
from orchestrator.hosts import HostGroup
from orchestrator.models.errors import HostError, InfraError, Interrupted, JobFailed, OrchError
from orchestrator.models.inventory import Host, Inventory, builtin_local_inventory, load_inventory
from orchestrator.models.job import JobSpec, load_job
from orchestrator.plan import LaunchPlan, build_plan, select_hosts, static_master_addr
from orchestrator.sync import pack_workdir
from orchestrator.transport import ConnectOptions, Transport
from orchestrator.watch import LineEvent, NodeExit, Watcher

log = logging.getLogger(__name__)
TAIL_LINES = 20


class Reporter(Protocol):
    """What a running submit tells the user (implemented by the CLI).

    1. `job_started(job_id)` comes once, before any host is changed.
    2. `line()` comes for every output line of every rank, in each rank's order.
    3. `notice()` is a diagnostic for stderr: progress, host keys, teardown.
    """

    def job_started(self, job_id: str) -> None: ...

    def line(self, host: str, rank: int | None, text: str) -> None: ...

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


def submit(sub: Submission, reporter: Reporter, detach: bool = False) -> int:
    """Run a job on its hosts and, unless detached, stream its output until it ends.

    Returns:
        0 when every node succeeded (or, detached, once every node started).

    Raises:
        InfraError: a host is unreachable or unusable; nothing was started anywhere.
        JobFailed: a node failed; the job was stopped on every node.
        Interrupted: Ctrl-C; the job was stopped on every node.
    """
    archive, nfiles = pack_workdir(sub.job.workdir, sub.job.exclude)
    options = ConnectOptions(notice=reporter.notice)
    with HostGroup(sub.hosts, options) as group:
        group.connect()
        log.info("connected to %d hosts", len(sub.hosts))
        plan = _plan_with_facts(sub, group)
        log.info(
            "probed %d hosts; master %s:%s", len(sub.hosts), plan.master_addr, plan.master_port
        )
        reporter.job_started(plan.job_id)
        nodes = {n.host.name: n for n in plan.nodes}
        log.info("pushing %d files (%d kB) to %d hosts", nfiles, len(archive) // 1024, len(nodes))
        started: list[str] = []

        def start(host: Host, transport: Transport) -> None:
            launch.push_and_start(nodes[host.name], transport, archive)
            started.append(host.name)

        try:
            group.each(start)
            log.info("started torchrun on %d hosts", len(started))
        except OrchError:
            _teardown(plan, group, started, reporter)
            raise
        except KeyboardInterrupt:
            _teardown(plan, group, started, reporter)
            raise Interrupted(
                "interrupted while starting the job; stopped it on every host"
            ) from None
        if detach:
            return 0
        return _watch(plan, group, reporter)


def _plan_with_facts(sub: Submission, group: HostGroup) -> LaunchPlan:
    master = sub.hosts[0]
    master_addr = static_master_addr(master)
    if master_addr is None:
        # A DNS name or ssh alias: use the address the master's sshd was reached at.
        first = group.each(lambda h, t: launch.probe(h, t, None), only=[master.name])[master.name]
        if not first.ssh_addr:
            raise HostError(
                master.name,
                f"cannot tell which address other hosts reach {master.address} at",
                "give the master host its IP address in the inventory",
            )
        master_addr = first.ssh_addr
    probes = group.each(lambda h, t: launch.probe(h, t, master_addr))
    port = sub.job.rendezvous_port or probes[master.name].facts.free_port
    if port is None:
        raise InfraError(
            f"no free port found on the master {master.name}", "pin one with rendezvous: {port: N}"
        )
    facts = {name: p.facts for name, p in probes.items()}
    return build_plan(sub.job, sub.hosts, sub.job_id, master_addr, port, facts)


def _teardown(
    plan: LaunchPlan,
    group: HostGroup,
    names: Sequence[str],
    reporter: Reporter,
    grace_s: float = launch.KILL_GRACE_S,
) -> None:
    """Stop the job on the named hosts; report, never raise (an error is already on its way)."""
    if not names:
        return
    nodes = {n.host.name: n for n in plan.nodes}
    try:
        group.each(lambda host, t: launch.kill(nodes[host.name], t, grace_s), only=names)
    except OrchError as exc:
        reporter.notice(f"could not stop the job everywhere: {exc.message}")


def _watch(plan: LaunchPlan, group: HostGroup, reporter: Reporter) -> int:
    watcher = Watcher(plan, group)
    tails: dict[tuple[str, int | None], deque[str]] = {}
    first_failure: NodeExit | None = None
    exited: set[str] = set()
    killer: threading.Thread | None = None
    try:
        for event in watcher.events():
            if isinstance(event, LineEvent):
                tails.setdefault((event.host, event.rank), deque(maxlen=TAIL_LINES)).append(
                    event.text
                )
                reporter.line(event.host, event.rank, event.text)
                continue
            exited.add(event.host)
            if event.ok or first_failure is not None:
                continue
            first_failure = event
            others = [n.host.name for n in plan.nodes if n.host.name not in exited]
            reporter.notice(
                f"{_describe_exit(event)}: stopping the job on {len(others)} other node(s)"
            )
            killer = threading.Thread(
                target=_teardown, args=(plan, group, others, reporter), daemon=True
            )
            killer.start()
    except KeyboardInterrupt:
        reporter.notice(
            "interrupted: stopping the job on every host (Ctrl-C again to skip the grace period)"
        )
        try:
            _teardown(plan, group, [n.host.name for n in plan.nodes], reporter)
        except KeyboardInterrupt:
            _teardown(plan, group, [n.host.name for n in plan.nodes], reporter, grace_s=0)
        raise Interrupted(f"job {plan.job_id} interrupted and stopped on every host") from None
    finally:
        watcher.close()
        if killer is not None:
            killer.join()
    if first_failure is None:
        return 0
    raise JobFailed(_failure_summary(plan, first_failure, tails), "see the output above")


def _describe_exit(event: NodeExit) -> str:
    if event.returncode is None:
        return f"lost node {event.host} ({event.error or 'unknown'})"
    if event.returncode < 0:
        return f"node {event.host} was killed by signal {-event.returncode}"
    return f"node {event.host} exited with code {event.returncode}"


def _failure_summary(
    plan: LaunchPlan, failure: NodeExit, tails: dict[tuple[str, int | None], deque[str]]
) -> str:
    node = next(n for n in plan.nodes if n.host.name == failure.host)
    lines = [f"job {plan.job_id} failed: {_describe_exit(failure)} (node rank {node.node_rank})"]
    # The rank whose output ends with a traceback is the one that failed first.
    for rank in node.ranks:
        tail = tails.get((node.host.name, rank))
        if tail and any("Traceback" in line or "Error" in line for line in tail):
            lines.append(f"last lines of rank {rank}:")
            lines.extend("  " + line for line in tail)
            break
    return "\n".join(lines)
