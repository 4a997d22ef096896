"""`orch check -i hpc.yaml [JOB.yaml] [--compute]` for a Slurm cluster: the login node,
Slurm's commands there, the partition and its nodes, and (with --compute) a one-node
probe through srun of what the compute nodes run: python, torch, GPUs."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.models.errors import InfraError, OrchError
from orchestrator.models.inventory import Inventory
from orchestrator.models.job import JobSpec
from orchestrator.nodes.group import HostGroup
from orchestrator.slurm.login import LoginNode
from orchestrator.slurm.nodes import check_gpus, partition_nodes
from orchestrator.slurm.submit import check_partition, slurm_job
from orchestrator.transport import ConnectOptions

PROBE_TIMEOUT_S = 120
# Run with the compute nodes' python by srun: versions without importing torch twice.
_PROBE = (
    "import json, platform, socket\n"
    "found = {'host': socket.gethostname(), 'python': platform.python_version()}\n"
    "try:\n"
    "    import torch\n"
    "    found['torch'] = torch.__version__\n"
    "    found['gpus'] = torch.cuda.device_count()\n"
    "except Exception as exc:\n"
    "    found['error'] = f'{type(exc).__name__}: {exc}'\n"
    "print(json.dumps(found))\n"
)


@dataclass
class SlurmCheck:
    """What `orch check` found: lines to show, and the errors among them."""

    lines: list[str] = field(default_factory=list)
    errors: list[OrchError] = field(default_factory=list)


def run_check(
    inventory: Inventory,
    job: JobSpec | None,
    compute: bool,
    notice: Callable[[str], None],
) -> SlurmCheck:
    """Check the login node, Slurm's commands, the partition (for `job`, its node count)
    and, with `compute`, a one-node srun probe."""
    found = SlurmCheck()
    login = inventory.hosts[0]
    with HostGroup([login], ConnectOptions(notice=notice)) as group:
        try:
            group.connect()
        except OrchError as exc:
            found.errors.append(exc)
            return found
        node = LoginNode(login, group.transports[login.name])
        found.lines.append(f"login node {login.name}: reachable")
        try:
            node.require_tools()
        except OrchError as exc:
            found.errors.append(exc)
            return found
        found.lines.append("slurm: sbatch, srun, squeue, scancel and sinfo found")
        partitions = node.partitions()
        for p in partitions.values():
            flags = (
                ", ".join(f for f, on in (("up", p.available), ("default", p.default)) if on)
                or "down"
            )
            found.lines.append(f"partition {p.name}: {p.nodes} nodes ({flags})")
        spec = job or _probe_job(inventory)
        try:
            sj = slurm_job(spec, inventory, f"{spec.name}-check")
            name = check_partition(sj, partitions)
            if sj.gpus:
                check_gpus(sj, name, partition_nodes(node, name))
            if job is not None:
                found.lines.append(f"job {job.name}: {sj.nodes} nodes of partition {name}: ok")
        except OrchError as exc:
            found.errors.append(exc)
            return found
        if compute:
            found.lines.append(_probe(node, name, login.python, found))
    return found


def _probe_job(inventory: Inventory) -> JobSpec:
    """A one-node job: what the partition check needs when no job file was given."""
    return JobSpec(inventory.path, "check", Path("."), script="-", module=None, nodes=1)


def _probe(node: LoginNode, partition: str, python: str, found: SlurmCheck) -> str:
    command = (
        f"srun --nodes=1 --ntasks=1 --partition={shlex.quote(partition)} "
        f"--time=5 {shlex.quote(python)} -c {shlex.quote(_PROBE)}"
    )
    result = node.transport.run(command, timeout=PROBE_TIMEOUT_S)
    reply = None
    for line in reversed(result.stdout.splitlines()):
        try:
            reply = json.loads(line)
            break
        except ValueError:
            continue
    if not result.ok or not isinstance(reply, dict):
        tail = (result.stderr.strip() or result.stdout.strip())[-500:]
        found.errors.append(
            InfraError(
                f"the compute probe (srun on partition {partition}) failed: {tail}",
                f"check slurm.python ({python}) exists on the compute nodes",
            )
        )
        return "compute probe: failed"
    if "error" in reply:
        found.errors.append(
            InfraError(
                f"torch does not import on {reply['host']} with {python}: {reply['error']}",
                "point slurm.python at an interpreter with torch on the shared filesystem",
            )
        )
    return (
        f"compute probe on {reply['host']}: python {reply['python']}, "
        f"torch {reply.get('torch', 'missing')}, {reply.get('gpus', 0)} GPUs"
    )
