"""The launch plan: a pure function from (job, inventory, host facts) to commands.

Nothing here touches a host. `orch submit --dry-run` prints a plan built with no
facts at all, and the unit tests check ranks, master, argv and env directly.
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.agent.kernel import layout, placement
from orchestrator.agent.kernel.requests import NodeTemplate, WarmOptions
from orchestrator.models.errors import HostChoiceError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host, Inventory, pick_hosts
from orchestrator.models.job import JobSpec

IFNAME_VARS = placement.IFNAME_VARS
UNKNOWN_PORT = placement.UNKNOWN_PORT


@dataclass(frozen=True)
class NodeLaunch:
    """What runs on one host: its node rank, its global ranks and its exact command."""

    host: Host
    node_rank: int
    nproc: int
    first_rank: int
    job_dir: str  # on the host; may start with ~
    argv: tuple[str, ...]  # run from job_dir (each rank in its code/), no shell involved
    env: dict[str, str] = field(hash=False)
    # What it was rendered from (node_template): a detached job's keeper renders the
    # host's node of a later attempt from it.
    template: NodeTemplate = field(hash=False, compare=False)
    # The nodes whose hosts share this one's workdir filesystem, in node order, this
    # one included: they share one snapshot, which the first one's push builds. Empty
    # when the host shares it with no other node of the job.
    shares: tuple[str, ...] = ()
    # The job's environment's python on this host (nodes/envs.py), which runs the node
    # in place of the host's (agent/node/spawn.py); None: no environment, or not yet.
    python: str | None = None

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)

    @property
    def snapshot_dir(self) -> str:
        """Where the node's code/ is built: its own job directory, or the job's when
        its filesystem is shared (the node's directory then links to it)."""
        return self.job_dir.rpartition("/")[0] if self.shares else self.job_dir

    @property
    def snapshot_host(self) -> str:
        """The node whose push builds this node's snapshot: itself unless shared."""
        return self.shares[0] if self.shares else self.host.name

    @property
    def code_dir(self) -> str:
        return f"{self.snapshot_dir}/{layout.CODE}"


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start a job, and nothing that needs a host to compute."""

    job_id: str
    job: JobSpec
    master_addr: str
    master_port: int | None
    nodes: tuple[NodeLaunch, ...]

    @property
    def world_size(self) -> int:
        return sum(n.nproc for n in self.nodes)

    @property
    def master(self) -> NodeLaunch:
        return self.nodes[0]

    def snapshots(self) -> dict[str, tuple[NodeLaunch, ...]]:
        """The nodes by the node whose push builds their snapshot, in node order."""
        groups: dict[str, list[NodeLaunch]] = {}
        for node in self.nodes:
            groups.setdefault(node.snapshot_host, []).append(node)
        return {name: tuple(nodes) for name, nodes in groups.items()}


def select_hosts(job: JobSpec, inventory: Inventory) -> list[Host]:
    """The hosts a job runs on, in node-rank order (the first is the master).

    Raises:
        SpecError: an unknown host or label, or more nodes than hosts; names the job
            file's key.
    """
    try:
        selected = pick_hosts(inventory, job.hosts, job.labels, job.nodes)
    except HostChoiceError as exc:
        raise job.error(exc.key, exc.message, exc.hint) from None
    local = [h.is_local for h in selected]
    if any(local) and not all(local):
        raise job.error(
            "nodes",
            "a job cannot mix localhost and remote hosts: remote nodes could not reach it",
            "give the local machine its network address in the inventory",
        )
    return selected


def static_master_addr(master: Host) -> str | None:
    """The master's address for the other nodes, when it can be known without a probe."""
    # None for a DNS name or ssh alias: the probe reports the address sshd saw.
    return _static_addr(master)


def fs_groups(hosts: Sequence[Host], facts: Mapping[str, HostFacts]) -> list[tuple[str, ...]]:
    """The hosts whose workdirs are on one shared filesystem, two or more a group, in
    host order: as the inventory's `shared_fs:` says where it does, else as the
    probes' marks show (a host that found another's mark shares its filesystem).
    """
    parent = {h.name: h.name for h in hosts}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    def join(a: str, b: str) -> None:
        parent[root(b)] = root(a)

    detecting = [h for h in hosts if h.shared_fs is None]
    marks = {f.fs_mark: h.name for h in detecting if (f := facts.get(h.name)) and f.fs_mark}
    named: dict[str, str] = {}
    for host in hosts:
        if host.shared_fs is None:
            for mark in getattr(facts.get(host.name), "fs_seen", None) or ():
                if marks.get(mark, host.name) != host.name:
                    join(marks[mark], host.name)
        elif host.shared_fs is not False:
            key = "" if host.shared_fs is True else host.shared_fs
            join(named.setdefault(key, host.name), host.name)
    groups: dict[str, list[str]] = {}
    for host in hosts:
        groups.setdefault(root(host.name), []).append(host.name)
    return [tuple(names) for names in groups.values() if len(names) > 1]


def node_count(job: JobSpec, host: Host) -> int:
    """Processes to start on a host: the job's nproc_per_node, or the host's slots."""
    nproc = job.nproc_per_node if job.nproc_per_node is not None else host.slots
    if nproc > host.slots:
        raise job.error(
            "nproc_per_node",
            f"nproc_per_node={nproc} but host {host.name} has {host.slots} slots",
            "lower nproc_per_node, use 'auto', or raise slots in the inventory",
        )
    wanted = job.gpus_per_node
    if wanted and wanted > len(host.gpus):
        raise job.error(
            "gpus_per_node",
            f"gpus_per_node={wanted} but host {host.name} has {len(host.gpus)} GPUs "
            "in the inventory",
            "lower gpus_per_node, or list the host's GPUs (gpus:) in the inventory",
        )
    return nproc


def build_plan(
    job: JobSpec,
    hosts: Sequence[Host],
    job_id: str,
    master_addr: str,
    master_port: int | None,
    facts: Mapping[str, HostFacts] | None = None,
    shared: Sequence[Sequence[str]] = (),
    attempt: int = 0,
) -> LaunchPlan:
    """Compute node ranks, global ranks and each host's torchrun command and env.

    Args:
        job: the validated job.
        hosts: the selected hosts in node-rank order; hosts[0] is the master.
        job_id: the job's id; tags every process of the job.
        master_addr: the address every node reaches the master at.
        master_port: the rendezvous port, None when not known yet (dry run).
        facts: probe results by host name; missing facts leave defaults out.
        shared: groups of hosts that share their workdir's filesystem (`fs_groups`).
        attempt: which start of the job this is (`restarts:`), 0 the first.

    Returns:
        The LaunchPlan.
    """
    facts = facts or {}
    counts = [node_count(job, host) for host in hosts]
    place = placement.placement([h.name for h in hosts], counts, master_addr, master_port, attempt)
    nodes = []
    for node_rank, (host, nproc) in enumerate(zip(hosts, counts, strict=True)):
        template = node_template(job, host, facts.get(host.name, HostFacts()), job_id)
        argv, env, job_dir = placement.render(template, place)
        group = next((g for g in shared if host.name in g), ())
        shares = tuple(h.name for h in hosts if h.name in group)
        nodes.append(
            NodeLaunch(
                host=host,
                node_rank=node_rank,
                nproc=nproc,
                first_rank=sum(counts[:node_rank]),
                job_dir=job_dir,
                argv=tuple(argv),
                env=env,
                template=template,
                shares=shares if len(shares) > 1 else (),
            )
        )
    return LaunchPlan(job_id, job, master_addr, master_port, tuple(nodes))


def _static_addr(host: Host) -> str | None:
    """A host's address for its peers, when known without a probe."""
    if host.is_local:
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host.address))
    except ValueError:
        return None


def node_template(job: JobSpec, host: Host, facts: HostFacts, job_id: str) -> NodeTemplate:
    """What one host of the job runs wherever it stands in the job (agent/kernel/placement.py:
    `render` places it): the job's command and env with placeholders unexpanded, and
    the host's python, workdir, env, GPUs, interface and address. A detached job's
    keeper renders the next attempt from these, on the hosts."""
    return NodeTemplate(
        job_id=job_id,
        launcher=job.launcher,
        entry=["script", job.script] if job.script else ["module", str(job.module)],
        local_rank_arg=job.local_rank_arg,
        max_restarts=job.max_restarts,
        args=list(job.args),
        env=dict(job.env),
        host=host.name,
        python=host.python,
        workdir=host.workdir,
        host_env=dict(host.env),
        gpus=list(host.gpus),
        iface=facts.iface,
        addr=facts.local_addr or _static_addr(host),
        warm=warm_options(job),
    )


def warm_options(job: JobSpec) -> WarmOptions:
    """What a node's supervisor needs to start warm (agent/node/warm/), or why not."""
    if job.cold:
        return WarmOptions(off=job.cold)
    return WarmOptions(preload=list(job.preload), idle=job.warm_idle)


def describe(plan: LaunchPlan) -> list[str]:
    """The plan as text: per host, its ranks, exact command and environment."""
    port = plan.master_port if plan.master_port is not None else UNKNOWN_PORT
    lines = [
        f"job {plan.job_id}",
        f"{plan.job.entry} on {len(plan.nodes)} nodes, world size {plan.world_size}"
        + ("" if plan.job.launcher == "torchrun" else f", launcher {plan.job.launcher}"),
        f"master {plan.master.host.name} at {plan.master_addr}:{port}",
    ]
    for node in plan.nodes:
        ranks = (
            f"r{node.first_rank}"
            if node.nproc == 1
            else f"r{node.ranks.start}-r{node.ranks.stop - 1}"
        )
        lines.append("")
        lines.append(
            f"[{node.host.name}] node rank {node.node_rank}, {node.nproc} processes ({ranks})"
        )
        lines.append(f"  cd {node.job_dir}")
        others = [name for name in node.shares if name != node.host.name]
        shared = f", shared with {', '.join(others)}" if others else ""
        lines.append(f"  # each rank runs in {node.code_dir}{shared}")
        for key in sorted(node.env):
            lines.append(f"  {key}={shlex.quote(node.env[key])}")
        if not any(v in node.env for v in IFNAME_VARS):
            lines.append(
                f"  GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME=<interface routing to {plan.master_addr}>"
            )
        lines.append("  " + shlex.join(node.argv))
    return lines
