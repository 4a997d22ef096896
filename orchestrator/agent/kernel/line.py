"""A detached job's wait in line, run by its keeper: its nodes start on
every host at once or on none, as ssh/queue.py's `_wait_all` does for a submit that
waits, but without the laptop. Pure, like keeper/decisions.py: fed the members' answers and
the clock, answering with the messages to send.

Each round asks every node's member to `poll` its node's place in its host's line
(leases/). When no node waits any more, every member is asked to `take` its lease;
when one host refused, the leases taken are given back (`untake`) and the rounds go
on; once all are taken, every node is told to `go`. A node that left the line (its
supervisor gone, killed, or given up) ends the wait. The node of a job of one takes
its turn alone (`alone`): the rounds then only watch for it to start, and never
take for it.

Each round's asks are (host, verb) pairs; each answer is the agent's `lease VERB`
reply, parsed (lease_wire.LeaseState): the keeper's members pass it on in a message,
the controller runs the command itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .lease_wire import LeaseState, Waiting

POLL_S = 0.5  # between rounds, as a waiting submit asks
REPLY_WAIT_S = 90.0  # for a member's answer (`go` waits up to 60 s for torchrun)

if TYPE_CHECKING:  # a runtime alias would need Python 3.9; hosts may run 3.8
    Asks = list[tuple[str, str]]  # (host, lease verb) to ask


@dataclass
class Outcome:
    """How the wait ended: every node `started` (the agent's answer for each: pids,
    or an error), or some `left` the line (why, per host)."""

    started: dict[str, LeaseState] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)


class Line:
    """The rounds of one job's wait; `waiting` holds what each host last said its node
    waits for."""

    def __init__(self, hosts: list[str], alone: bool = False) -> None:
        self.hosts, self.alone = list(hosts), alone
        self.step = ""  # the verb whose answers are awaited, "" between rounds
        self.pending: set[str] = set()
        self.replies: dict[str, LeaseState] = {}
        self.next_round = 0.0
        self.deadline = 0.0
        self.waiting: dict[str, Waiting] = {}

    def tick(self, now: float, ready: bool) -> Asks:
        """Start the next round when it is time and every member is there (`ready`)."""
        if self.step or now < self.next_round or not ready:
            return []
        return self._ask("poll", self.hosts, now)

    def overdue(self, now: float) -> set[str]:
        """The hosts whose member did not answer in time."""
        return set(self.pending) if self.step and now > self.deadline else set()

    def hear(
        self, host: str, verb: str, reply: LeaseState, now: float
    ) -> tuple[Asks, Outcome | None]:
        """A host's answer to `verb`; once every host answered, what follows."""
        if verb != self.step or host not in self.pending:
            return [], None
        self.pending.discard(host)
        self.replies[host] = reply
        if self.pending:
            return [], None
        step, replies = self.step, self.replies
        self.step = ""
        if step == "poll":
            return self._polled(replies, now)
        if step == "take":
            return self._taken(replies, now), None
        return [], Outcome(started=replies)

    def _ask(self, verb: str, hosts: list[str], now: float) -> Asks:
        self.step, self.pending, self.replies = verb, set(hosts), {}
        self.deadline = now + REPLY_WAIT_S
        return [(h, verb) for h in sorted(hosts)]

    def _polled(self, replies: dict[str, LeaseState], now: float) -> tuple[Asks, Outcome | None]:
        states = {h: r.state for h, r in replies.items()}
        left = {h: why_left(r) for h, r in replies.items() if states[h] in ("ended", "gone")}
        if left:
            return [], Outcome(left=left)
        if all(s == "started" for s in states.values()):  # a job of one node, on its own
            return [], Outcome(started=replies)
        self.waiting = {h: r.info for h, r in replies.items() if r.info is not None}
        if all(s == "ready" for s in states.values()) and not self.alone:
            return self._ask("take", self.hosts, now), None
        self.next_round = now + POLL_S  # waiting, or a supervisor not yet in line
        return [], None

    def _taken(self, replies: dict[str, LeaseState], now: float) -> Asks:
        refused = {h: r for h, r in replies.items() if r.state != "taken"}
        if not refused:
            return self._ask("go", self.hosts, now)
        self.waiting = {h: r.info for h, r in refused.items() if r.info is not None}
        self.next_round = now + POLL_S
        taken = sorted(h for h in replies if h not in refused)
        return [(h, "untake") for h in taken]


def why_left(reply: LeaseState) -> str:
    """What a `poll` answer of a node no longer in line (ended, gone) says of why."""
    why = (reply.ended.error if reply.ended else None) or reply.error or "it ended"
    return f"the node left the line before it started: {why}"
