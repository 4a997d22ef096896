"""The lease's holder, a node's supervisor, before torchrun starts and after it ends:
its ticket, its wait for its turn (taking the lease itself, or waiting for its
controller to take it), torchrun recorded in the lease, the lease given back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Sequence

from ..host import proc
from ..kernel.fileio import write_json
from ..kernel.layout import EXIT, KILLED
from ..kernel.lease_wire import LeaseStart, Waiting, lease_record
from ..kernel.requests import StartRequest
from .admin import load_policy
from .fairness import PRIORITIES, Rules
from .gpus import busy_units
from .policy import Record, foreign_warning, grant, why_waiting
from .storage import (
    HOST,
    LeaseError,
    claim,
    lease_dir,
    locked,
    new_name,
    open_dir,
    owner_warning,
    read_record,
    remove,
    scan,
    write_record,
)

QUEUED = "queued.json"  # in the node's directory: its supervisor and ticket, while in line
GO = "go"  # in the node's directory: the controller took its leases; start
POLL_S = 0.1  # how often a supervisor in line looks again
GO_WAIT_S = 120.0  # a node of several waits this long for its controller's next poll
CLAIM_EVERY_S = 1.0  # a supervisor claims its ticket this often (policy.CLAIM_S)


class Turn:
    """A node's place in line and, once its turn came, its lease."""

    def __init__(self, request: Record | None) -> None:
        self.request = request
        self.root = ""
        self.holder = (os.getpid(), proc.start_time(os.getpid()) or 0)
        self.units: list[int] = []
        self.reported = False  # the start command's reply went out already (queued)
        self.warnings: list[str] = []
        # Unguessable, and the lease's unrelated to the ticket's (which every user
        # sees): nobody can have put a file at either beforehand.
        self.ticket_name = new_name("T", self.holder)
        self.lease_name = new_name("L", self.holder)
        self.claim_name = new_name("C", self.holder)  # made before the ticket names it
        self.claimed = 0.0  # when this supervisor last claimed its ticket (monotonic)

    def env(self) -> dict[str, str]:
        """What the lease adds to the job's environment."""
        if self.request is None:
            return {}
        units = ",".join(map(str, self.units))
        if self.request["kind"] == "gpu":
            return {"CUDA_VISIBLE_DEVICES": units, "ORCH_GPUS": units}
        return {"ORCH_SLOTS": units}

    def record(self, kind: str) -> Record:
        request = self.request or {}
        return {
            "kind": request.get("kind"),
            "count": int(request.get("count", 0)),
            "job": request.get("job"),
            "ticket": request.get("ticket"),
            "user": proc.user_name(os.getuid()),
            "uid": os.getuid(),
            "holder": list(self.holder),
            "boot": proc.boot_id(),
            "host": HOST,
            "pool": request.get("pool", []),
            "since": time.time(),
            "priority": request.get("priority", "normal"),
            "several": not request.get("self_start", True),
            **({"units": self.units} if kind == "L" else {"claim": self.claim_name}),
        }

    def claim(self) -> None:
        """Claim the ticket (policy.CLAIM_S), at most once a second."""
        if time.monotonic() - self.claimed >= CLAIM_EVERY_S:
            claim(self.root, self.claim_name)
            self.claimed = time.monotonic()

    def leave_line(self) -> None:
        remove(self.root, self.ticket_name)
        remove(self.root, self.claim_name)


def wait_turn(spec: StartRequest, ready_fd: int, warnings: Sequence[str] = ()) -> Turn | None:
    """The supervisor's wait in line, before torchrun starts: None when the node is
    not to start (busy with `wait` false, killed or given up while in line; its exit
    record says why and the start reply went out). `warnings`: the supervisor's own,
    for the first reply.

    A node that must wait says `queued` in the start reply at once (the controller
    may go away: a detached job's node takes its turn alone), then waits.
    """
    # The lease code keeps records as the host's lease files hold them: plain JSON.
    turn = Turn(spec.lease.as_dict() if spec.lease else None)
    turn.warnings.extend(warnings)
    if turn.request is None:
        return turn
    request = turn.request
    rules, said = load_policy()
    turn.warnings.extend(said)
    refused = not_allowed(request, rules)
    if refused:
        refuse(turn, ready_fd, refused, refused=True)
        return None
    try:
        turn.root = open_dir(lease_dir())
        turn.claim()
        write_record(turn.root, turn.ticket_name, turn.record("T"))
    except (OSError, LeaseError) as exc:
        refuse(turn, ready_fd, f"cannot use the lease directory: {exc}")
        return None
    unsafe = owner_warning(turn.root)
    if unsafe:
        turn.warnings.append(unsafe)
    queued = {
        "holder": list(turn.holder),
        "ticket": turn.ticket_name,
        "lease": turn.lease_name,
        "claim": turn.claim_name,
    }
    write_json(QUEUED, {**queued, "root": turn.root})
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while True:
        try:
            info = try_take(turn) if request.get("self_start", True) else taken_by_controller(turn)
        except (OSError, LeaseError) as exc:  # the lock held too long, the directory gone
            turn.leave_line()
            if not turn.reported:
                refuse(turn, ready_fd, f"cannot use the lease directory {turn.root}: {exc}")
            else:
                end_in_line(f"cannot use the lease directory {turn.root}: {exc}")
            return None
        if info is None:
            break
        if not request.get("wait", True):
            turn.leave_line()
            refuse(turn, ready_fd, "busy", info)
            return None
        if not turn.reported:
            reply = LeaseStart(queued=Waiting(**info), warnings=turn.warnings)
            os.write(ready_fd, json.dumps(lease_record(reply)).encode())
            os.close(ready_fd)
            turn.reported = True
        why = gave_up(turn, stop)
        if why:
            turn.leave_line()
            remove(turn.root, turn.lease_name)
            end_in_line(why)
            return None
        time.sleep(POLL_S)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    turn.leave_line()
    with contextlib.suppress(OSError):
        os.unlink(QUEUED)
    return turn


def not_allowed(request: Record, rules: Rules) -> str:
    """Why the host's policy refuses the node at once (a priority its user may not
    use, more units than its user may ever hold here), or ''."""
    me, name = os.getuid(), proc.user_name(os.getuid())
    priority = request.get("priority", "normal")
    where = f"the policy {rules.source}" if rules.source else "no policy file"
    if priority not in PRIORITIES:
        return f"unknown priority {priority!r}: low, normal or high"
    if not rules.may_use(me, priority):
        return f"priority {priority} is not open to {name} here ({where} names who may use it)"
    most = rules.limit(me, request["kind"])
    if most is not None and int(request["count"]) > most:
        unit = "GPU" if request["kind"] == "gpu" else "slot"
        return (
            f"the node needs {request['count']} {unit}s, but {where} lets {name} hold "
            f"at most {most} here"
        )
    return ""


def try_take(turn: Turn) -> Record | None:
    """Take the lease if the node's turn came (None), else say what it waits for."""
    assert turn.request is not None
    turn.claim()  # a node alone: its supervisor drives its ticket
    rules, said = load_policy()
    with locked(turn.root):
        found = scan(turn.root)
        leases, tickets = found
        for warning in found.warnings + said:
            if warning not in turn.warnings:
                turn.warnings.append(warning)
        mine = found.find(turn.ticket_name)
        if mine is None:  # removed by the directory's owner: back in line, at the end
            write_record(turn.root, turn.ticket_name, turn.record("T"))
            mine = {**turn.record("T"), "name": turn.ticket_name, "order": time.time()}
            tickets.append(mine)
        now = time.time()
        if grant(turn.request, mine, leases, tickets, {}, now, rules) is None:
            return why_waiting(turn.request, mine, leases, tickets, {}, now, rules)
        busy = busy_units(turn.request, leases)  # nvidia-smi: only when it may matter
        units = grant(turn.request, mine, leases, tickets, busy, now, rules)
        if units is not None:
            turn.units = units
            write_record(turn.root, turn.lease_name, turn.record("L"))
            turn.warnings = [foreign_warning(b) for b in busy.values()] + turn.warnings
            return None
        return why_waiting(turn.request, mine, leases, tickets, busy, now, rules)


def taken_by_controller(turn: Turn) -> Record | None:
    """A node of several: its controller takes the lease for it (`take`), then says
    go. None once it did."""
    if os.path.exists(GO):
        lease, _ = read_record(turn.root, turn.lease_name)
        if lease is not None:
            turn.units = [int(u) for u in lease.get("units", [])]
            return None
    assert turn.request is not None
    return {"kind": turn.request["kind"], "want": turn.request["count"], "waiting_for": "go"}


def gave_up(turn: Turn, stop: list[int]) -> str:
    """Why a node in line stops waiting, or ''."""
    if stop or os.path.exists(KILLED):
        return "killed while it waited in line"
    assert turn.request is not None
    if not turn.request.get("self_start", True):
        with contextlib.suppress(OSError):
            if time.time() - os.stat(QUEUED).st_mtime > GO_WAIT_S:
                return "its controller stopped asking while it waited in line (a job of several nodes needs its controller to start)"
    return ""


def refuse(
    turn: Turn, ready_fd: int, why: str, info: Record | None = None, refused: bool = False
) -> None:
    """Answer the start: the node does not start (`refused`: the host's policy says
    no to what it asks; `info`: busy, and told not to wait)."""
    if info:
        reply = LeaseStart(busy=Waiting(**info), warnings=turn.warnings)
    elif refused:
        reply = LeaseStart(refused=why, warnings=turn.warnings)
    else:
        reply = LeaseStart(error=why)
    os.write(ready_fd, json.dumps(lease_record(reply)).encode())
    os.close(ready_fd)
    turn.reported = True
    end_in_line(why)


def end_in_line(why: str) -> None:
    write_json(EXIT, {"returncode": None, "error": why, "ended": time.time(), "queued": True})
    with contextlib.suppress(OSError):
        os.unlink(QUEUED)


def attach(turn: Turn | None, pid: int) -> None:
    """Record torchrun in the lease: it keeps the lease alive if the supervisor dies."""
    if turn is None or turn.request is None or not turn.units:
        return
    record = turn.record("L")
    record["torchrun"] = [pid, proc.start_time(pid)]
    with contextlib.suppress(OSError):
        write_record(turn.root, turn.lease_name, record)


def release(turn: Turn | None) -> None:
    """Give the lease back: the node's job ended, however it did."""
    if turn is not None and turn.root:
        remove(turn.root, turn.lease_name)
        turn.leave_line()
