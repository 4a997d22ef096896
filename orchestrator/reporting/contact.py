"""Whether a silent host is lost, or the controller itself was away: pure decisions.

A laptop sleeps, changes networks, gets paused; none of that may end a job. So only
evidence from the cluster declares a node lost (`judge`):

- its stream went silent or broke, and stayed so for the job's `lost_after`;
- a fresh connection to its host, tried since, failed;
- and the controller can reach the cluster all the same: another host was heard
  after that attempt began, or the host's own address refused the connection (its
  sshd is gone: a crashed host; that needs no waiting).

When every host is silent at once, it is the controller's outage: reconnect and
wait, as long as the user does. A time during which this process did not run (a
closed lid, Ctrl-Z, `kill -STOP`: `StallClock`) never counts as silence.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

LOST_AFTER_S = 12.0  # silence, confirmed, after which a node is lost (job: lost_after)
STALL_S = 3.0  # a gap this long between two ticks: this process was not running
TICK_S = 0.25
RECENT_S = 3.0  # heard this shortly before: reachable (heartbeats come every 2 s)


@dataclass
class Contact:
    """What the controller knows of its contact with one host (monotonic seconds)."""

    heard: float  # last record from the host's stream (data or heartbeat)
    following: bool = True  # a stream is open and not known to be silent
    failed_at: float | None = None  # start of the last failed fresh connection attempt
    refused: bool = False  # that attempt was refused by the host's address
    error: str = ""  # how the last attempt failed

    def hear(self, now: float) -> None:
        self.heard = now

    def quiet(self) -> None:
        self.following = False

    def attempt_failed(self, started: float, error: str, refused: bool) -> None:
        self.failed_at, self.error, self.refused = started, error, refused

    def back(self, now: float) -> None:
        self.following, self.failed_at, self.refused, self.error = True, None, False, ""
        self.heard = now


@dataclass(frozen=True)
class Verdict:
    lost: dict[str, str] = field(default_factory=dict)  # host -> why, in words
    outage: bool = False  # every host silent: the controller's own network


def judge(
    now: float,
    contacts: Mapping[str, Contact],
    lost_after: Mapping[str, float],
    stalled_until: float = 0.0,
    ended: Mapping[str, Contact] | None = None,
) -> Verdict:
    """Which silent hosts are lost now, and whether the controller is cut off.

    Args:
        now: the monotonic time.
        contacts: the hosts still followed (nodes that ended are not in it).
        lost_after: per host, seconds of silence before it may be declared lost.
        stalled_until: when this process last came back from not running.
        ended: hosts whose node ended (not lost): heard shortly before a silent
            host's failed attempt, they too show that the network here works, as
            when a teardown ended every node but the silent ones.
    """
    witnesses = list((ended or {}).values())
    silent = [name for name, c in contacts.items() if not c.following]
    lost: dict[str, str] = {}
    for name in silent:
        c = contacts[name]
        since = max(c.heard, stalled_until)  # a pause here is no silence there
        if c.failed_at is None or c.failed_at < since:
            continue  # no fresh attempt has failed since the silence began
        others = [o for other, o in contacts.items() if other != name]
        heard_others = any(o.following and o.heard > c.failed_at for o in others)
        heard_lately = any(o.following and o.heard > c.failed_at - RECENT_S for o in others)
        if any(o.heard > c.failed_at - RECENT_S for o in witnesses):
            heard_others = heard_lately = True
        waited = now - since >= lost_after.get(name, LOST_AFTER_S)
        if c.refused and (heard_lately or not others):
            lost[name] = c.error or "connection refused"
        elif waited and heard_others:
            lost[name] = f"no answer for {now - c.heard:.0f} s; {c.error or 'unreachable'}"
    # Every host silent, and a fresh attempt failed for each since: not a pause here
    # (those come back at the first attempt), the network here.
    tried = all(
        (f := contacts[n].failed_at) is not None and f >= max(contacts[n].heard, stalled_until)
        for n in silent
    )
    heard_here = any(o.heard > now - RECENT_S for o in witnesses)
    outage = bool(silent) and len(silent) == len(contacts) and tried and not lost and not heard_here
    return Verdict(lost, outage)


class StallClock:
    """Notices when this process did not run: a tick thread whose ticks came too far
    apart (Ctrl-Z, `kill -STOP`, a starved machine), or a wall clock that moved further
    than the monotonic one (a suspended laptop: the monotonic clock stops in sleep)."""

    def __init__(self, stall_s: float = STALL_S, tick_s: float = TICK_S) -> None:
        self.stall_s, self.tick_s = stall_s, tick_s
        self.stalled_until = 0.0  # monotonic time the last stall ended
        self.stalled_for = 0.0
        self.stalls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-clock", daemon=True)

    def start(self) -> StallClock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        mono, wall = time.monotonic(), time.time()
        while not self._stop.wait(self.tick_s):
            now_mono, now_wall = time.monotonic(), time.time()
            self.tick(now_mono - mono, now_wall - wall, now_mono)
            mono, wall = now_mono, now_wall

    def tick(self, mono_delta: float, wall_delta: float, now: float) -> None:
        """One tick, `mono_delta` and `wall_delta` after the last."""
        gap = max(mono_delta, wall_delta) - self.tick_s
        if gap >= self.stall_s:
            self.stalled_until, self.stalled_for = now, gap
            self.stalls += 1
