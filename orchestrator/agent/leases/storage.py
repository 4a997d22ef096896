"""The lease directory of a host and the records in it: where it is, that it is safe to
use (sticky, writable by all), its lock, whole writes, and which records still live
(`scan`). The package's docstring tells the files and their lifetime."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Iterator
from typing import Any

from ..host import proc
from ..kernel.protocol import read_json
from .policy import Record, ticket_key

LEASE_DIRS = ("/run/lock/orch-leases", "/dev/shm/orch-leases", "/var/tmp/orch-leases")
LOCK = ".lock"
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
