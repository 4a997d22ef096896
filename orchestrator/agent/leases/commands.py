"""`lease poll|take|untake|go JOB_DIR`: a controller's rounds for a node of several
(kernel/line.py), on the node's ticket; `lease hosts`: every lease and ticket of the
host, and the GPUs busy outside orch; `lease dir`: where the lease directory is and
whether it is safe to share. Each answers one reply of kernel/lease_wire.py."""

from __future__ import annotations

import contextlib
import os
import sys
import time

from ..kernel import cjson
from ..kernel.fileio import read_json
from ..kernel.framing import send_record
from ..kernel.layout import EXIT, PIDS
from ..kernel.lease_wire import (
    BusyGpu,
    LeaseDir,
    LeaseHosts,
    LeaseRecord,
    LeaseState,
    Waiting,
    lease_record,
)
from ..kernel.replies import ExitRecord
from .admin import load_policy
from .fairness import priority_of
from .gpus import busy_units, foreign_gpus
from .holder import GO, QUEUED
from .policy import Record, foreign_warning, grant, line_order, public, why_waiting
from .storage import (
    LeaseError,
    claim,
    lease_dir,
    locked,
    owner_warning,
    remove,
    runs,
    scan,
    write_record,
)


def main(args: list[str]) -> int:
    """`lease poll|take|untake|go JOB_DIR`, `lease hosts`, `lease dir`."""
    usage = "usage: lease poll|take|untake|go JOB_DIR | lease hosts | lease dir"
    if not args:
        print(cjson.dumps({"error": usage}))
        return 2
    if args[0] in ("hosts", "dir"):
        reply = host_view() if args[0] == "hosts" else dir_view()
        send_record(sys.stdout.buffer, lease_record(reply))
        return 0
    command = {"poll": poll, "take": take, "untake": untake, "go": go}.get(args[0])
    if command is None or len(args) < 2:
        print(cjson.dumps({"error": f"unknown lease command {args[0]!r}"}))
        return 2
    job_dir = os.path.expanduser(args[1])
    if not os.path.isdir(job_dir):
        gone = LeaseState(state="gone", error=f"{job_dir} is missing")
        send_record(sys.stdout.buffer, lease_record(gone))
        return 0
    os.chdir(job_dir)
    send_record(sys.stdout.buffer, lease_record(command()))
    return 0


def in_line() -> tuple[Record, str] | None:
    """The node's queued record (its ticket's and lease's names, the supervisor) and
    the lease directory, while in line."""
    queued = read_json(QUEUED)
    if queued is None or not isinstance(queued.get("root"), str):
        return None
    return queued, queued["root"]


def poll(take_it: bool = False) -> LeaseState:
    """Where the node stands: started, ended, or in line and whether its turn came
    (`ready`), with what it waits for. Tells the supervisor its controller is there."""
    started = read_json(PIDS)
    if started is not None:
        return LeaseState(state="started", **started)
    ended = read_json(EXIT)
    if ended is not None:
        return LeaseState(state="ended", ended=ExitRecord(**ended))
    found = in_line()
    if found is None:
        return LeaseState(state="starting")
    queued, root = found
    with contextlib.suppress(OSError):
        os.utime(QUEUED)
    if isinstance(queued.get("claim"), str):  # a node of several: its controller drives it
        claim(root, queued["claim"])
    if not runs(queued.get("holder")):
        return LeaseState(state="gone", error="the node's supervisor vanished while in line")
    try:
        return _look(queued, root, take_it)
    except LeaseError as exc:
        return LeaseState(state="gone", error=f"cannot use the lease directory: {exc}")


def _look(queued: Record, root: str, take_it: bool) -> LeaseState:
    rules, said = load_policy()
    with locked(root):
        seen = scan(root)
        leases, tickets = seen
        warnings = seen.warnings + said
        ticket = seen.find(str(queued.get("ticket")))
        if ticket is None:
            return LeaseState(state="starting")  # its supervisor puts it back in line
        request = {"kind": ticket["kind"], "count": ticket["count"], "pool": ticket.get("pool", [])}
        busy: dict[int, Record] = {}
        now = time.time()
        if grant(request, ticket, leases, tickets, busy, now, rules) is not None:
            busy = busy_units(request, leases)  # nvidia-smi: only when it may matter
        units = grant(request, ticket, leases, tickets, busy, now, rules)
        if units is None:
            info = why_waiting(request, ticket, leases, tickets, busy, now, rules)
            return LeaseState(state="waiting", info=Waiting(**info), warnings=warnings)
        if not take_it:
            return LeaseState(state="ready", warnings=warnings)
        lease = {k: v for k, v in ticket.items() if k not in ("name", "order", "claim", "claimed")}
        lease.update(units=units, since=time.time())
        write_record(root, str(queued["lease"]), lease)
        warnings = [foreign_warning(b) for b in busy.values()] + warnings
        return LeaseState(state="taken", units=units, warnings=warnings)


def take() -> LeaseState:
    """Take the node's lease on behalf of its supervisor, if its turn came now."""
    return poll(take_it=True)


def untake() -> LeaseState:
    """Give back a lease `take` took (another host of the job refused)."""
    found = in_line()
    if found is not None:
        queued, root = found
        remove(root, str(queued.get("lease")))
    return LeaseState(state="waiting")


def go() -> LeaseState:
    """Tell the supervisor to start; wait until torchrun runs (or the node ended)."""
    open(GO, "a").close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        started = read_json(PIDS)
        if started is not None:
            return LeaseState(state="started", **started)
        ended = read_json(EXIT)
        if ended is not None:
            why = ended.get("error") or "the node ended before it started"
            return LeaseState(state="ended", ended=ExitRecord(**ended), error=why)
        time.sleep(0.02)
    return LeaseState(state="gone", error="torchrun did not start within 60 s of go")


def host_view() -> LeaseHosts:
    """Every live lease and ticket of the host, GPUs busy outside orch, and what
    was ignored."""
    root = lease_dir()
    if not os.path.isdir(root):
        return LeaseHosts(dir=root)
    seen = scan(root)
    unsafe = owner_warning(root)
    rules, said = load_policy()
    line = line_order(seen.tickets, seen.leases, time.time(), rules)
    return LeaseHosts(
        dir=root,
        leases=[LeaseRecord(**public(r)) for r in seen.leases],
        tickets=[LeaseRecord(**public(r), priority=priority_of(r, rules)) for r in line],
        foreign=[BusyGpu(**f) for f in foreign_gpus(seen.leases).values()],
        warnings=([unsafe] if unsafe else []) + seen.warnings + said,
    )


def dir_view() -> LeaseDir:
    """The lease directory, why it is not safe to share, and what of the host's
    policy file was ignored (`orch check`)."""
    root = lease_dir()
    _, policy = load_policy()
    try:
        uid = os.lstat(root).st_uid
    except OSError:
        missing = (
            f"the lease directory {root} does not exist: the first user whose job leases "
            f"here will own it, and can then remove anyone's lease; have root make it "
            f"at boot: 'd {root} 1777 root root -' in /etc/tmpfiles.d/orch.conf"
        )
        return LeaseDir(dir=root, exists=False, warning=missing, policy=policy)
    from ..host.proc import user_name

    return LeaseDir(
        dir=root, exists=True, owner=user_name(uid), warning=owner_warning(root), policy=policy
    )
