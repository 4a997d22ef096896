"""What orch cannot do on a Slurm cluster yet, in one list: each refusal's words and
the way around it. Every such refusal goes through `refuse`, as one error
(Unsupported, exit 2); a feature that comes to Slurm leaves this list."""

from __future__ import annotations

from typing import NoReturn

from orchestrator.models.errors import Unsupported

# feature -> (what is refused, the way around it)
NOT_YET: dict[str, tuple[str, str]] = {
    "plan": (
        "a launch plan is not made for a Slurm cluster: Slurm picks the nodes at start",
        "orch submit --dry-run prints the batch script and the sbatch command",
    ),
    "warm": (
        "no warm interpreter waits on a Slurm cluster: each job gets an allocation of its "
        "own, and nothing of a user runs on its nodes between jobs",
        "a Slurm job's ranks start cold; warm starts are for the inventory's SSH hosts",
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
