"""`orch submit` on a Slurm cluster: check -> push -> write the batch script -> sbatch
-> follow. Nothing here prints: the user hears through the Reporter, as for SSH hosts.

Everything goes through the login node's one SSH connection; the compute nodes are
Slurm's, and see the code through the shared home.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.agent.kernel import layout
from orchestrator.agent.kernel.slurm import SPEC
from orchestrator.agent.kernel.slurm_chain import CHAIN
from orchestrator.models.errors import InfraError, InputError, Interrupted, OrchError
from orchestrator.models.inventory import Host, Inventory
from orchestrator.models.job import JobSpec
from orchestrator.models.states import JobState
from orchestrator.nodes import envs, ops
from orchestrator.nodes.group import HostGroup
from orchestrator.nodes.probe import probe_host
from orchestrator.nodes.shell import sh_path
from orchestrator.records.db import JobDB, JobRecord
from orchestrator.reporting.reporter import ProgressReporter, Reporter, phase
from orchestrator.slurm import script
from orchestrator.slurm.login import LoginNode
from orchestrator.slurm.nodes import check_gpus, partition_nodes
from orchestrator.slurm.outputs import bring_outputs
from orchestrator.slurm.queue import Partition
from orchestrator.slurm.restarts import follow_attempts
from orchestrator.slurm.script import SlurmJob
from orchestrator.slurm.section import section_of
from orchestrator.sync.ignore import collect_files
from orchestrator.sync.manifest import Tree, scan_workdir
from orchestrator.sync.push import push
from orchestrator.sync.store import environment_digest_of, setup_key
from orchestrator.sync.wheels import carried, downloaded
from orchestrator.transport import ConnectOptions

log = logging.getLogger(__name__)


def slurm_job(job: JobSpec, inventory: Inventory, job_id: str) -> SlurmJob:
    """The job as Slurm will run it, once its keys make sense there.

    Raises:
        SpecError: a key that only makes sense for SSH hosts (exit 2), with the Slurm
            way to say it in the hint.
        Unsupported: a key Slurm cannot do yet (exit 2; slurm/unsupported.py).
    """
    if job.hosts:
        raise job.error(
            "hosts",
            f"hosts: names SSH hosts, but {inventory.path} is a Slurm cluster",
            "let Slurm pick the nodes (nodes: N), or name them in the inventory: "
            "slurm: {sbatch: [--nodelist=node1,node2]}",
        )
    if job.priority != "normal":
        raise job.error(
            "priority",
            f"priority: {job.priority} orders a shared SSH host's line, but {inventory.path} "
            "is a Slurm cluster, whose own priorities and fair share order its jobs",
            "leave priority: (and --priority) out, or ask Slurm in the inventory: "
            "slurm: {sbatch: [--nice=100]} to go after others, or a QOS of your cluster's",
        )
    if job.labels:
        raise job.error(
            "labels",
            f"labels: selects SSH hosts, but {inventory.path} is a Slurm cluster",
            "ask Slurm for node features in the inventory: slurm: {sbatch: [--constraint=a100]}",
        )
    if job.stall_after is not None:
        from orchestrator.slurm.unsupported import refuse_key

        refuse_key("stall_after", job.where("stall_after"))
    if job.forward:
        from orchestrator.slurm.unsupported import refuse_key

        refuse_key("forward", job.where("forward"))
    if job.notify is not None:  # the job's own or --notify; the user's default is SSH's
        from orchestrator.slurm.unsupported import refuse_key

        refuse_key("notify", job.where("notify"))
    login = inventory.hosts[0]
    root = layout.job_root(login.workdir, job_id)
    return SlurmJob(job, job_id, section_of(inventory), login.python, root, inventory.path)


@dataclass(frozen=True)
class _Setup:
    """What ops.setup needs of a node: here the job root on the login node."""

    host: Host
    job_dir: str
    node_rank: int = 0
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def check_partition(sj: SlurmJob, partitions: dict[str, Partition]) -> str:
    """The partition the job goes to, once it exists and has enough nodes.

    Raises:
        InputError: an unknown partition (naming the inventory), or more nodes than it has
            (naming the job file's nodes:).
    """
    wanted = sj.slurm.partition
    default = next((p.name for p in partitions.values() if p.default), None)
    name = wanted or default
    if name is None or name not in partitions:
        known = ", ".join(sorted(partitions)) or "none"
        what = f"partition '{wanted}'" if wanted else "a default partition"
        raise InputError(
            f"{sj.inventory}: slurm.partition: the cluster has no {what}",
            f"partitions on {sj.slurm.login}: {known}",
        )
    found = partitions[name]
    if sj.nodes > found.nodes:
        raise sj.job.error(
            "nodes",
            f"nodes={sj.nodes} but Slurm partition '{name}' has {found.nodes} nodes",
            f"lower nodes, or pick a larger partition in {sj.inventory} (sinfo lists them)",
        )
    return name


def submit(
    sj: SlurmJob,
    login: Host,
    reporter: Reporter,
    detach: bool = False,
    store: JobDB | None = None,
    outputs_dir: Path | None = None,
) -> int:
    """Submit a job through the login node and, unless detached, follow it to its end.

    Args:
        outputs_dir: where the job's `outputs:` come back to when it ends (default
            ./orch-outputs/ID).

    Returns:
        0 when the job succeeded (or, detached, once Slurm accepted it).

    Raises:
        InputError: the partition, node count or sbatch refused it (nothing queued).
        InfraError: the login node is unreachable or lacks Slurm's commands.
        JobFailed: a rank failed (the allocation is gone) or Slurm ended the job.
        Interrupted: Ctrl-C; the job was cancelled and its allocation is gone.
    """
    store = store or JobDB()
    tree = carried(sj.job, scan_workdir(sj.job.workdir, sj.job.exclude))
    environment_digest_of(sj.job, tree)  # `wheels:` that carry none: refused before any host
    with HostGroup([login], ConnectOptions(notice=reporter.notice)) as group:
        phase(reporter, f"connecting to the login node {login.name}")
        group.connect()
        login_node = LoginNode(login, group.transports[login.name])
        phase(reporter, "asking Slurm")
        partition = check_partition(sj, login_node.survey())
        if sj.gpus:
            check_gpus(sj, partition, partition_nodes(login_node, partition))
        # `wheels: download`: for the login node's python, which builds the environment
        # in the shared home for every node; before anything is recorded or queued.
        tree = _with_downloads(sj, login_node, tree, reporter)
        store.add(record_of(sj, partition, login))
        reporter.job_started(sj.job_id)
        try:
            phase(reporter, f"pushing {tree.total_bytes / 1e6:.1f} MB of code")
            keys = (
                {login.name: setup_key(sj.job.setup, tree.digest, login.python)}
                if sj.job.setup
                else {}
            )
            progress = reporter.progress if isinstance(reporter, ProgressReporter) else None
            pushed = push(group, tree, {login.name: sj.job_root}, keys, progress)
            if sj.job.environment is not None:
                sj = _ensure_environment(sj, login_node, tree, reporter)
            if sj.job.setup and not pushed[login.name].setup_done:
                _setup(sj, login_node, keys[login.name], tree.digest, reporter)
            phase(reporter, "sbatch")
            slurm_id = login_node.write_and_sbatch(
                {
                    f"{sj.job_root}/{script.BATCH}": (script.batch_script(sj), 0o700),
                    f"{sj.job_root}/{SPEC}": (script.spec_json(sj), 0o600),
                    **(
                        {f"{sj.job_root}/{CHAIN}": (script.chain_json(sj), 0o600)}
                        if sj.job.restarts
                        else {}
                    ),
                },
                script.sbatch_command(sj, sh_path(sj.job_root)),
            )
        except OrchError:
            store.update_job(sj.job_id, JobState.FAILED, 1)
            raise
        except KeyboardInterrupt:
            store.update_job(sj.job_id, JobState.KILLED, 1)
            raise Interrupted("interrupted before the job was queued: nothing was") from None
        store.update_spec(
            sj.job_id, slurm={**_slurm_spec(sj, partition, login), "job_id": slurm_id}
        )
        reporter.notice(f"slurm job {slurm_id} on partition {partition}")
        if detach:
            return 0
        try:
            return follow_attempts(store.get(sj.job_id), login_node, reporter, store, attached=True)
        finally:
            bring_outputs(store.get(sj.job_id), login_node, outputs_dir, reporter.notice)


def record_of(sj: SlurmJob, partition: str, login: Host) -> JobRecord:
    """The job's record before sbatch: no nodes (Slurm picks them), its Slurm details."""
    spec = {
        "path": sj.job.path,
        "entry": sj.job.entry,
        "args": list(sj.job.args),
        "workdir": str(sj.job.workdir),
        "backend": "slurm",
        "outputs": list(sj.job.outputs),
        "outputs_from": sj.job.outputs_from,
        "metrics": list(sj.job.metrics),
        "slurm": _slurm_spec(sj, partition, login),
        "restarts": sj.job.restarts,
        "attempt": 0,
    }
    return JobRecord(sj.job_id, sj.job.name, JobState.PENDING, "", sj.job.rendezvous_port, spec)


def _slurm_spec(sj: SlurmJob, partition: str, login: Host) -> dict[str, object]:
    return {
        "host": dataclasses.asdict(login),
        "job_id": None,
        "partition": partition,
        "login": sj.slurm.login,
        "job_root": sj.job_root,
        "nodes": sj.nodes,
        "nproc": sj.nproc,
    }


def _with_downloads(sj: SlurmJob, login: LoginNode, tree: Tree, reporter: Reporter) -> Tree:
    """`tree` with the wheels of a job with `wheels: download`, downloaded for what the
    login node's python installs (its probe says); any other job's tree as it is.

    Raises:
        InfraError: the probe or the download failed (the packages, the login node).
    """
    env = sj.job.environment
    if env is None or not env.download:
        return tree
    target = probe_host(login.host, login.transport, gpus=False, target=True).facts.wheel_target
    if target is None:
        raise InfraError(
            f"environment: the login node {login.host.name} did not say what wheels its "
            "python installs (wheels: download)",
            "check that its python's sysconfig works; or give the job a directory of "
            "wheels (wheels: DIR)",
        )
    return downloaded(sj.job, tree, {f"the login node {login.host.name}": target}, reporter.notice)


def _ensure_environment(sj: SlurmJob, login: LoginNode, tree: Tree, reporter: Reporter) -> SlurmJob:
    """The job's environment, built once on the login node in the shared home (where
    missing), which the compute nodes share: the job then runs with its python.

    Raises:
        InfraError: the build failed (the packages not found, or the installer's words).
    """
    env = sj.job.environment
    assert env is not None
    digest = environment_digest_of(sj.job, tree)
    assert digest is not None
    job_env = {**login.host.env, **sj.job.env}
    ready = envs.ensure(login.host, login.transport, sj.job_root, env, digest, job_env)
    if ready.error is not None or not ready.python:
        raise envs.failure(env, {login.host.name: ready})
    if ready.built:
        reporter.notice(
            f"environment: built on the login node {envs.built_at(login.host.name, ready)}"
        )
    return dataclasses.replace(sj, python=ready.python)


def _setup(sj: SlurmJob, login: LoginNode, key: str, digest: str, reporter: Reporter) -> None:
    """The job's `setup:` once per code version, on the login node: the compute nodes
    share its home, as hosts sharing a filesystem share one setup."""
    assert sj.job.setup is not None
    target = _Setup(login.host, sj.job_root, env=dict(sj.job.env))
    reporter.notice(f"setup: running on the login node {login.host.name}")

    def line(text: str) -> None:
        reporter.output(f"{login.host.name} setup", None, (text + "\n").encode())

    python = sj.python if sj.job.environment is not None else None
    ops.setup(target, login.transport, sj.job.setup, key, digest, line, python)


def dry_run(job: JobSpec, inventory: Inventory) -> list[str]:
    """`orch submit --dry-run` for a Slurm inventory: the batch script and the sbatch
    command, touching no host.

    Raises:
        InputError: a job key the Slurm cluster refuses.
    """
    sj = slurm_job(job, inventory, f"{job.name}-<id>")
    files = collect_files(job.workdir, job.exclude)
    return [*script.describe(sj), "", f"pushes {len(files)} files from {job.workdir}"]
