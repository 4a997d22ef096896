"""The line's rules, pure: which units a ticket may take now, in which order tickets go,
and what one that waits is told. Records in, answers out: no files, no processes, no
clock (the unit tests feed it records)."""

from __future__ import annotations

from typing import Any, Dict  # noqa: UP035

from .fairness import NORMAL, PRIORITIES, Rules, holdings, over_limit, priority_of, standing

Record = Dict[str, Any]  # noqa: UP006 (run at import: hosts may have Python 3.8)

# A ticket's place in line is the submit time its controller wrote (one clock for
# every host of a job: the nodes of two jobs wait in the same order everywhere, so
# neither holds one host while it waits on another), but never more than this before
# the ticket file's change time, which its owner cannot set back: a forged time
# moves a ticket at most this far ahead of those that came before it.
LINE_SLACK_S = 5.0
# A ticket keeps units back for itself only while whoever drives it claims it: its
# supervisor at each look (a node alone), its controller's rounds (`lease poll`, a
# node of several). A claim is the change time of the ticket's own claim file, which
# nobody can set: a ticket that nobody drives any more (a file a co-tenant left with
# a live process of theirs behind it, a stopped supervisor, a controller gone silent)
# keeps its place but holds nothing back, and the tickets behind it go while it does
# not take. Rounds come every 0.5 s plus an SSH call; this is twenty of them.
CLAIM_S = 10.0
MAX_UNIT = 1 << 16  # unit numbers and counts beyond any machine's
MAX_UNITS = 4096  # entries of a units or pool list
MAX_TEXT = 256  # characters of a job id, user name, host name, boot id
MAX_TIME = 1e11  # seconds since 1970: year 5138


def ticket_key(record: Record) -> tuple[float, str, str]:
    """A ticket's place in line: its checked time (`order`, see `check_record`), then
    its job id, then its file's name."""
    when, job = record.get("ticket") or (0.0, "")
    return (float(record.get("order", when)), str(job), str(record.get("name", "")))


def line_time(claimed: float, changed: float) -> float:
    """The time a ticket waits from: the one it claims, but no earlier than
    LINE_SLACK_S before its file last changed (`changed`, the file's ctime)."""
    return max(claimed, changed - LINE_SLACK_S)


def check_record(data: Any, name: str, owner: int, changed: float) -> tuple[Record | None, str]:
    """A lease or ticket as read from the shared directory, if it is one: every field
    of the right type and size, its `uid` its file's owner. Another user's file may
    hold anything; what fails here is ignored, with the reason.

    Args:
        data: the file's parsed JSON.
        name: the file's name (L-... a lease, T-... a ticket).
        owner: the file's owner (fstat st_uid).
        changed: the file's ctime, from which a ticket's `order` is checked.

    Returns:
        The record with its `name` (and for a ticket its `order`), else None and why.
    """
    if not isinstance(data, dict):
        return None, "not a JSON object"
    uid = data.get("uid")
    if not _is_int(uid, 0, 1 << 32):
        return None, "uid is not a user id"
    if uid != owner:
        return None, f"it claims uid {uid}, but its file is owned by uid {owner}"
    ticket = data.get("ticket")
    checks = [
        (data.get("kind") in ("gpu", "slot"), "kind is neither gpu nor slot"),
        (_is_int(data.get("count"), 0, MAX_UNIT), "count is not a unit count"),
        (_is_text(data.get("job")), "job is not a job id"),
        (_is_text(data.get("user")), "user is not a user name"),
        (_is_text(data.get("boot")), "boot is not a boot id"),
        (_is_text(data.get("host", "")), "host is not a host name"),
        (_is_time(data.get("since")), "since is not a time"),
        (_is_process(data.get("holder")), "holder is not [pid, start time]"),
        (_is_units(data.get("pool", [])), "pool is not a list of unit numbers"),
        (_is_process(data.get("torchrun", [1, None])), "torchrun is not [pid, start time]"),
        (
            isinstance(ticket, list)
            and len(ticket) == 2
            and _is_time(ticket[0])
            and _is_text(ticket[1]),
            "ticket is not [time, job id]",
        ),
        (not name.startswith("L-") or _is_units(data.get("units")), "units is not a list of units"),
        (_is_claim_name(data.get("claim", "C-.json")), "claim is not a claim file's name"),
        (data.get("priority", NORMAL) in PRIORITIES, "priority is not low, normal or high"),
        (isinstance(data.get("several", False), bool), "several is not true or false"),
    ]
    for ok, why in checks:
        if not ok:
            return None, why
    record = dict(data, name=name)
    if name.startswith("T-"):
        record["order"] = line_time(float(data["ticket"][0]), changed)
        record["claimed"] = changed  # storage.py adds the claim file's, if later
    return record, ""


def claimed(ticket: Record, now: float | None) -> bool:
    """Whether a ticket keeps units back for itself (CLAIM_S): its last claim (the
    later of its file's and its claim file's change time, `claimed`) is recent. With
    no clock (`now` None) or no claim known, every ticket does."""
    at = ticket.get("claimed")
    return now is None or at is None or now - float(at) <= CLAIM_S


def _is_int(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _is_time(value: Any) -> bool:
    """A finite number of seconds since 1970 (NaN compares false with everything)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < MAX_TIME


def _is_claim_name(value: Any) -> bool:
    """A name in the lease directory itself: C-....json, no path."""
    return (
        _is_text(value)
        and value.startswith("C-")
        and value.endswith(".json")
        and "/" not in value
        and "\0" not in value
    )


def _is_units(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_UNITS
        and all(_is_int(u, 0, MAX_UNIT) for u in value)
    )


def _is_process(value: Any) -> bool:
    """[pid, start time]; a start time may be unknown (None)."""
    return (
        isinstance(value, list)
        and len(value) == 2
        and _is_int(value[0], 1, 1 << 32)
        and (value[1] is None or _is_int(value[1], 0, 1 << 63))
    )


def held_units(leases: list[Record], kind: str) -> dict[int, Record]:
    """Each unit of `kind` a live lease holds, and the lease."""
    return {int(u): lease for lease in leases if lease.get("kind") == kind for u in lease["units"]}


def grant(
    request: Record,
    mine: Record,
    leases: list[Record],
    tickets: list[Record],
    busy: dict[int, Any],
    now: float | None = None,
    rules: Rules | None = None,
) -> list[int] | None:
    """The units `mine` (a ticket) may take now, or None when its turn has not come.

    Args:
        request: kind, pool (the units orch may hand out here) and count.
        busy: units in use by processes orch did not start (GPUs: nvidia-smi).
        now: the host's clock, against which older tickets' claims are checked
            (`claimed`) and waiting raises a ticket (fairness.level): a ticket ahead
            that nobody claimed for CLAIM_S keeps nothing back; None: every ticket
            ahead does, and nothing ages.
        rules: the host's policy (fairness.Rules; the default: none).
    """
    rules = rules or Rules()
    kind, count = request["kind"], int(request["count"])
    held = held_units(leases, kind)
    free = [int(u) for u in request["pool"] if int(u) not in held and int(u) not in busy]
    projected, reserved = _ahead_of(mine, kind, free, leases, tickets, now, rules)
    if over_limit(mine.get("uid"), kind, count, projected, rules):
        return None
    if len(free) - reserved < count:
        return None
    return free[:count]


def _ahead_of(
    mine: Record,
    kind: str,
    free: list[int],
    leases: list[Record],
    tickets: list[Record],
    now: float | None,
    rules: Rules,
) -> tuple[dict[int, int], int]:
    """What the tickets ahead of `mine` keep back of `free`, and each user's holdings
    once they took it. A ticket ahead keeps back only what it could take now: not
    while nobody claims it, nor what would pass its user's limit."""
    holds = holdings(leases, kind)
    key = standing(mine, rules, now, holds, ticket_key)
    ahead = sorted(
        (
            (standing(t, rules, now, holds, ticket_key), t)
            for t in tickets
            if t.get("kind") == kind and t["name"] != mine["name"]
        ),
        key=lambda pair: pair[0],
    )
    projected, reserved = dict(holds), 0
    for place, ticket in ahead:
        if place >= key:
            break
        want = int(ticket.get("count", 0))
        if not claimed(ticket, now) or over_limit(ticket.get("uid"), kind, want, projected, rules):
            continue
        if isinstance(ticket.get("uid"), int):
            projected[ticket["uid"]] = projected.get(ticket["uid"], 0) + want
        # An older ticket keeps back only what it could take of these units: entries of
        # one machine in the inventory lease slots of their own (ssh/queue.py
        # slot_offsets).
        reserved += min(want, len(set(free) & set(map(int, ticket.get("pool") or free))))
    return projected, reserved


def line_order(
    tickets: list[Record], leases: list[Record], now: float | None, rules: Rules | None = None
) -> list[Record]:
    """The host's line, first first, as `grant` reads it (fairness.standing)."""
    rules = rules or Rules()
    holds = {kind: holdings(leases, kind) for kind in ("gpu", "slot")}
    return sorted(
        tickets,
        key=lambda t: standing(t, rules, now, holds.get(str(t.get("kind")), {}), ticket_key),
    )


def why_waiting(
    request: Record,
    mine: Record,
    leases: list[Record],
    tickets: list[Record],
    busy: dict[int, Any],
    now: float | None = None,
    rules: Rules | None = None,
) -> Record:
    """What a ticket waits for, for `queued: ...` lines: who holds the units, who is
    ahead, its place in line, the priority it is read with, and its user's limit
    where that is what it waits for."""
    rules = rules or Rules()
    kind = request["kind"]
    pool = [int(u) for u in request["pool"]]
    held = held_units(leases, kind)
    holders: dict[str, Record] = {}
    for unit in pool:
        if unit in held:
            lease = held[unit]
            holders.setdefault(lease["name"], public(lease))
    same = line_order([t for t in tickets if t.get("kind") == kind], leases, now, rules)
    names = [t["name"] for t in same]
    position = names.index(mine["name"]) + 1 if mine["name"] in names else len(names) + 1
    info = {
        "kind": kind,
        "want": int(request["count"]),
        "total": len(pool),
        "free": len([u for u in pool if u not in held and u not in busy]),
        "holders": list(holders.values()),
        "ahead": [public(t) for t in same[: position - 1]],
        "position": position,
        "foreign": [busy[u] for u in sorted(busy) if u in pool],
        "priority": priority_of(mine, rules),
    }
    uid, holds = mine.get("uid"), holdings(leases, kind)
    if over_limit(uid, kind, int(request["count"]), holds, rules):
        most = rules.limit(uid, kind)
        info["limit"] = {
            "user": str(mine.get("user", uid)),
            "held": holds.get(uid, 0) if isinstance(uid, int) else 0,
            "most": most,
        }
    return info


def public(record: Record) -> Record:
    """What any user of the host may see of a lease or ticket (all of it: no env)."""
    keys = ("kind", "units", "count", "job", "user", "uid", "since", "host", "ticket")
    return {k: record[k] for k in keys if k in record}


def foreign_warning(found: Record) -> str:
    return (
        f"GPU {found['gpu']} is in use by pid {found['pid']} (user {found['user']}), "
        "which orch did not start: counted busy"
    )
