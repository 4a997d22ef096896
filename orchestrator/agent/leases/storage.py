"""The lease directory of a host and the records in it: where it is, that it is safe to
use (sticky, writable by all), its lock, whole writes, and which records still live
(`scan`). The package's docstring tells the files and their lifetime.

Every user of the host can put any file in the directory: a record is read without
following a link or blocking (a FIFO, /dev/zero), from a regular file only, at most
MAX_RECORD bytes, and counts only when its fields check (policy.check_record) and
its `uid` owns its file. What is ignored comes back as a warning that names the
file's owner. The lock is taken with a deadline, and whoever holds it longer is
named; names are unguessable, so that no file planted beforehand is in the way."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from collections.abc import Iterator
from typing import Any

from ..host import proc
from .policy import CLAIM_S, Record, check_record, ticket_key

LEASE_DIRS = ("/run/lock/orch-leases", "/dev/shm/orch-leases", "/var/tmp/orch-leases")
LOCK = ".lock"  # what agents before the directory's own lock flock()ed: taken too
MAX_RECORD = 64 << 10  # bytes: a record is a few hundred
LOCK_WAIT_S = 8.0  # a look-and-take holds the lock for at most an nvidia-smi call
HOST = os.uname().nodename  # pids mean something on this host only (a shared /dev/shm)


class LeaseError(Exception):
    """The lease directory cannot be used safely."""


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


def owner_warning(root: str) -> str | None:
    """Why the lease directory is not safe from its owner, or None: whoever owns it
    (if not root) may remove anyone's lease, and two jobs then share the units."""
    try:
        info = os.lstat(root)
    except OSError:
        return None
    if info.st_uid == 0:
        return None
    who = proc.user_name(info.st_uid)
    return (
        f"the lease directory {root} belongs to {who}, not root: {who} can remove "
        f"anyone's lease there, and two jobs then share GPUs or slots without a word; "
        f"as root, chown root:root {root}, and add 'd {root} 1777 root root -' to "
        f"/etc/tmpfiles.d/orch.conf so that root makes it at boot"
    )


@contextlib.contextmanager
def locked(root: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the directory's lock: one look-and-take at a time on this host.

    The lock is the directory itself, flock()ed through a read-only descriptor: every
    user can open it and none but its owner can take that away (a `.lock` file made
    000 by another user locks nobody out). The `.lock` of older agents is taken too,
    where it can be opened.

    Raises:
        LeaseError: the lock stayed held for `wait_s` (naming who holds it), or the
            directory cannot be opened.
    """
    deadline = time.monotonic() + wait_s
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | O_CLOEXEC))
        except OSError as exc:
            raise LeaseError(f"cannot open the lease directory {root}: {exc.strerror}") from exc
        _flock(fds[-1], root, deadline, wait_s)
        legacy = _open_regular(os.path.join(root, LOCK))
        if legacy is not None:
            fds.append(legacy)
            _flock(legacy, os.path.join(root, LOCK), deadline, wait_s)
        yield
    finally:
        for fd in fds:
            os.close(fd)  # releases the lock


O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _flock(fd: int, path: str, deadline: float, wait_s: float) -> None:
    import fcntl

    pause = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise LeaseError(
                    f"{path} has been locked for {wait_s:.0f} s {held_by(fd)}"
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)


def held_by(fd: int) -> str:
    """Who holds the lock on `fd`'s file: `by pid 4242 (user bob: flock ...)`."""
    info = os.fstat(fd)
    pids = proc.lock_holders(info.st_dev, info.st_ino)
    if not pids:
        return "by a process this user cannot see"
    named = [f"pid {pid} (user {proc.user_of(pid)}: {proc.cmdline(pid) or '?'})" for pid in pids]
    return "by " + ", ".join(named) + "; ask its user to end it, or root to kill it"


def _open_regular(path: str) -> int | None:
    """A read-only descriptor of the regular file at `path`, not through a link and
    without blocking (a FIFO); None where there is none or it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def new_name(prefix: str, holder: tuple[int, int]) -> str:
    """A name for one of this user's files that nobody could have known beforehand:
    a file planted at a predictable name would block the write, or the removal."""
    return f"{prefix}-{os.getuid()}-{holder[0]}-{holder[1]}-{os.urandom(8).hex()}.json"


def write_record(root: str, name: str, record: Record) -> None:
    """Write one of this user's files whole: a new temporary file of an unguessable
    name (O_EXCL, never through a link someone planted), 0644, renamed into place."""
    tmp = os.path.join(root, f".{name}.{os.urandom(8).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | O_CLOEXEC, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, json.dumps(record).encode())
    finally:
        os.close(fd)
    try:
        os.rename(tmp, os.path.join(root, name))
    except OSError:
        remove(root, os.path.basename(tmp))
        raise


def claim(root: str, name: str) -> None:
    """Claim one of this user's tickets (policy.CLAIM_S): touch its claim file, which
    gets a new change time; make it where it is gone (its directory's owner may remove
    it). Best effort: a ticket not claimed is passed, never lost."""
    path = os.path.join(root, name)
    try:
        os.utime(path, follow_symlinks=False)
    except FileNotFoundError:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | O_CLOEXEC
        with contextlib.suppress(OSError):
            os.close(os.open(path, flags, 0o644))
    except OSError:
        pass


def claimed_at(root: str, record: Record) -> float:
    """When a ticket was last claimed: its claim file's change time, if the ticket's
    own user made that file, and no earlier than the ticket's (`claimed`, its file's
    change time). Nobody can set a change time, nor touch another user's file."""
    at = float(record["claimed"])
    name = record.get("claim")
    if name:
        with contextlib.suppress(OSError):
            info = os.lstat(os.path.join(root, name))
            if stat.S_ISREG(info.st_mode) and info.st_uid == record["uid"]:
                at = max(at, info.st_ctime)
    return at


def remove(root: str, name: str) -> None:
    """Remove one of this user's files; one that is gone, or not this user's to
    remove (the directory's sticky bit), is left as it is."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        os.unlink(os.path.join(root, name))


def read_record(root: str, name: str) -> tuple[Record | None, str]:
    """A lease or ticket of the directory, checked (policy.check_record); else None
    and why it does not count ('' where the file is gone)."""
    path = os.path.join(root, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "a symbolic link"
        return None, f"cannot be read ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        data = b""
        while len(data) <= MAX_RECORD:
            chunk = os.read(fd, MAX_RECORD + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    finally:
        os.close(fd)
    if len(data) > MAX_RECORD:
        return None, f"larger than {MAX_RECORD >> 10} KiB"
    try:
        parsed = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None, "not JSON"
    return check_record(parsed, name, info.st_uid, info.st_ctime)


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not a number")


def owner_of(root: str, name: str) -> str:
    """`user bob (uid 1001)`: who owns a file of the directory."""
    try:
        uid = os.lstat(os.path.join(root, name)).st_uid
    except OSError:
        return "a user now gone"
    return f"user {proc.user_name(uid)} (uid {uid})"


def runs(pair: Any, uid: int | None = None) -> bool:
    """Whether [pid, start time] names a process that still runs (as `uid`, if given:
    a record names only its own user's processes)."""
    if not pair or pair[1] is None:
        return False
    pid = int(pair[0])
    if not (proc.alive(pid) and proc.start_time(pid) == int(pair[1])):
        return False
    return uid is None or proc.uid_of(pid) == uid


def is_live(record: Record, boot: str) -> bool:
    """A lease lives while its supervisor or its torchrun runs, on this boot; a ticket
    while its supervisor does."""
    if record.get("boot") != boot or record.get("host", HOST) != HOST:
        return False  # another boot, or another host whose directory this is too
    uid = record.get("uid")
    return runs(record.get("holder"), uid) or runs(record.get("torchrun"), uid)


class Scan:
    """The live leases and tickets of the host (tickets in line order), and a warning
    for each file that looked like one and was ignored."""

    def __init__(self) -> None:
        self.leases: list[Record] = []
        self.tickets: list[Record] = []
        self.warnings: list[str] = []

    def __iter__(self) -> Iterator[list[Record]]:  # leases, tickets = scan(root)
        return iter((self.leases, self.tickets))

    def find(self, name: str) -> Record | None:
        return next((r for r in self.leases + self.tickets if r["name"] == name), None)


def scan(root: str) -> Scan:
    """The live leases and tickets of the host; this user's stale ones are removed
    (another user's stay, as the sticky directory wants: they count for nothing, and
    so do another host's, in a directory that hosts share: they are its to remove).
    A file that is no record (not a regular file, too large, wrong types, claiming
    another user) counts for nothing either, and is named in `warnings`."""
    boot, me = proc.boot_id(), os.getuid()
    found = Scan()
    names = sorted(os.listdir(root))
    claims = {n for n in names if n.startswith("C-")}
    for name in names:
        if name[:2] not in ("L-", "T-") or not name.endswith(".json"):
            continue
        record, why = read_record(root, name)
        if record is None:
            if why:
                found.warnings.append(
                    f"ignored {os.path.join(root, name)!r} of {owner_of(root, name)}: {why}"
                )
            continue
        claims.discard(record.get("claim", ""))
        if not is_live(record, boot):
            if record["uid"] == me and record.get("host", HOST) == HOST:
                remove(root, name)
                if record.get("claim"):
                    remove(root, str(record["claim"]))
            continue
        if name.startswith("T-"):
            record["claimed"] = claimed_at(root, record)
            found.tickets.append(record)
        else:
            found.leases.append(record)
    found.tickets.sort(key=ticket_key)
    _remove_orphans(root, claims, me)
    return found


ORPHAN_S = 6 * CLAIM_S  # a claim file is made just before its ticket


def _remove_orphans(root: str, claims: set[str], me: int) -> None:
    """This user's claim files that no ticket names any more (a supervisor killed
    between the two writes), once they are old enough not to be a new ticket's."""
    stale = time.time() - ORPHAN_S
    for name in claims:
        with contextlib.suppress(OSError):
            info = os.lstat(os.path.join(root, name))
            if info.st_uid == me and info.st_ctime < stale:
                remove(root, name)
