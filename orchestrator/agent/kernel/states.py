"""The states of a job and of its nodes, one vocabulary for both ends: the
controller's JobState (models/states.py) takes its values from here, and the agent's
keeper writes them into its record.

A node: queued (in its hosts' line) -> starting -> running -> succeeded | failed |
killed | lost. `lost` means its host stopped answering and how the node ended is
unknown; where its host recorded that (ExitRecord), that is a `returncode` of None
(`ended_state`). A job is `pending` before any node started; `unknown` is a record
that cannot be read (damaged, or written by a newer orch). A detached job's keeper
says of its job `queued`, `running`, `restarting` (between attempts), `stopping`
(`orch kill` is stopping its nodes) or how it ended; the controller asks only whether
it still acts (`KEEPER_ACTING`).
"""

from __future__ import annotations

PENDING = "pending"
QUEUED = "queued"
STARTING = "starting"
RUNNING = "running"
RESTARTING = "restarting"
STOPPING = "stopping"
SUCCEEDED = "succeeded"
FAILED = "failed"
KILLED = "killed"
LOST = "lost"
UNKNOWN = "unknown"

NODE_ACTIVE = (QUEUED, STARTING, RUNNING)  # a node's states while it may run
KEEPER_ACTING = (QUEUED, RUNNING, RESTARTING, STOPPING)  # a keeper's while it decides


def ended_state(returncode: int | None, killed: bool) -> str:
    """A node's final state from how its torchrun ended, as its host recorded it."""
    if killed:
        return KILLED
    if returncode is None:
        return LOST
    return SUCCEEDED if returncode == 0 else FAILED
