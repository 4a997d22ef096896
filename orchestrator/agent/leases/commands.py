"""`lease poll|take|untake|go JOB_DIR`: a controller's rounds for a node of several
(kernel/line.py), on the node's ticket; `lease hosts`: every lease and ticket of the
host, and the GPUs busy outside orch."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from ..kernel.protocol import EXIT, PIDS, read_json, send_record
from .gpus import busy_units, foreign_gpus
from .holder import GO, QUEUED
from .policy import Record, foreign_warning, grant, public, why_waiting
from .storage import lease_dir, locked, remove, runs, scan, write_record


def main(args: list[str]) -> int:
    """`lease poll|take|untake|go JOB_DIR`, `lease hosts`."""
    if not args:
        print(json.dumps({"error": "usage: lease poll|take|untake|go JOB_DIR | lease hosts"}))
        return 2
    if args[0] == "hosts":
        send_record(sys.stdout.buffer, host_view())
        return 0
    command = {"poll": poll, "take": take, "untake": untake, "go": go}.get(args[0])
    if command is None or len(args) < 2:
        print(json.dumps({"error": f"unknown lease command {args[0]!r}"}))
        return 2
    job_dir = os.path.expanduser(args[1])
    if not os.path.isdir(job_dir):
        send_record(sys.stdout.buffer, {"state": "gone", "error": f"{job_dir} is missing"})
        return 0
    os.chdir(job_dir)
    send_record(sys.stdout.buffer, command())
    return 0


def in_line() -> tuple[Record, Record, str] | None:
    """The node's queued record, its ticket and the lease directory, while in line."""
    queued = read_json(QUEUED)
    if queued is None:
        return None
    ticket = read_json(os.path.join(queued["root"], queued["ticket"]))
    if ticket is None:
        return None
    ticket["name"] = queued["ticket"]
    return queued, ticket, queued["root"]


def poll(take_it: bool = False) -> Record:
    """Where the node stands: started, ended, or in line and whether its turn came
    (`ready`), with what it waits for. Tells the supervisor its controller is there."""
    started = read_json(PIDS)
    if started is not None:
        return {"state": "started", **started}
    ended = read_json(EXIT)
    if ended is not None:
        return {"state": "ended", "ended": ended}
    found = in_line()
    if found is None:
        return {"state": "starting"}
    _queued, ticket, root = found
    with contextlib.suppress(OSError):
        os.utime(QUEUED)
    request = {"kind": ticket["kind"], "count": ticket["count"], "pool": ticket.get("pool", [])}
    if not runs(ticket.get("holder")):
        return {"state": "gone", "error": "the node's supervisor vanished while in line"}
    with locked(root):
        leases, tickets = scan(root)
        busy: dict[int, Record] = {}
        if grant(request, ticket, leases, tickets, busy) is not None:
            busy = busy_units(request, leases)  # nvidia-smi: only when it may matter
        units = grant(request, ticket, leases, tickets, busy)
        if units is None:
            return {"state": "waiting", "info": why_waiting(request, ticket, leases, tickets, busy)}
        if not take_it:
            return {"state": "ready"}
        lease = {**{k: v for k, v in ticket.items() if k != "name"}, "units": units}
        lease["since"] = time.time()
        write_record(root, ticket["name"].replace("T-", "L-", 1), lease)
        return {
            "state": "taken",
            "units": units,
            "warnings": [foreign_warning(b) for b in busy.values()],
        }


def take() -> Record:
    """Take the node's lease on behalf of its supervisor, if its turn came now."""
    return poll(take_it=True)


def untake() -> Record:
    """Give back a lease `take` took (another host of the job refused)."""
    found = in_line()
    if found is not None:
        _, ticket, root = found
        remove(root, ticket["name"].replace("T-", "L-", 1))
    return {"state": "waiting"}


def go() -> Record:
    """Tell the supervisor to start; wait until torchrun runs (or the node ended)."""
    open(GO, "a").close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        started = read_json(PIDS)
        if started is not None:
            return started
        ended = read_json(EXIT)
        if ended is not None:
            return {"error": ended.get("error") or "the node ended before it started"}
        time.sleep(0.02)
    return {"error": "torchrun did not start within 60 s of go"}


def host_view() -> Record:
    """Every live lease and ticket of the host, and GPUs busy outside orch."""
    root = lease_dir()
    if not os.path.isdir(root):
        return {"dir": root, "leases": [], "tickets": [], "foreign": []}
    leases, tickets = scan(root)
    return {
        "dir": root,
        "leases": [public(r) for r in leases],
        "tickets": [public(r) for r in tickets],
        "foreign": list(foreign_gpus(leases).values()),
    }
