"""A Slurm job's restarts (`restarts: N`), as a chain of batch jobs: the names and pure
rules that the controller and the batch script's own steps (node/chain.py) both use.
Standard library only, valid on Python 3.8.

Why a chain of batch jobs, and not restarts inside the allocation: an allocation
cannot take a new node in place of one that died (Slurm shrinks it or ends it,
NODE_FAIL), and the batch script runs on the allocation's first node, which may be
the one that died. So each attempt is a Slurm job of its own, and when it starts it
queues the next one at once, `--dependency=afternotok:<its own id>`: Slurm itself starts
the next attempt once this one ends in any failed state (a rank's exit, NODE_FAIL),
even when the node that ran the batch script is gone, with no laptop and no daemon of
ours. What the next attempt then does:

- it runs when the previous one FAILED (a rank), or Slurm ended it for a node
  (NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY): `restartable`;
- it skips (writes why, runs nothing) when the previous one was cancelled (`orch
  kill`, Ctrl-C, a person's scancel), timed out or was preempted: a restart would only
  meet the same time limit or the same preemption; and when `slurm/killed` exists;
- the previous attempt's own end step, where its batch script lived to run it, cancels
  the next job on success, and otherwise leaves out the nodes that failed
  (`scontrol update ExcNodeList`) when the partition has enough others (`exclude`).

Files in the job root's `slurm/` (beside batch.sh and spec.json):

    chain.json          restarts, the inventory's sbatch options (to queue the next)
    attempt-<k>.json    attempt k (0 the first): its Slurm id, when it began, the next
                        attempt's Slurm id; at its end its returncode, the nodes that
                        failed and those left out of the next; or why it was skipped
    killed              orch kill or Ctrl-C: no attempt starts after it
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

CHAIN = "slurm/chain.json"
KILLED_MARK = "slurm/killed"
ATTEMPT_ENV = "ORCH_ATTEMPT"

# Slurm's words for an ended job that a restart may follow.
RESTARTABLE = ("FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY")
# Node states (sinfo %t) that take no job: a node Slurm lost or an admin took out.
UNUSABLE = ("down", "drain", "drng", "fail", "failg", "maint", "unk", "boot", "futr", "inval")


def attempt_record(attempt: int) -> str:
    """Attempt `attempt`'s record, in the job root."""
    return f"slurm/attempt-{attempt}.json"


def attempt_dir(node_dir: str, attempt: int) -> str:
    """A node's directory in a later attempt, beside the first's (as over SSH:
    layout.job_dir): each attempt keeps its own logs and exit records."""
    return node_dir if attempt == 0 else f"{node_dir}.attempt{attempt}"


def state_word(slurm_state: str) -> str:
    """`CANCELLED by 0` -> CANCELLED, `NODE_FAIL+` -> NODE_FAIL."""
    return slurm_state.strip().split(" ", 1)[0].rstrip("+").upper()


def restartable(slurm_state: str) -> bool:
    """Whether a job that ended in `slurm_state` is one a restart follows."""
    return state_word(slurm_state) in RESTARTABLE


def usable(node_state: str) -> bool:
    """Whether sinfo's state of a node (`idle`, `alloc`, `down*` ...) takes a job."""
    word = node_state.strip().rstrip("*~#!%$@^-").lower()
    return not node_state.strip().endswith("*") and word not in UNUSABLE


def culprits(exits: Mapping[str, Mapping[str, object] | None]) -> list[str]:
    """The nodes an attempt failed on, from each node's exit record once srun ended
    (None: it wrote none). A node whose launcher wrote nothing was lost (the others'
    launchers record even srun's kill-on-bad-exit TERM): as over SSH, when one was
    lost only the lost ones count. Else srun's kill-on-bad-exit stopped every node once
    one failed, so many records say failed: the node that ended first with a failure
    is the one that failed."""
    lost = sorted(name for name, rec in exits.items() if rec is None)
    if lost:
        return lost
    ended = [
        (float(rec.get("ended") or "inf"), name)  # type: ignore[arg-type]
        for name, rec in exits.items()
        if rec is not None and rec.get("returncode") not in (0, None) and not rec.get("killed")
    ]
    return [min(ended)[1]] if ended else []


def exclude(
    partition: Mapping[str, str], failed: Sequence[str], allocated: Sequence[str], nodes: int
) -> list[str]:
    """The nodes the next attempt leaves out: those that failed, and those of the
    allocation Slurm now calls unusable, where the partition has `nodes` usable others;
    none when it has not (the next attempt then waits for, or retakes, them).

    Args:
        partition: every node of the partition and its sinfo state.
        failed: the nodes the attempt failed on (`culprits`).
        allocated: the attempt's nodes.
        nodes: how many the job needs.
    """
    out = {n for n in failed}
    out |= {n for n in allocated if n in partition and not usable(partition[n])}
    left = [n for n, state in partition.items() if n not in out and usable(state)]
    return sorted(out) if out and len(left) >= nodes else []
