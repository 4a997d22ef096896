"""The states a job and each of its nodes go through: the agent's words for them
(agent/kernel/states.py), as an enum."""

from __future__ import annotations

from enum import StrEnum

import orchestrator.agent.kernel.states as states

# A lost node's error once its host answers again and the node still runs there.
STILL_RUNNING = "still running there"


class JobState(StrEnum):
    """A job's (or one node's) state.

    pending -> running -> succeeded | failed | killed | lost. `lost` means a host stopped
    answering and the outcome is unknown. `unknown` is a record this orch cannot read
    (damaged, or written by a newer orch): shown, never acted on.
    """

    PENDING = states.PENDING
    RUNNING = states.RUNNING
    SUCCEEDED = states.SUCCEEDED
    FAILED = states.FAILED
    KILLED = states.KILLED
    LOST = states.LOST
    UNKNOWN = states.UNKNOWN

    @classmethod
    def parse(cls, value: object) -> JobState:
        """The state named `value`, or UNKNOWN."""
        try:
            return cls(str(value))
        except ValueError:
            return cls.UNKNOWN

    def is_terminal(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


def node_state(returncode: int | None, killed: bool) -> JobState:
    """A node's final state from how its torchrun ended (a returncode of None: lost)."""
    return JobState(states.ended_state(returncode, killed))


def job_state(nodes: list[JobState]) -> JobState:
    """A job's state from its nodes' states.

    Any node still going keeps the job running. Once all ended: a failed node fails
    the job; a lost host whose peers orch then stopped (killed) fails it too; a lost
    host alone leaves the outcome unknown (lost); killed nodes alone mean the user
    killed it; and a job succeeds only when every node did.
    """
    if JobState.UNKNOWN in nodes:
        return JobState.UNKNOWN
    if all(s is JobState.PENDING for s in nodes):
        return JobState.PENDING
    if any(not s.is_terminal() for s in nodes):
        return JobState.RUNNING
    if JobState.FAILED in nodes or (JobState.LOST in nodes and JobState.KILLED in nodes):
        return JobState.FAILED
    for state in (JobState.LOST, JobState.KILLED):
        if state in nodes:
            return state
    return JobState.SUCCEEDED
