"""The line's rules, pure: which units a ticket may take now, in which order tickets go,
and what one that waits is told. Records in, answers out: no files, no processes, no
clock (the unit tests feed it records)."""

from __future__ import annotations

from typing import Any, Dict  # noqa: UP035

Record = Dict[str, Any]  # noqa: UP006 (run at import: hosts may have Python 3.8)


def ticket_key(record: Record) -> tuple[float, str, str]:
    when, job = record.get("ticket") or (0.0, "")
    return (float(when), str(job), str(record.get("name", "")))


def held_units(leases: list[Record], kind: str) -> dict[int, Record]:
    """Each unit of `kind` a live lease holds, and the lease."""
    return {int(u): lease for lease in leases if lease.get("kind") == kind for u in lease["units"]}


def grant(
    request: Record, mine: Record, leases: list[Record], tickets: list[Record], busy: dict[int, Any]
) -> list[int] | None:
    """The units `mine` (a ticket) may take now, or None when its turn has not come.

    Args:
        request: kind, pool (the units orch may hand out here) and count.
        busy: units in use by processes orch did not start (GPUs: nvidia-smi).
    """
    kind, count = request["kind"], int(request["count"])
    held = held_units(leases, kind)
    free = [int(u) for u in request["pool"] if int(u) not in held and int(u) not in busy]
    key = ticket_key(mine)
    older = [
        t
        for t in tickets
        if t.get("kind") == kind and t["name"] != mine["name"] and ticket_key(t) < key
    ]
    # An older ticket keeps back only what it could take of these units: entries of one
    # machine in the inventory lease slots of their own (jobs/queue.py slot_offsets).
    reserved = sum(
        min(int(t.get("count", 0)), len(set(free) & set(map(int, t.get("pool") or free))))
        for t in older
    )
    if len(free) - reserved < count:
        return None
    return free[:count]


def why_waiting(
    request: Record, mine: Record, leases: list[Record], tickets: list[Record], busy: dict[int, Any]
) -> Record:
    """What a ticket waits for, for `queued: ...` lines: who holds the units, who is
    ahead, its place in line."""
    kind = request["kind"]
    pool = [int(u) for u in request["pool"]]
    held = held_units(leases, kind)
    holders: dict[str, Record] = {}
    for unit in pool:
        if unit in held:
            lease = held[unit]
            holders.setdefault(lease["name"], public(lease))
    same = [t for t in tickets if t.get("kind") == kind]
    names = [t["name"] for t in same]
    position = names.index(mine["name"]) + 1 if mine["name"] in names else len(names) + 1
    return {
        "kind": kind,
        "want": int(request["count"]),
        "total": len(pool),
        "free": len([u for u in pool if u not in held and u not in busy]),
        "holders": list(holders.values()),
        "ahead": [public(t) for t in same[: position - 1]],
        "position": position,
        "foreign": [busy[u] for u in sorted(busy) if u in pool],
    }


def public(record: Record) -> Record:
    """What any user of the host may see of a lease or ticket (all of it: no env)."""
    keys = ("kind", "units", "count", "job", "user", "uid", "since", "host", "ticket")
    return {k: record[k] for k in keys if k in record}


def foreign_warning(found: Record) -> str:
    return (
        f"GPU {found['gpu']} is in use by pid {found['pid']} (user {found['user']}), "
        "which orch did not start: counted busy"
    )
