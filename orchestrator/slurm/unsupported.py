"""What orch cannot do on a Slurm cluster, in one list: each verb's words, why, and the
way around it. Every such refusal goes through `refuse`, as the protocol's one error
(Unsupported, exit 2, naming the verb and the backend), before anything is
contacted; a verb that comes to Slurm leaves this list."""

from __future__ import annotations

from typing import NoReturn

from orchestrator.models.errors import Unsupported

BACKEND = "slurm"
_NO_WARM = (
    "no warm interpreter waits on a Slurm cluster: each job gets an allocation of its "
    "own, and nothing of a user runs on its nodes between jobs"
)
_COLD = "a Slurm job's ranks start cold; warm starts are for the inventory's SSH hosts"

# verb -> (the verb as the user names it, why Slurm cannot, the way around it)
NOT_YET: dict[str, tuple[str, str, str]] = {
    "plan": (
        "api.plan",
        "a launch plan is not made for a Slurm cluster: Slurm picks the nodes at start",
        "orch submit --dry-run prints the batch script and the sbatch command",
    ),
    "warm_start": ("orch warm JOB", _NO_WARM, _COLD),
    "warm_list": ("orch warm", _NO_WARM, _COLD),
    "warm_stop": ("orch warm --stop", _NO_WARM, _COLD),
    "gc": (
        "orch gc",
        "a Slurm job's code, logs and outputs are in its own job directory on the shared "
        "home, not in a store on each node",
        "remove the job directories you no longer need on the login node (orch status "
        "JOB --json names each job's)",
    ),
    "envs": (
        "orch env",
        "a Slurm cluster's environments are built on the login node, in the shared home, "
        "and orch env does not list them there yet",
        "on the login node: ls -l WORKDIR/envs (each one's orch-env.json says what it holds)",
    ),
    "exec": (
        "orch exec",
        "the partition's nodes are Slurm's to hand out, and only the login node is in the "
        "inventory: a command would run there, not on the nodes",
        "run it on the nodes through Slurm, on the login node: srun -N NODES COMMAND",
    ),
    "bench_allreduce": (
        "orch bench allreduce",
        "the sweep picks the inventory's hosts by name, and a Slurm inventory names only "
        "its login node",
        "run an all_reduce sweep of your own as a job: orch submit -i INVENTORY JOB.yaml",
    ),
}


def refuse(verb: str, where: str = "") -> NoReturn:
    """Refuse what Slurm cannot do.

    Args:
        verb: a key of NOT_YET (the Backend protocol's method).
        where: the inventory, or the job file's key, that asked for it.

    Raises:
        Unsupported: always.
    """
    said, why, hint = NOT_YET[verb]
    raise Unsupported.verb(said, BACKEND, why, hint, where)


# job key -> (why Slurm cannot take it yet, the way around it)
KEYS_NOT_YET: dict[str, tuple[str, str]] = {
    "stall_after": (
        "the stall watchdog runs in an SSH job's controller or its keeper, and a Slurm "
        "job has neither yet",
        "drop stall_after: (and --stall-after) there; when the job seems hung, look with: "
        "orch stack JOB",
    ),
    "forward": (
        "an attached Slurm submit does not open the job's forwards yet",
        "drop forward: there; once the job runs: orch forward JOB PORT (the server on the "
        "node listening on 0.0.0.0)",
    ),
    "notify": (
        "a detached SSH job's keeper sends it from the job's host, and a Slurm job has no "
        "keeper yet",
        "drop notify: (and --notify) there; Slurm mails the job's end itself: "
        "slurm: {sbatch: [--mail-type=END,FAIL, --mail-user=you@example.com]} in the inventory",
    ),
}


def refuse_key(key: str, where: str) -> NoReturn:
    """Refuse a job key that Slurm cannot do yet.

    Raises:
        Unsupported: always, at `where` (the key in the job file).
    """
    why, hint = KEYS_NOT_YET[key]
    raise Unsupported(f"{key}: is not for the {BACKEND} backend yet: {why}", hint, where)
