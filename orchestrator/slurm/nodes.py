"""A Slurm partition's nodes as `orch status --hosts` shows them, and the GPU check of
a job against them: `sinfo --Node` for each node's GPUs (its GRES) and CPUs, `squeue`
for the jobs that hold them or wait. Reading is pure; the queries are in `partition_view`.

A node with GPUs shows a row per GPU; one without, a row per CPU (a slot). Slurm says
how many GPUs (or CPUs) a job holds on a node, not which: the rows give each running
job its count in turn. A job submitted from this machine shows as its orch id.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from orchestrator.agent.kernel.slurm import expand_nodelist
from orchestrator.models.errors import InputError, OrchError, RemoteCommandError
from orchestrator.models.inventory import Inventory
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobDB
from orchestrator.reporting.hosts import HostsView, QueueRow, UnitRow
from orchestrator.slurm.login import LoginNode
from orchestrator.slurm.script import SlurmJob
from orchestrator.slurm.section import section_of
from orchestrator.transport import ConnectOptions

NODE_FORMAT = "%N|%P|%G|%c|%T"
JOB_FORMAT = "%i|%u|%T|%N|%b|%C|%D|%S|%V|%j"
_HOLDING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING"}


@dataclass(frozen=True)
class SlurmNode:
    """One node of a partition, as `sinfo --Node` shows it."""

    name: str
    gpus: int  # count of its `gpu` GRES (0: none)
    cpus: int
    state: str  # idle, allocated, mixed, down ...


@dataclass(frozen=True)
class SlurmQueueJob:
    """A job in the partition, as squeue shows it: who, how much per node, since when."""

    slurm_id: str
    user: str
    state: str
    nodes: tuple[str, ...]
    gpus: int  # per node
    cpus: int  # per node
    since: float | None
    name: str


def gres_gpus(gres: str) -> int:
    """The GPUs in a GRES string: `gpu:2`, `gpu:a100:4(S:0-1)`, `gres:gpu:2`,
    `gres/gpu=2`, several comma-separated; `(null)` or none: 0."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres):
        item = re.sub(r"\(.*?\)", "", item.strip())
        item = re.sub(r"^gres[:/]", "", item)
        parts = re.split(r"[:=]", item)
        if parts[0] != "gpu":
            continue
        total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return total


def parse_nodes(text: str, partition: str) -> list[SlurmNode]:
    """`sinfo --Node --noheader --format=NODE_FORMAT`: the partition's nodes, once each."""
    found: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5 or fields[1].rstrip("*") != partition:
            continue
        name, _, gres, cpus, state = fields
        found[name] = SlurmNode(name, gres_gpus(gres), int(cpus) if cpus.isdigit() else 1, state)
    return [found[name] for name in sorted(found)]


def _epoch(stamp: str) -> float | None:
    """Slurm's local ISO time (`2026-11-25T19:30:02`) as seconds since the epoch."""
    try:
        return float(time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None


def parse_jobs(text: str) -> list[SlurmQueueJob]:
    """`squeue --noheader --format=JOB_FORMAT`: the partition's jobs, pending or holding."""
    jobs = []
    for line in text.splitlines():
        fields = line.strip().split("|", 9)
        if len(fields) != 10 or not fields[0]:
            continue
        slurm_id, user, state, nodelist, gres, cpus, count, start, submit, name = fields
        nodes = tuple(expand_nodelist(nodelist)) if nodelist and nodelist != "(null)" else ()
        per_node = int(cpus) // max(1, int(count)) if cpus.isdigit() and count.isdigit() else 1
        since = _epoch(start) if state in _HOLDING else _epoch(submit)
        jobs.append(
            SlurmQueueJob(slurm_id, user, state, nodes, gres_gpus(gres), per_node, since, name)
        )
    return jobs


def unit_rows(
    nodes: list[SlurmNode], jobs: list[SlurmQueueJob], orch_ids: Mapping[str, str]
) -> list[UnitRow]:
    """A row per GPU (or CPU, where a node has none) of each node: free, or held by the
    job that Slurm runs there (`orch_ids`: the orch id of a Slurm job from here)."""
    rows: list[UnitRow] = []
    for node in nodes:
        kind = "gpu" if node.gpus else "slot"
        units = node.gpus or node.cpus
        holders = []
        for job in jobs:
            if job.state in _HOLDING and node.name in job.nodes:
                holders += [job] * (job.gpus if kind == "gpu" else job.cpus)
        for unit in range(units):
            row = UnitRow(node.name, kind, unit, "free")
            if node.state.rstrip("*~#!%$@^-") in ("down", "drained", "draining", "fail"):
                row = replace(row, state=node.state)
            if unit < len(holders):
                job = holders[unit]
                row = replace(
                    row,
                    state="held",
                    job=orch_ids.get(job.slurm_id, f"slurm {job.slurm_id} ({job.name})"),
                    user=job.user,
                    since=job.since,
                )
            rows.append(row)
    return rows


def queue_rows(
    partition: str, jobs: list[SlurmQueueJob], orch_ids: Mapping[str, str]
) -> list[QueueRow]:
    """The partition's pending jobs, in squeue's order (Slurm's priority)."""
    pending = [j for j in jobs if j.state == "PENDING"]
    return [
        QueueRow(
            partition,
            i + 1,
            orch_ids.get(j.slurm_id, f"slurm {j.slurm_id} ({j.name})"),
            j.user,
            "gpu" if j.gpus else "slot",
            j.gpus or j.cpus,
            j.since,
        )
        for i, j in enumerate(pending)
    ]


def partition_nodes(login: LoginNode, partition: str) -> list[SlurmNode]:
    """Raises: RemoteCommandError: sinfo failed."""
    fmt = shlex.quote(NODE_FORMAT)
    result = login.run(
        f"sinfo --Node --noheader --partition={shlex.quote(partition)} --format={fmt}"
    )
    if not result.ok:
        raise RemoteCommandError(login.host.name, "sinfo --Node", result.exit_code, result.stderr)
    return parse_nodes(result.stdout, partition)


def partition_jobs(login: LoginNode, partition: str) -> list[SlurmQueueJob]:
    """Raises: RemoteCommandError: squeue failed."""
    fmt = shlex.quote(JOB_FORMAT)
    result = login.run(
        f"squeue --noheader --partition={shlex.quote(partition)} "
        f"--states=PENDING,RUNNING,COMPLETING,SUSPENDED --format={fmt}"
    )
    if not result.ok:
        raise RemoteCommandError(login.host.name, "squeue", result.exit_code, result.stderr)
    return parse_jobs(result.stdout)


def check_gpus(sj: SlurmJob, partition: str, nodes: list[SlurmNode]) -> None:
    """Refuse a job that asks more GPUs per node than enough of the partition's nodes
    have, before sbatch does with its terse 'Requested node configuration is not
    available'.

    Raises:
        InputError: naming the job file's gpus_per_node (or the inventory's).
    """
    if not sj.gpus or not nodes:
        return
    enough = [n for n in nodes if n.gpus >= sj.gpus]
    if len(enough) >= sj.nodes:
        return
    most = max(n.gpus for n in nodes)
    what = f"gpus_per_node={sj.gpus} on {sj.nodes} node{'s' if sj.nodes != 1 else ''}"
    said = (
        f"{len(enough)} of Slurm partition '{partition}''s nodes have {sj.gpus} GPUs"
        if enough
        else f"the nodes of Slurm partition '{partition}' have at most {most} GPUs"
    )
    hint = f"lower gpus_per_node (at most {most}), or pick a partition with more GPUs"
    if sj.job.gpus_per_node is not None:
        raise sj.job.error("gpus_per_node", f"{what}, but {said}", hint)
    raise InputError(f"{sj.inventory}: slurm.gpus_per_node: {what}, but {said}", hint)


def hosts(
    inventory: Inventory, notice: Callable[[str], None], store: JobDB | None = None
) -> HostsView:
    """`orch status --hosts` of a Slurm inventory: the unit rows of its partition's
    nodes, the partition's pending jobs, and the error when the login node or Slurm did
    not answer (then no rows)."""
    host = inventory.hosts[0]
    with HostGroup([host], ConnectOptions(notice=notice)) as group:
        try:
            group.connect()
            login = LoginNode(host, group.transports[host.name])
            partition = section_of(inventory).partition or next(
                (p.name for p in login.partitions().values() if p.default), ""
            )
            nodes = partition_nodes(login, partition)
            jobs = partition_jobs(login, partition)
        except OrchError as exc:
            return HostsView(errors=(exc,))
    ids = slurm_ids(store or JobDB())
    return HostsView(tuple(unit_rows(nodes, jobs, ids)), tuple(queue_rows(partition, jobs, ids)))


def slurm_ids(store: JobDB) -> dict[str, str]:
    """The orch id of every Slurm job submitted from here, by Slurm job id."""
    found = {}
    for record in store.jobs():
        slurm_id = (record.spec.get("slurm") or {}).get("job_id")
        if slurm_id:
            found[str(slurm_id)] = record.id
    return found
