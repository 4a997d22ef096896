"""What orch cannot do on a Slurm cluster yet, in one list: each refusal's words and
the way around it. Every such refusal goes through `refuse`, as one error
(Unsupported, exit 2); a feature that comes to Slurm leaves this list."""

from __future__ import annotations

from typing import NoReturn

from orchestrator.models.errors import Unsupported

# feature -> (what is refused, the way around it)
NOT_YET: dict[str, tuple[str, str]] = {
    "outputs": (
        "outputs: is not brought back from a Slurm cluster yet",
        "leave outputs: out; the job's ORCH_OUTPUT_DIR is on the shared home",
    ),
    "launcher": (
        "launcher: python is not supported on a Slurm cluster yet",
        "leave launcher: out (torchrun)",
    ),
    "plan": (
        "a launch plan is not made for a Slurm cluster yet: Slurm picks the nodes at start",
        "orch submit --dry-run prints the batch script and the sbatch command",
    ),
    "top": (
        "orch top does not watch a Slurm job yet",
        "on the login node: sstat -j SLURM_ID (orch status shows the Slurm id)",
    ),
    "pull": (
        "orch pull does not copy a Slurm job's outputs yet",
        "its ORCH_OUTPUT_DIR is on the cluster's shared home: copy it from the login node",
    ),
    "hosts": (
        "orch status --hosts does not show a Slurm cluster's nodes yet",
        "on the login node: sinfo -N",
    ),
}


def refuse(feature: str, where: str = "") -> NoReturn:
    """Refuse what Slurm cannot do yet.

    Args:
        feature: a key of NOT_YET.
        where: the job file's key or the job that asked for it.

    Raises:
        Unsupported: always.
    """
    message, hint = NOT_YET[feature]
    raise Unsupported(message, hint, where)
