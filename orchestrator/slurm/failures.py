"""How a Slurm job that Slurm itself ended is told: one error naming Slurm's word
(TIMEOUT, NODE_FAIL, PREEMPTED ...) and the nodes it concerns, and a hint for that
cause. Pure: follow.py's conclude raises it."""

from __future__ import annotations

from orchestrator.agent.kernel.slurm_chain import state_word

# Slurm's words for a job Slurm ended, not one of its ranks: a rank's last lines are
# then the consequence, not the cause.
ENDED_BY_SLURM = ("NODE_FAIL", "TIMEOUT", "PREEMPTED", "BOOT_FAIL", "DEADLINE")

_HINTS = {
    "NODE_FAIL": (
        "Slurm lost a node of the job (on the login node, sinfo -R says why); "
        "restarts: N in the job file starts it again without that node"
    ),
    "TIMEOUT": (
        "the job ran past its time limit: raise it in the inventory, "
        "slurm: {sbatch: [--time=HH:MM:SS]} (sinfo shows the partition's most)"
    ),
    "PREEMPTED": (
        "a job of higher priority took its nodes: submit it again, or pick a partition "
        "without preemption in the inventory (slurm: partition)"
    ),
    "BOOT_FAIL": "a node of the job did not boot: sinfo -R on the login node says which",
    "DEADLINE": "the job could not end before its --deadline: raise or drop it",
    "OUT_OF_MEMORY": "a rank ran out of memory: ask for more, slurm: {sbatch: [--mem=...]}",
}


def ended_by_slurm(slurm_state: str) -> bool:
    return state_word(slurm_state) in ENDED_BY_SLURM


def slurm_ending(
    job_id: str, final: str, slurm_id: str, slurm_state: str, nodes: list[str], batch_output: str
) -> tuple[str, str]:
    """The error and hint for a job Slurm ended (or that ended without a rank's own
    failure), naming the nodes Slurm stopped where it matters (a lost node)."""
    word = state_word(slurm_state) or "UNKNOWN"
    where = f" (node {', '.join(nodes)})" if nodes and word == "NODE_FAIL" else ""
    message = f"job {job_id} {final}: Slurm job {slurm_id} ended {word}{where}"
    hint = _HINTS.get(word, f"see: orch logs {job_id}")
    return message, f"{hint}; the batch script's output: {batch_output} on the login node"
