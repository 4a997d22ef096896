"""A detached job's wait in line, run by its keeper: its nodes start on
every host at once or on none, as jobs/queue.py's `_wait_all` does for a submit that
waits, but without the laptop. Pure, like keeper/decisions.py: fed the members' answers and
the clock, answering with the messages to send.

Each round asks every node's member to `poll` its node's place in its host's line
(leases/). When no node waits any more, every member is asked to `take` its lease;
when one host refused, the leases taken are given back (`untake`) and the rounds go
on; once all are taken, every node is told to `go`. A node that left the line (its
supervisor gone, killed, or given up) ends the wait. The node of a job of one takes
its turn alone (`alone`): the rounds then only watch for it to start, and never
take for it.

Messages: to a member {"k": "lease", "verb": poll|take|untake|go}; from it the same
with "reply", the agent's `lease VERB` answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict  # noqa: UP035

POLL_S = 0.5  # between rounds, as a waiting submit asks
REPLY_WAIT_S = 90.0  # for a member's answer (`go` waits up to 60 s for torchrun)

# the agent's `lease VERB` answer, as a member passed it on
LeaseAnswer = Dict[str, Any]  # noqa: UP006 (run at import: hosts may have Python 3.8)
if TYPE_CHECKING:
    Send = list[tuple[str, dict[str, Any]]]


@dataclass
class Outcome:
    """How the wait ended: every node `started` (the agent's answer for each: pids,
    or an error), or some `left` the line (why, per host)."""

    started: dict[str, LeaseAnswer] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)


class Line:
    """The rounds of one job's wait; `waiting` holds what each host last said its node
    waits for."""

    def __init__(self, hosts: list[str], alone: bool = False) -> None:
        self.hosts, self.alone = list(hosts), alone
        self.step = ""  # the verb whose answers are awaited, "" between rounds
        self.pending: set[str] = set()
        self.replies: dict[str, LeaseAnswer] = {}
        self.next_round = 0.0
        self.deadline = 0.0
        self.waiting: dict[str, LeaseAnswer] = {}

    def tick(self, now: float, ready: bool) -> Send:
        """Start the next round when it is time and every member is there (`ready`)."""
        if self.step or now < self.next_round or not ready:
            return []
        return self._ask("poll", self.hosts, now)

    def overdue(self, now: float) -> set[str]:
        """The hosts whose member did not answer in time."""
        return set(self.pending) if self.step and now > self.deadline else set()

    def hear(self, host: str, msg: dict[str, Any], now: float) -> tuple[Send, Outcome | None]:
        """A member's answer; once every host answered, what follows."""
        if msg.get("verb") != self.step or host not in self.pending:
            return [], None
        self.pending.discard(host)
        reply = msg.get("reply")
        self.replies[host] = reply if isinstance(reply, dict) else {}
        if self.pending:
            return [], None
        step, replies = self.step, self.replies
        self.step = ""
        if step == "poll":
            return self._polled(replies, now)
        if step == "take":
            return self._taken(replies, now), None
        return [], Outcome(started=replies)

    def _ask(self, verb: str, hosts: list[str], now: float) -> Send:
        self.step, self.pending, self.replies = verb, set(hosts), {}
        self.deadline = now + REPLY_WAIT_S
        return [(h, {"k": "lease", "verb": verb}) for h in sorted(hosts)]

    def _polled(self, replies: dict[str, LeaseAnswer], now: float) -> tuple[Send, Outcome | None]:
        states = {h: r.get("state") for h, r in replies.items()}
        left = {h: why_left(r) for h, r in replies.items() if states[h] in ("ended", "gone")}
        if left:
            return [], Outcome(left=left)
        if all(s == "started" for s in states.values()):  # a job of one node, on its own
            return [], Outcome(started=replies)
        self.waiting = {h: r["info"] for h, r in replies.items() if "info" in r}
        if all(s == "ready" for s in states.values()) and not self.alone:
            return self._ask("take", self.hosts, now), None
        self.next_round = now + POLL_S  # waiting, or a supervisor not yet in line
        return [], None

    def _taken(self, replies: dict[str, LeaseAnswer], now: float) -> Send:
        refused = {h: r for h, r in replies.items() if r.get("state") != "taken"}
        if not refused:
            return self._ask("go", self.hosts, now)
        self.waiting = {h: r["info"] for h, r in refused.items() if "info" in r}
        self.next_round = now + POLL_S
        taken = sorted(h for h in replies if h not in refused)
        return [(h, {"k": "lease", "verb": "untake"}) for h in taken]


def why_left(reply: LeaseAnswer) -> str:
    """What a `poll` answer of a node no longer in line (ended, gone) says of why."""
    ended = reply.get("ended") or {}
    why = ended.get("error") or reply.get("error") or "it ended"
    return f"the node left the line before it started: {why}"
