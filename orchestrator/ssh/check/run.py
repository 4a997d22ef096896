"""`orch check`, and the blocking part of it that `orch submit` runs before it starts.

Both probe every host in parallel (one command each, no torch import), judge the facts
with the rules of check_rules, and test the rendezvous port for real: free on the
master, and open to every other node. `check` reports everything, unreachable hosts
included; `preflight` raises on the first host it cannot use, and on any error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from orchestrator.agent.kernel.lease_wire import LeaseDir
from orchestrator.agent.kernel.messages import MessageError, parse_message
from orchestrator.models.errors import HostError, OrchError, PreflightError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host, Inventory
from orchestrator.models.job import JobSpec
from orchestrator.nodes import agent, envs
from orchestrator.nodes.group import HostGroup
from orchestrator.nodes.probe import Marks, probe, probe_host, torch_missing
from orchestrator.ssh.check.net import Throughput, bandwidth, reachability, relay_reach
from orchestrator.ssh.check.rules import (
    Problem,
    bandwidth_problems,
    cluster_problems,
    host_problems,
    lease_dir_problems,
    merge_hosts,
    port_problems,
    reach_problems,
    relay_problems,
    unusable,
)
from orchestrator.ssh.plan import fs_groups, select_hosts, static_master_addr
from orchestrator.sync.manifest import scan_workdir
from orchestrator.sync.store import environment_digest_of
from orchestrator.sync.wheels import carried
from orchestrator.transport import ConnectOptions, Transport

log = logging.getLogger(__name__)
# torchrun's own default: the port firewalls of training clusters tend to leave open.
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class HostStatus:
    """One host as check saw it: its facts, or the error that stopped the probe."""

    host: Host
    facts: HostFacts | None = None
    error: OrchError | None = None
    error_topic: str = ""  # "ssh" (could not connect) or "python" (could not probe)
    ssh_ms: float | None = None  # a command's round trip; None for local hosts
    lease_dir: LeaseDir | None = None  # a shared host's (inventory gpus: or slots:)
    env_built: bool | None = None  # the job's environment is built there (None: no job's)


@dataclass(frozen=True)
class Rendezvous:
    """The job's rendezvous port on the master, and who could reach it."""

    master: str
    addr: str
    port: int
    pinned: bool
    free: bool | None  # whether the wanted port was free on the master
    holders: tuple[str, ...] = ()
    tested: tuple[str, ...] = ()  # the nodes that tried to connect
    unreachable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckReport:
    hosts: tuple[HostStatus, ...]
    master_addr: str | None
    rendezvous: Rendezvous | None
    throughput: dict[str, Throughput] | None
    problems: tuple[Problem, ...]
    shared: tuple[tuple[str, ...], ...] = ()  # hosts whose workdirs share a filesystem
    relayed: tuple[str, ...] = ()  # nodes that can fetch the code from the master's relay
    environment: str | None = None  # the job's environment, as the line says it

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.is_error]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if not p.is_error]


@dataclass(frozen=True)
class Preflight:
    """What submit needs to plan: the master's address, the port, every host's facts."""

    master_addr: str
    port: int
    facts: dict[str, HostFacts]
    warnings: tuple[Problem, ...]
    shared: tuple[tuple[str, ...], ...]  # hosts whose workdirs share a filesystem


def run_check(
    inventory: Inventory,
    job: JobSpec | None = None,
    measure_bandwidth: bool = False,
    options: ConnectOptions | None = None,
) -> CheckReport:
    """Probe the hosts (the job's, else the inventory's) and report every problem found.

    Raises:
        SpecError: the job selects hosts the inventory does not have.
    """
    hosts = select_hosts(job, inventory) if job else list(inventory.hosts)
    master = hosts[0]
    with HostGroup(hosts, options or ConnectOptions()) as group:
        failed = {e.host: e for e in group.connect(tolerate=True)}
        master_addr = _master_addr_or_none(group, master)
        wanted = (job.rendezvous_port or DEFAULT_PORT) if job else None
        modules = _modules_to_find(job)
        marks = _marks(hosts)
        env_digest = None
        # (`wheels: download`: its name holds wheels that only a submit downloads.)
        if job is not None and job.environment is not None and not job.environment.download:
            tree = carried(job, scan_workdir(job.workdir, job.exclude))
            env_digest = environment_digest_of(job, tree)

        def inspect(host: Host, transport: Transport) -> HostStatus:
            port = wanted if host.name == master.name else None
            index = index_to_reach(host, job)
            try:
                found = probe_host(host, transport, master_addr, port, True, modules, marks, index)
            except OrchError as exc:
                return HostStatus(host, error=exc, error_topic="python")
            leases = _lease_dir(host, transport)
            ssh_ms = _round_trip_ms(host, transport)
            built = None
            if env_digest is not None:
                try:
                    built = envs.ready(host, transport, env_digest) is not None
                except OrchError:
                    built = False
            return HostStatus(host, found.facts, ssh_ms=ssh_ms, lease_dir=leases, env_built=built)

        probed, errors = group.try_each(inspect)
        failed.update({e.host: e for e in errors})
        statuses = tuple(
            probed.get(h.name) or HostStatus(h, error=failed.get(h.name), error_topic="ssh")
            for h in hosts
        )
        brings = job is not None and job.environment is not None  # torch may come with it
        usable = [s.host for s in statuses if s.facts and (s.facts.torch_version or brings)]
        rendezvous = None
        if job and master_addr and master in usable and wanted is not None:
            facts = probed[master.name].facts
            assert facts is not None
            rendezvous = _test_rendezvous(group, job, hosts, usable, master_addr, wanted, facts)
        relay_failures: dict[str, str] = {}
        others = [h for h in usable if h.name != master.name]
        if master_addr and master in usable and others:
            try:
                relay_failures = relay_reach(group, master, master_addr, others)
            except HostError as exc:
                relay_failures = {h.name: exc.what for h in others}
        throughput = None
        if measure_bandwidth and master_addr and master in usable:
            others = [h for h in usable if h.name != master.name]
            throughput = bandwidth(group, master, master_addr, others)
    judged = _judge(hosts, statuses, job, rendezvous, throughput)
    problems = merge_hosts(judged + relay_problems(master.name, relay_failures))
    found = {s.host.name: s.facts for s in statuses if s.facts is not None}
    shared = tuple(fs_groups(hosts, found))
    relayed = tuple(h.name for h in others if h.name not in relay_failures)
    return CheckReport(
        statuses,
        master_addr,
        rendezvous,
        throughput,
        tuple(problems),
        shared,
        relayed,
        _environment_line(job, statuses),
    )


def _environment_line(job: JobSpec | None, statuses: Sequence[HostStatus]) -> str | None:
    """What `orch check JOB` says of the job's environment: what it holds, where it is
    built, where the next submit builds it."""
    if job is None or job.environment is None:
        return None
    env = job.environment
    held = ", ".join(env.requirements) or "nothing more"
    source = f", from {env.wheels_said} with no index" if env.wheels else ""
    if env.download:
        source = ", from wheels this machine downloads for the hosts at submit, no index there"
    built = [s.host.name for s in statuses if s.env_built]
    todo = [s.host.name for s in statuses if s.env_built is False]
    where = []
    if built:
        where.append(f"built on {', '.join(built)}")
    if todo:
        where.append(f"the next submit builds it on {', '.join(todo)}")
    return f"environment: {env.source} ({held}{source}): " + ("; ".join(where) or "not asked")


def preflight(job: JobSpec, hosts: Sequence[Host], group: HostGroup) -> Preflight:
    """Submit's check of the connected hosts, before anything is started anywhere.

    Raises:
        HostError / MultiHostError: python or torch missing on a host.
        PreflightError: a blocking problem (versions, GPUs, routes, the port).
    """
    master = hosts[0]
    master_addr = _master_addr(group, master)
    wanted = job.rendezvous_port or DEFAULT_PORT
    modules = _modules_to_find(job)
    marks = _marks(hosts)
    # A job's environment may bring torch itself over a bare host python.
    verdict = probe if job.environment is None else probe_host
    # `wheels: download`: the controller downloads them for what each host installs.
    download = job.environment is not None and job.environment.download
    probes = group.each(
        lambda h, t: verdict(
            h,
            t,
            master_addr,
            port=wanted if h.name == master.name else None,
            gpus=bool(h.gpus),  # nvidia-smi can take a second: only where GPUs are declared
            modules=modules,
            marks=marks,
            target=download,
        )
    )
    facts = {name: p.facts for name, p in probes.items()}
    problems = [p for h in hosts for p in host_problems(h, facts[h.name], _job_env(h, job))]
    problems += cluster_problems(hosts, facts)
    rendezvous = _test_rendezvous(group, job, hosts, hosts, master_addr, wanted, facts[master.name])
    problems += _rendezvous_problems(rendezvous)
    problems = merge_hosts(problems)
    errors = [p for p in problems if p.is_error]
    if errors:
        raise PreflightError(errors)
    warnings = tuple(p for p in problems if not p.is_error)
    shared = tuple(fs_groups(hosts, facts))
    return Preflight(master_addr, rendezvous.port, facts, warnings, shared)


def _marks(hosts: Sequence[Host]) -> Marks | None:
    """Marks for the hosts whose shared filesystems orch finds out (plan.fs_groups)."""
    detecting = [h for h in hosts if h.shared_fs is None]
    return Marks.fresh(detecting) if len(detecting) > 1 else None


def _test_rendezvous(
    group: HostGroup,
    job: JobSpec,
    hosts: Sequence[Host],
    usable: Sequence[Host],
    master_addr: str,
    wanted: int,
    master_facts: HostFacts,
) -> Rendezvous:
    """Pick the port as submit does, then have every other node connect to it."""
    master = hosts[0]
    pinned = job.rendezvous_port is not None
    port, free = wanted, master_facts.port_free
    if not pinned and master_facts.free_port:
        # A fresh free port, not torchrun's 29500: jobs submitted at the same moment to
        # one master (a sweep) would all find 29500 free and all but one would fail.
        port, free = master_facts.free_port, True
    result = Rendezvous(
        master.name,
        master_addr,
        port,
        pinned,
        free,
        master_facts.port_holders,
    )
    if pinned and master_facts.port_free is False:
        return result  # nothing to test against: the port is someone else's
    # Nodes on the master's own machine reach it over loopback: nothing to learn there.
    others = [h for h in usable if h.name != master.name and not (h.is_local and master.is_local)]
    unreachable = reachability(group, master, master_addr, port, others)
    tested = tuple(h.name for h in others)
    return replace(result, tested=tested, unreachable=unreachable)


def _judge(
    hosts: Sequence[Host],
    statuses: Sequence[HostStatus],
    job: JobSpec | None,
    rendezvous: Rendezvous | None,
    throughput: dict[str, Throughput] | None,
) -> list[Problem]:
    problems: list[Problem] = []
    facts: dict[str, HostFacts] = {}
    for status in statuses:
        if status.error is not None:
            problems.append(unusable(status.host, status.error, status.error_topic))
        elif (
            status.facts is not None
            and not status.facts.torch_version
            and (job is None or job.environment is None)  # else the environment may bring it
        ):
            problems.append(unusable(status.host, torch_missing(status.host), "torch"))
        elif status.facts is not None:
            facts[status.host.name] = status.facts
            problems += host_problems(status.host, status.facts, _job_env(status.host, job))
            if status.lease_dir is not None:
                problems += lease_dir_problems(status.host.name, status.lease_dir)
    problems += cluster_problems(hosts, facts)
    if rendezvous is not None:
        problems += _rendezvous_problems(rendezvous)
    if throughput:
        rates = {name: (t.up_gbps, t.down_gbps) for name, t in throughput.items()}
        with_gpus = any(h.gpus or (facts.get(h.name) or HostFacts()).gpu_count for h in hosts)
        problems += bandwidth_problems(rates, bool(with_gpus))
    return problems


def _rendezvous_problems(r: Rendezvous) -> list[Problem]:
    return port_problems(r.master, r.addr, r.port, r.pinned, r.free, r.holders) + reach_problems(
        r.master, r.addr, r.port, r.unreachable
    )


def _master_addr(group: HostGroup, master: Host) -> str:
    """The address every node reaches the master at.

    Raises:
        HostError: the master is named by a DNS name or ssh alias, and its sshd does
            not say which address it was reached at.
    """
    static = static_master_addr(master)
    if static is not None:
        return static
    # A DNS name or ssh alias: use the address the master's sshd was reached at.
    first = group.each(lambda h, t: probe_host(h, t, gpus=False), only=[master.name])
    ssh_addr = first[master.name].ssh_addr
    if not ssh_addr:
        raise HostError(
            master.name,
            f"cannot tell which address other hosts reach {master.address} at",
            "give the master host its IP address in the inventory",
        )
    return ssh_addr


def _master_addr_or_none(group: HostGroup, master: Host) -> str | None:
    if master.name not in group.transports:
        return static_master_addr(master)
    try:
        return _master_addr(group, master)
    except OrchError:
        return None  # the probe that follows reports what is wrong with the master


def _modules_to_find(job: JobSpec | None) -> list[str]:
    """The job's module, when it is not in the workdir: it must be installed on the hosts."""
    if job is None or not job.module or job.environment is not None:
        return []  # (an environment may install it: its build says so where it does not)
    top = job.module.split(".")[0]
    in_workdir = (job.workdir / top).is_dir() or (job.workdir / f"{top}.py").is_file()
    return [] if in_workdir else [top]


DEFAULT_INDEX = "https://pypi.org/simple"


def index_to_reach(host: Host, job: JobSpec | None) -> str | None:
    """The package index a job's environment would be built from on `host`: where the
    job has `environment:` and no `wheels:`, PIP_INDEX_URL (or UV_INDEX_URL) of the env
    it gets there, else PyPI's; None where nothing is installed from an index."""
    if job is None or job.environment is None or job.environment.wheels is not None:
        return None
    env = _job_env(host, job)
    return env.get("PIP_INDEX_URL") or env.get("UV_INDEX_URL") or DEFAULT_INDEX


def _job_env(host: Host, job: JobSpec | None) -> dict[str, str]:
    return {**host.env, **(job.env if job else {})}


def _lease_dir(host: Host, transport: Transport) -> LeaseDir | None:
    """A shared host's lease directory (`lease dir`); None on a host that is not
    shared, or where the agent could not say (the probe reports what is wrong)."""
    if not host.leases:
        return None
    try:
        reply = agent.run(host, transport, ["lease", "dir"], timeout=30)
        return parse_message(LeaseDir, reply)
    except (OrchError, MessageError) as exc:
        log.debug("lease dir on %s: %s", host.name, exc)
        return None


def _round_trip_ms(host: Host, transport: Transport) -> float | None:
    """How long a trivial command takes over the host's connection, in ms."""
    if host.is_local:
        return None
    started = time.perf_counter()
    transport.run("true", timeout=10)
    return (time.perf_counter() - started) * 1000


def describe_port(r: Rendezvous) -> str:
    """One line on the rendezvous port: where, whether free, who reached it."""
    kind = "pinned" if r.pinned else "a free port"
    line = f"rendezvous: {r.master} at {r.addr}:{r.port} ({kind})"
    if r.free is False:
        return f"{line}: busy"
    if r.tested:
        ok = [n for n in r.tested if n not in r.unreachable]
        line += f"; reached from {', '.join(ok) if ok else 'no node'}"
        if r.unreachable:
            line += f", not from {', '.join(r.unreachable)}"
    return line
