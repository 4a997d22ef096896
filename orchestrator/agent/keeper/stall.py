"""The keeper's stall watchdog (`stall_after:`, docs/STACKS.md): pure, as decisions.py
is, whose `Keeping` holds one `StallWatch` and feeds it.

1. Each member's heartbeat carries how long its node's ranks have been silent, on its
   host's clock (`heard`).
2. When every node of a running attempt has been silent `stall_after`, the keeper asks
   each member for its node's stacks (StackWanted, StackTaken; STACK_WAIT_S at most),
   and hands the dump to the daemon to keep (`dumps`, listed in the record's `stalls`).
3. Unless `on_stall: warn` (then once per stall), it stops the attempt as failed,
   `stalled: no output for N s` (`stalled`), its nodes failed with that reason:
   restarts apply.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..kernel import states
from . import wire

STACK_WAIT_S = 30.0  # for the members' stacks of a stalled attempt (py-spy's own limit is 10 s)

if TYPE_CHECKING:  # a runtime alias would need Python 3.9; hosts may run 3.8
    from collections.abc import Callable
    from typing import Protocol

    from ..kernel.messages import Message

    Send = list[tuple[str, Message]]  # (host, message) to send

    class Keeping(Protocol):
        """What the watchdog reads of the keeper's state (decisions.Keeping, which
        holds the watchdog: this module does not import it back)."""

        job_id: str
        attempt: int
        nodes: dict[str, dict[str, Any]]
        candidates: dict[str, Any]
        connected: set[str]
        wall: Callable[[], float]

        @property
        def running(self) -> bool: ...

        def stop_stalled(self, reason: str, now: float) -> Send: ...


class StallWatch:
    """The watchdog's state: each host's silence as its member last said it (seconds,
    and when heard), the stacks being taken, the stalls seen, the dumps that the
    daemon is to keep (name, data), the reason the attempt is being stopped.

    Args:
        config: the keeper's config: stall_after (None: off), on_stall, pyspy, and
            the stalls seen before (a keeper that took over).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        stall_after = config.get("stall_after")
        self.stall_after = float(stall_after) if stall_after is not None else None
        self.on_stall = str(config.get("on_stall") or "fail")
        self.pyspy = config.get("pyspy")
        self.idle: dict[str, tuple[float, float]] = {}
        self.taking: dict[str, Any] | None = None
        self.warned = False
        self.stalls: list[dict[str, Any]] = list(config.get("stalls") or [])
        self.dumps: list[tuple[str, dict[str, Any]]] = []
        self.stalled: str | None = None

    def heard(self, host: str, idle: float | None, now: float) -> None:
        """A heartbeat: how long `host`'s ranks have been silent (None: no rank yet)."""
        if idle is None:
            self.idle.pop(host, None)
        else:
            self.idle[host] = (float(idle), now)

    def took(self, host: str, msg: wire.StackTaken, attempt: int) -> bool:
        """A member's stacks came: True once every member asked has answered."""
        if not self.taking or msg.attempt != attempt:
            return False
        self.taking["replies"][host] = msg.reply
        return bool(set(self.taking["replies"]) >= self.taking["asked"])

    def next_attempt(self) -> None:
        """A new attempt starts: its silence and stalls are its own."""
        self.stalled, self.warned, self.idle = None, False, {}

    def snapshot(self) -> dict[str, Any]:
        """What a keeper that takes over needs of the watchdog."""
        return {
            "stall_after": self.stall_after,
            "on_stall": self.on_stall,
            "pyspy": self.pyspy,
            "stalls": self.stalls,
        }

    def quiet_for(self, keeping: Keeping, now: float) -> float | None:
        """How long every running node of the attempt has been silent (the least of
        them), or None where one has not said (no rank runs there yet)."""
        running = [h for h, n in keeping.nodes.items() if n["state"] == states.RUNNING]
        if not running or any(h not in self.idle for h in running):
            return None
        return min(self.idle[h][0] + (now - self.idle[h][1]) for h in running)

    def watch(self, keeping: Keeping, now: float) -> Send:
        """A running attempt: take its stacks once every node has been silent
        stall_after, and act once they came (or STACK_WAIT_S passed)."""
        if self.stall_after is None:
            return []
        if self.taking is not None:
            return self.taken(keeping, now) if now >= self.taking["deadline"] else []
        quiet = self.quiet_for(keeping, now)
        if quiet is None or quiet < self.stall_after:
            self.warned = False  # a rank printed: the next silence is a stall of its own
            return []
        if self.warned:
            return []
        wall = keeping.wall()
        taken = time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall)) + "Z-stall"
        asked = {h for h, n in keeping.nodes.items() if n["state"] == states.RUNNING}
        asked &= keeping.connected
        self.taking = {
            "taken": taken,
            "at": wall,
            "quiet": round(quiet, 1),
            "asked": asked,
            "replies": {},
            "deadline": now + STACK_WAIT_S,
        }
        sends: Send = []
        for host in sorted(asked):
            workdir = str(keeping.candidates[host]["workdir"])
            wanted = wire.StackWanted(
                attempt=keeping.attempt,
                taken=taken,
                tools_dir=f"{workdir.rstrip('/')}/tools",
                pyspy=self.pyspy,
            )
            sends.append((host, wanted))
        return sends or self.taken(keeping, now)

    def taken(self, keeping: Keeping, now: float) -> Send:
        """The stacks came (or not all in time): keep them, then warn or stop."""
        taking, self.taking = self.taking, None
        if taking is None:
            return []
        reason = f"stalled: no output for {self.stall_after:.0f} s"
        data = {
            "job": keeping.job_id,
            "attempt": keeping.attempt,
            "at": taking["at"],
            "quiet_s": taking["quiet"],
            "reason": reason,
            "replies": taking["replies"],
            "unanswered": sorted(taking["asked"] - set(taking["replies"])),
        }
        self.dumps.append((taking["taken"], data))
        action = "warned" if self.on_stall == "warn" else "stopped"
        self.stalls.append(
            {
                "at": taking["at"],
                "attempt": keeping.attempt,
                "dump": taking["taken"],
                "action": action,
            }
        )
        if self.on_stall == "warn" or not keeping.running:  # warn; or it ended meanwhile
            self.warned = True
            return []
        self.stalled = reason
        return keeping.stop_stalled(reason, now)
