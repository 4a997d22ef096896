"""Leases of a host's GPUs and slots, shared by every user of the host, and the line
that jobs wait in when they are busy. No daemon: each node's supervisor takes its
own lease, and a lease whose holder is gone counts for nothing.

**Where**: one local directory per host that every user can write
(`lease_dir`): /run/lock (a tmpfs: a reboot empties it), else /dev/shm, else
/var/tmp. It must be sticky (mode 1777): a user can then remove only their own
files. Each file is created O_EXCL by its owner, 0644, and holds no job env, only
who holds what: job id, user, pids, since when.

    .lock                  flock()ed around every look-and-take (opened read-only)
    L-UID-PID-START.json   a lease: units held by the supervisor PID (START: its
                           start time, which names it for good)
    T-UID-PID-START.json   a ticket: a supervisor waiting in line

**A lease lives** while its supervisor or its torchrun runs (pid and start time,
on this boot of this host); any other lease is stale: it holds nothing, and its
owner's next look removes it. A host that reboots forgets its pids (the boot id
is recorded). A ticket lives while its supervisor does.

**The line**: tickets order by (time of submit, job id), the same key on every
host of a job. A ticket may take units when the free ones, less what every older
ticket of the same kind wants, still leave enough: first come, first served, and
a job that needs a whole host is never overtaken by a stream of small ones. Jobs
of one node take their lease as soon as their turn comes (`self_start`). Jobs of
several nodes take them all or none: their controller asks each host whether the
turn came (`poll`), takes every lease (`take`), and if one host refused, gives
the others back (`untake`) and keeps waiting; the one global order of tickets
means the oldest job always wins every host it waits for, so two jobs never
deadlock and neither holds a host while it waits for another.

GPUs that nvidia-smi shows in use by a process and that no live lease holds are
busy too (a process orch did not start); each comes with a warning naming it.

Commands: `lease poll|take|untake|go JOB_DIR`, `lease hosts`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Iterator
from typing import Any, Dict  # noqa: UP035

from ..host import nvidia, proc
from ..kernel.protocol import EXIT, KILLED, PIDS, read_json, send_record, write_json

LEASE_DIRS = ("/run/lock/orch-leases", "/dev/shm/orch-leases", "/var/tmp/orch-leases")
LOCK = ".lock"
QUEUED = "queued.json"  # in the node's directory: its supervisor and ticket, while in line
GO = "go"  # in the node's directory: the controller took its leases; start
POLL_S = 0.1  # how often a supervisor in line looks again
GO_WAIT_S = 120.0  # a node of several waits this long for its controller's next poll
HOST = os.uname().nodename  # pids mean something on this host only (a shared /dev/shm)

Record = Dict[str, Any]  # noqa: UP006 (run at import: hosts may have Python 3.8)


class LeaseError(Exception):
    """The lease directory cannot be used safely."""


# ---------------------------------------------------------------- the directory


def lease_dir() -> str:
    """The host's lease directory: ORCH_LEASE_DIR where set (tests), else the first of
    LEASE_DIRS whose parent exists. Every user of the host makes the same choice."""
    given = os.environ.get("ORCH_LEASE_DIR")
    if given:
        return given
    for path in LEASE_DIRS:
        if os.path.isdir(os.path.dirname(path)):
            return path
    return LEASE_DIRS[-1]


def open_dir(root: str) -> str:
    """Create the lease directory (sticky, writable by all) or check the one there.

    Raises:
        LeaseError: it is a link, not a directory, or not sticky (anyone could remove
            another's lease).
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
        os.chmod(root, 0o1777)  # after mkdir: the umask would take bits away
    info = os.lstat(root)
    deadline = time.monotonic() + 1.0
    while stat.S_ISDIR(info.st_mode) and info.st_mode & 0o7777 == 0o700:
        if time.monotonic() > deadline:  # not one just made by a node beside this one
            break
        time.sleep(0.01)  # its maker is between its mkdir and its chmod
        info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode):
        raise LeaseError(f"{root} is not a directory")
    if not info.st_mode & stat.S_ISVTX or info.st_mode & 0o777 != 0o777:
        raise LeaseError(
            f"{root} has mode {info.st_mode & 0o7777:o}, not 1777: "
            "every user must be able to take a lease and none to remove another's"
        )
    return root


@contextlib.contextmanager
def locked(root: str) -> Iterator[None]:
    """Hold the directory's lock: one look-and-take at a time on this host. The lock
    file is opened read-only, so that one user's file serves every user."""
    import fcntl

    path = os.path.join(root, LOCK)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        os.fchmod(fd, 0o644)
    except FileExistsError:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def write_record(root: str, name: str, record: Record) -> None:
    """Write one of this user's files whole: a new temporary file (O_EXCL, never
    through a link someone planted), 0644, renamed into place."""
    tmp = os.path.join(root, f".{name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, json.dumps(record).encode())
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(root, name))


def remove(root: str, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, name))


def file_name(prefix: str, holder: tuple[int, int]) -> str:
    return f"{prefix}-{os.getuid()}-{holder[0]}-{holder[1]}.json"


# ---------------------------------------------------------------- what is held


def runs(pair: Any) -> bool:
    """Whether [pid, start time] names a process that still runs."""
    if not pair or pair[1] is None:
        return False
    return proc.alive(int(pair[0])) and proc.start_time(int(pair[0])) == int(pair[1])


def is_live(record: Record, boot: str) -> bool:
    """A lease lives while its supervisor or its torchrun runs, on this boot; a ticket
    while its supervisor does."""
    if record.get("boot") != boot or record.get("host", HOST) != HOST:
        return False  # another boot, or another host whose directory this is too
    return runs(record.get("holder")) or runs(record.get("torchrun"))


def scan(root: str) -> tuple[list[Record], list[Record]]:
    """The live leases and tickets of the host; this user's stale ones are removed
    (another user's stay, as the sticky directory wants: they count for nothing, and
    so do another host's, in a directory that hosts share: they are its to remove)."""
    boot, me = proc.boot_id(), os.getuid()
    leases: list[Record] = []
    tickets: list[Record] = []
    for name in sorted(os.listdir(root)):
        if name[:2] not in ("L-", "T-") or not name.endswith(".json"):
            continue
        record = read_json(os.path.join(root, name))
        if record is None:
            continue
        record["name"] = name
        if not is_live(record, boot):
            if record.get("uid") == me and record.get("host", HOST) == HOST:
                remove(root, name)
            continue
        (leases if name.startswith("L-") else tickets).append(record)
    tickets.sort(key=ticket_key)
    return leases, tickets


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


def foreign_gpus(leases: list[Record]) -> dict[int, Record]:
    """GPUs in use by a process that no live lease accounts for: {index: {gpu, pid,
    user}}. Empty where nvidia-smi is missing or fails."""
    smi = nvidia.find()
    if smi is None:
        return {}
    listed = nvidia.run(smi, "gpu=index,uuid")
    apps = nvidia.run(smi, nvidia.APPS_QUERY)
    if listed.error is not None or apps.error is not None:
        return {}
    gpus = [{"index": int(cells[0]), "uuid": cells[1]} for cells in nvidia.rows(listed.text, 2)[0]]
    held = held_units(leases, "gpu")
    found: dict[int, Record] = {}
    for gpu, app in nvidia.held(gpus, nvidia.processes(apps.text)):
        if gpu["index"] not in held:
            pid = app["pid"]
            found.setdefault(
                gpu["index"], {"gpu": gpu["index"], "pid": pid, "user": proc.user_of(pid)}
            )
    return found


def busy_units(request: Record, leases: list[Record]) -> dict[int, Record]:
    return foreign_gpus(leases) if request["kind"] == "gpu" else {}


# ---------------------------------------------------------------- the supervisor's side


class Turn:
    """A node's place in line and, once its turn came, its lease."""

    def __init__(self, request: Record | None) -> None:
        self.request = request
        self.root = ""
        self.holder = (os.getpid(), proc.start_time(os.getpid()) or 0)
        self.units: list[int] = []
        self.reported = False  # the start command's reply went out already (queued)
        self.warnings: list[str] = []

    @property
    def lease_name(self) -> str:
        return file_name("L", self.holder)

    @property
    def ticket_name(self) -> str:
        return file_name("T", self.holder)

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
            **({"units": self.units} if kind == "L" else {}),
        }


def wait_turn(spec: Record, ready_fd: int) -> Turn | None:
    """The supervisor's wait in line, before torchrun starts: None when the node is
    not to start (busy with `wait` false, killed or given up while in line; its exit
    record says why and the start reply went out).

    A node that must wait says `queued` in the start reply at once (the controller
    may go away: a detached job's node takes its turn alone), then waits.
    """
    turn = Turn(spec.get("lease"))
    if turn.request is None:
        return turn
    request = turn.request
    try:
        turn.root = open_dir(lease_dir())
        write_record(turn.root, turn.ticket_name, turn.record("T"))
    except (OSError, LeaseError) as exc:
        refuse(turn, ready_fd, f"cannot use the lease directory: {exc}")
        return None
    write_json(QUEUED, {"holder": list(turn.holder), "ticket": turn.ticket_name, "root": turn.root})
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while True:
        try:
            info = try_take(turn) if request.get("self_start", True) else taken_by_controller(turn)
        except OSError as exc:  # the lock file is not readable (another user's doing)
            remove(turn.root, turn.ticket_name)
            if not turn.reported:
                refuse(turn, ready_fd, f"cannot use the lease directory {turn.root}: {exc}")
            else:
                end_in_line(f"cannot use the lease directory {turn.root}: {exc}")
            return None
        if info is None:
            break
        if not request.get("wait", True):
            remove(turn.root, turn.ticket_name)
            refuse(turn, ready_fd, "busy", info)
            return None
        if not turn.reported:
            os.write(ready_fd, json.dumps({"queued": info}).encode())
            os.close(ready_fd)
            turn.reported = True
        why = gave_up(turn, stop)
        if why:
            remove(turn.root, turn.ticket_name)
            remove(turn.root, turn.lease_name)
            end_in_line(why)
            return None
        time.sleep(POLL_S)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    remove(turn.root, turn.ticket_name)
    with contextlib.suppress(OSError):
        os.unlink(QUEUED)
    return turn


def try_take(turn: Turn) -> Record | None:
    """Take the lease if the node's turn came (None), else say what it waits for."""
    assert turn.request is not None
    with locked(turn.root):
        leases, tickets = scan(turn.root)
        mine = {**turn.record("T"), "name": turn.ticket_name}
        if grant(turn.request, mine, leases, tickets, {}) is None:
            return why_waiting(turn.request, mine, leases, tickets, {})
        busy = busy_units(turn.request, leases)  # nvidia-smi: only when it may matter
        units = grant(turn.request, mine, leases, tickets, busy)
        if units is not None:
            turn.units = units
            write_record(turn.root, turn.lease_name, turn.record("L"))
            turn.warnings = [foreign_warning(b) for b in busy.values()]
            return None
        return why_waiting(turn.request, mine, leases, tickets, busy)


def taken_by_controller(turn: Turn) -> Record | None:
    """A node of several: its controller takes the lease for it (`take`), then says
    go. None once it did."""
    if os.path.exists(GO):
        lease = read_json(os.path.join(turn.root, turn.lease_name))
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


def refuse(turn: Turn, ready_fd: int, why: str, info: Record | None = None) -> None:
    reply: Record = {"busy": info} if info is not None else {"error": why}
    os.write(ready_fd, json.dumps(reply).encode())
    os.close(ready_fd)
    turn.reported = True
    end_in_line(why)


def end_in_line(why: str) -> None:
    write_json(EXIT, {"returncode": None, "error": why, "ended": time.time(), "queued": True})
    with contextlib.suppress(OSError):
        os.unlink(QUEUED)


def foreign_warning(found: Record) -> str:
    return (
        f"GPU {found['gpu']} is in use by pid {found['pid']} (user {found['user']}), "
        "which orch did not start: counted busy"
    )


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
        remove(turn.root, turn.ticket_name)


# ---------------------------------------------------------------- commands


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
