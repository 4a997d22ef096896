"""The lease command's replies, and `start`'s on a shared host (agent/leases/): the
agent builds them, the controller parses them (`parse_message`, which parses the
records inside too). Their text fields may come from another user's files: print them
through `printable`.

Standard library only, valid on Python 3.8, like the rest of the kernel.
"""

from __future__ import annotations

from .replies import ExitRecord, Reply

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def printable(text: object, limit: int = 300) -> str:
    """`text` with every control and format character taken out (escape sequences,
    carriage returns, bidi overrides), at most `limit` characters: words from another
    user's file, safe on a terminal."""
    import unicodedata

    kept = "".join(c for c in str(text) if unicodedata.category(c) not in ("Cc", "Cf"))
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


class LeaseRecord(Reply):
    """What any user of a host may see of a lease or ticket (leases/policy.public)."""

    kind: str
    job: str
    user: str
    units: Sequence[int] = ()
    count: int = 0
    uid: int | None = None
    since: float | None = None
    host: str = ""
    priority: str = "normal"  # a ticket's, as the host's policy reads it


class BusyGpu(Reply):
    """A GPU in use by a process orch did not start."""

    gpu: int
    pid: int
    user: str


class UserLimit(Reply):
    """A node waits because its user holds `held` units of the `most` the host's
    policy lets them hold at once (leases/fairness.py)."""

    user: str
    held: int
    most: int


class Waiting(Reply):
    """What a node in line waits for (leases/policy.why_waiting), the priority it is
    read with, and its user's limit where that is what it waits for."""

    kind: str
    want: int
    total: int = 0
    free: int = 0
    holders: Sequence[LeaseRecord] = ()
    ahead: Sequence[LeaseRecord] = ()
    position: int = 1
    foreign: Sequence[BusyGpu] = ()
    waiting_for: str | None = None  # "go": a node of several, taken by its controller
    priority: str = "normal"
    limit: UserLimit | None = None


LEASE_STATES = ("started", "ended", "starting", "waiting", "ready", "taken", "gone")


class LeaseState(Reply):
    """`lease poll|take|untake|go`: where a node stands. `state` is one of
    LEASE_STATES; `started` carries Started's fields (`pid`...), `ended` the exit
    record, `waiting` what for (`info`), `taken` the units and warnings; `go` answers
    Started's fields or an `error`."""

    state: str = ""
    info: Waiting | None = None
    units: Sequence[int] = ()
    warnings: Sequence[str] = ()
    error: str | None = None
    ended: ExitRecord | None = None
    pid: int | None = None


class LeaseStart(Reply):
    """`start` with a lease request: Started's fields once torchrun runs, else the
    node waits in line (`queued`, what for) or would have to (`busy`: it was told not
    to wait), or could not start (`error`; `refused`: the host's policy refuses what
    it asks, a priority its user may not use or more units than they may hold)."""

    pid: int | None = None
    queued: Waiting | None = None
    busy: Waiting | None = None
    error: str | None = None
    refused: str | None = None
    warnings: Sequence[str] = ()


class LeaseHosts(Reply):
    """`lease hosts`: the host's lease directory, every live lease and ticket in it
    (tickets in line order, the host's policy's), the GPUs busy outside orch, and warnings: files ignored
    (naming their owner), a directory root does not own."""

    dir: str
    leases: Sequence[LeaseRecord] = ()
    tickets: Sequence[LeaseRecord] = ()
    foreign: Sequence[BusyGpu] = ()
    warnings: Sequence[str] = ()


class LeaseDir(Reply):
    """`lease dir`: where the host's lease directory is, whether it exists, and
    why it is not safe to share (`warning`: not root's, or missing); what of the
    host's policy file was ignored (`policy`)."""

    dir: str
    exists: bool = False
    owner: str | None = None
    warning: str | None = None
    policy: Sequence[str] = ()  # the host's policy file ignored, or its bad lines


def lease_record(reply: Reply) -> dict[str, Any]:
    """A reply as the agent sends it: its fields, the records inside as plain JSON."""
    return reply.as_dict()
