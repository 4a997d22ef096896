"""What a Slurm job is made of, before anything is sent: the batch script, each node's
spec and the sbatch command. Pure: `orch submit --dry-run` prints these, unit tests
read them, and submit.py writes them on the login node.

The job root on the shared home (`<workdir>/jobs/<job id>`) holds the code snapshot
(code/, agent) as a push builds it, and beside it:

    slurm/batch.sh      the batch script sbatch runs (on the first node); srun starts
                        the agent's `slurm-node` on every node (agent/node/srun.py)
    slurm/spec.json     each node rank's args and env (0600: the env may hold secrets)
    slurm/batch-<id>.out  the batch script's own output (srun's complaints)
    slurm/exit-<id>.json  how srun ended, for where accounting is off
    <node name>/        a node's directory: torchrun.log, logs/rank-N.log, exit.json
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from orchestrator.agent.kernel import layout
from orchestrator.agent.kernel.requests import SlurmChain, SlurmNode, SlurmSpec
from orchestrator.agent.kernel.slurm import MASTER_ADDR_MARK, MASTER_PORT_MARK, SLURM_DIR
from orchestrator.agent.kernel.slurm_chain import ATTEMPT_ENV
from orchestrator.models import placeholders
from orchestrator.models.job import LEGACY_LAUNCH, PYTHON, JobSpec
from orchestrator.models.slurm import SlurmSection

BATCH = f"{SLURM_DIR}/batch.sh"
# The agent's launcher, from the version the job pinned (the job root's agent link).
LAUNCHER = f"{layout.AGENT}/{layout.RUN_SCRIPT} slurm-node"


def batch_output(slurm_id: str = "%j") -> str:
    return f"{SLURM_DIR}/batch-{slurm_id}.out"


def exit_record(slurm_id: str) -> str:
    return f"{SLURM_DIR}/exit-{slurm_id}.json"


@dataclass(frozen=True)
class SlurmJob:
    """A job as Slurm will run it: how many nodes, processes per node, where."""

    job: JobSpec
    job_id: str
    slurm: SlurmSection
    python: str  # on the compute nodes
    job_root: str  # on the shared home; may start with ~
    inventory: str = "<inventory>"  # its path, for messages

    @property
    def nodes(self) -> int:
        return self.job.nodes or 1

    @property
    def gpus(self) -> int:
        """GPUs per node asked of Slurm: the job's gpus_per_node, else the inventory's."""
        if self.job.gpus_per_node is not None:
            return self.job.gpus_per_node
        return self.slurm.gpus_per_node or 0

    @property
    def nproc(self) -> int:
        """Processes per node: the job's nproc_per_node, else one per GPU, else 1."""
        if self.job.nproc_per_node is not None:
            return self.job.nproc_per_node
        return self.gpus or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc


def node_specs(sj: SlurmJob) -> SlurmSpec:
    """The launcher's spec: per node rank, its args and env with the job's placeholders
    expanded, the master's address and port left as marks for the node to fill."""
    job = sj.job
    # launcher python: one process per node, its output the node's (`-`), as over SSH.
    logs = "-" if job.launcher == PYTHON else layout.LOGS
    entry = [f"{layout.AGENT}/{layout.RUN_SCRIPT}", "rank", logs, layout.CODE]
    entry += ["script", job.script] if job.script else ["module", str(job.module)]
    if job.launcher == LEGACY_LAUNCH and job.local_rank_arg:
        entry.append(job.local_rank_arg)
    entry.append("--")
    nodes = []
    for rank in range(sj.nodes):
        values = {
            "node_rank": str(rank),
            "num_nodes": str(sj.nodes),
            "master_addr": MASTER_ADDR_MARK,
            "master_port": MASTER_PORT_MARK,
            "nproc": str(sj.nproc),
            "nprocs_list": ",".join([str(sj.nproc)] * sj.nodes),
            "world_size": str(sj.world_size),
        }
        env = {k: placeholders.expand(v, values) for k, v in job.env.items()}
        env.update(
            ORCH_JOB_ID=sj.job_id,
            ORCH_NODE_RANK=str(rank),
            ORCH_NUM_NODES=str(sj.nodes),
            ORCH_NPROC=str(sj.nproc),
            ORCH_NPROCS_LIST=values["nprocs_list"],
            ORCH_WORLD_SIZE=str(sj.world_size),
            ORCH_ATTEMPT="0",
            PYTHONUNBUFFERED="1",
        )
        args = [placeholders.expand(a, values) for a in job.args]
        nodes.append(SlurmNode(nproc=sj.nproc, args=args, env=env))
    spec = SlurmSpec(job_id=sj.job_id, python=sj.python, entry=entry, nodes=nodes)
    spec.launcher, spec.max_restarts = job.launcher, job.max_restarts
    spec.port = job.rendezvous_port  # None: the master picks one
    return spec


def spec_json(sj: SlurmJob) -> str:
    return json.dumps(node_specs(sj).as_dict(), indent=1)


def batch_script(sj: SlurmJob) -> str:
    """The batch script: Slurm's options for the job, then one srun that starts the
    launcher on every node, then the record of how srun ended."""
    q = shlex.quote
    options = [
        f"--job-name={sj.job.name}",
        f"--nodes={sj.nodes}",
        "--ntasks-per-node=1",
        f"--output={batch_output()}",
        # Slurm requeues a batch job whose node failed (JobRequeue=1, its default): the
        # same job id ran again from the top under a follow that saw it end. A failed
        # node ends the job instead; restarts: starts the next attempt (slurm_chain.py).
        "--no-requeue",
    ]
    if sj.slurm.partition:
        options.append(f"--partition={sj.slurm.partition}")
    if sj.gpus:
        # Slurm's own GPU request, per node: --gres works under every select plugin
        # (--gpus-per-node needs cons_tres). The ranks see what Slurm gives them.
        options.append(f"--gres=gpu:{sj.gpus}")
    lines = ["#!/bin/sh", *(f"#SBATCH {option}" for option in options)]
    lines += [
        f"# orch job {sj.job_id}: one torchrun per node, {sj.nproc} processes each, "
        f"world size {sj.world_size}.",
        "# Node rank, master, port and interface are worked out on each node by the agent;",
        "# a rank that fails ends the whole allocation (--kill-on-bad-exit).",
        *restart_steps(sj)[0],
        f"srun --kill-on-bad-exit=1 --ntasks-per-node=1 --nodes={sj.nodes} \\",
        f'    {q(sj.python)} -I -S {LAUNCHER} "$PWD"' + (" &" if sj.job.restarts else ""),
        *restart_steps(sj)[1],
        "rc=$?",
        'printf \'{"returncode": %d, "ended": %s}\\n\' "$rc" "$(date +%s)" '
        f'> "{SLURM_DIR}/exit-$SLURM_JOB_ID.json"',
        *restart_steps(sj)[2],
        "exit $rc",
    ]
    return "\n".join(lines) + "\n"


def restart_steps(sj: SlurmJob) -> tuple[list[str], list[str], list[str]]:
    """A job with `restarts:`: the batch script's lines before srun (this attempt's
    number, skip or run, queue the next), while it runs (srun in the background,
    watched: a lost node would hold it until Slurm declares the node down) and after
    it (settle the next), as kernel/slurm_chain.py designs them; none without."""
    if not sj.job.restarts:
        return [], [], []
    step = f"{shlex.quote(sj.python)} -I -S {layout.AGENT}/{layout.RUN_SCRIPT} slurm-attempt"
    before = [
        f"# restarts: {sj.job.restarts}. Attempt $1 (0 the first) queues the next, which Slurm",
        "# starts if this one fails (--dependency=afternotok); it skips after a kill.",
        f"{ATTEMPT_ENV}=${{1:-0}}; export {ATTEMPT_ENV}",
        f'{step} begin "$PWD" "${ATTEMPT_ENV}" "${{2:-}}" || exit 0',
    ]
    during = [
        "srun_pid=$!",
        f'{step} watch "$PWD" "${ATTEMPT_ENV}" "$srun_pid"',
        'wait "$srun_pid"',
    ]
    after = [f'{step} end "$PWD" "${ATTEMPT_ENV}" "$rc"']
    return before, during, after


def chain_json(sj: SlurmJob) -> str:
    """slurm/chain.json: what a later attempt's sbatch needs (kernel/slurm_chain.py)."""
    return SlurmChain(restarts=sj.job.restarts, sbatch=list(sj.slurm.sbatch)).to_json()


def sbatch_argv(sj: SlurmJob) -> list[str]:
    """The sbatch command, run in the job root: the inventory's own options go on the
    command line, where they win over the script's."""
    return ["sbatch", "--parsable", *sj.slurm.sbatch, BATCH]


def sbatch_command(sj: SlurmJob, root_sh: str) -> str:
    """The sbatch command line for /bin/sh, in the job root (`root_sh`, quoted)."""
    return f"cd {root_sh} && {shlex.join(sbatch_argv(sj))}"


def describe(sj: SlurmJob) -> list[str]:
    """`orch submit --dry-run`: where it goes, the batch script and the sbatch command."""
    partition = sj.slurm.partition or "Slurm's default partition"
    lines = [
        f"job {sj.job_id}",
        f"{sj.job.entry} on {sj.nodes} Slurm nodes, {sj.nproc} processes each, "
        f"world size {sj.world_size}",
        f"login node {sj.slurm.login}, partition {partition}",
        f"code pushed to {sj.job_root}/{layout.CODE} on the shared home",
        "",
        f"# {sj.job_root}/{BATCH}",
        *batch_script(sj).rstrip("\n").splitlines(),
        "",
        f"cd {sj.job_root} && {shlex.join(sbatch_argv(sj))}",
    ]
    env = node_specs(sj).nodes[0].env
    lines.append("")
    lines.append("# each node's environment (node rank 0 shown), beside Slurm's own:")
    for key in sorted(env):
        value = (
            str(env[key]).replace(MASTER_ADDR_MARK, "<master>").replace(MASTER_PORT_MARK, "<port>")
        )
        lines.append(f"  {key}={shlex.quote(value)}")
    lines.append("  GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME=<interface routing to the master>")
    lines.append("  ORCH_SLURM_JOB_ID=<the Slurm job id>, ORCH_HOSTS=<the allocated nodes>")
    if sj.job.launcher == PYTHON:  # the script spawns its own processes, once per node
        lines.append("  MASTER_ADDR=<master>, MASTER_PORT=<port>, NODE_RANK=<node rank>")
    return lines
