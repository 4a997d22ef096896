"""What the agent reads of /proc: processes, their groups, command lines and
environments, and TCP sockets. Linux only, no tools needed; a process that vanished
or that this user may not look into is skipped, never an error."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any

TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def boot_id() -> str:
    """The kernel's id of this boot ("?" where it cannot be read): pids recorded before
    a reboot name nothing after it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "?"


def host_id() -> str:
    """Names this host among those that share a filesystem: pids mean something only
    where they were recorded. The hostname, and the kernel's boot id (a rebooted host
    is another host: its old pids are gone)."""
    return f"{os.uname().nodename}/{boot_id()}"


def uptime() -> float | None:
    """Seconds since this host booted: with a process's start time, its age."""
    try:
        with open("/proc/uptime") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When a process started, in clock ticks since boot: with its pid, it names one
    process for good (a pid alone may be reused by another)."""
    fields = stat(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether `pid` runs and is not a zombie."""
    fields = stat(pid)
    return fields is not None and fields[0] != "Z"


def stats() -> list[tuple[int, list[str]]]:
    """(pid, stat fields after the command name) of every live, non-zombie process in
    this host's process table."""
    result = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat(int(entry))
            if fields is not None and fields[0] != "Z":
                result.append((int(entry), fields))
    return result


def processes() -> list[tuple[int, int]]:
    """(pid, pgid) of every live, non-zombie process in this host's process table."""
    return [(pid, int(fields[2])) for pid, fields in stats()]


def cmdline(pid: int) -> str | None:
    """A process's command line, words joined by spaces (at most 200 characters)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return None
    return " ".join(w.decode("utf-8", "replace") for w in words)[:200]


def environ(pid: int) -> list[bytes]:
    """A process's environment, `NAME=value` entries; none where it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def has_env(pid: int, entry: bytes) -> bool:
    """Whether a process's environment holds `entry` (`NAME=value`) exactly."""
    return entry in environ(pid)


def user_of(pid: int) -> str:
    """The name of the user a process runs as (its real uid), "?" where it cannot be
    told."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return user_name(int(line.split()[1]))
    except (OSError, ValueError, IndexError):
        pass
    return "?"


def uid_of(pid: int) -> int | None:
    """The user a process runs as (the owner of its /proc entry), None where it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def lock_holders(device: int, inode: int) -> list[int]:
    """The pids that hold a lock (flock, POSIX) on the file (`device`, `inode`), from
    /proc/locks; those waiting for it are left out, and so are holders in another pid
    namespace (pid 0 here)."""
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    wanted = (os.major(device), os.minor(device), inode)
    pids = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->":
            continue
        try:
            major, minor, ino = fields[5].split(":")
            found = (int(major, 16), int(minor, 16), int(ino))
            pid = int(fields[4])
        except ValueError:
            continue
        if found == wanted and pid > 0 and pid not in pids:
            pids.append(pid)
    return pids


def tcp_sockets() -> list[dict[str, Any]]:
    """Every TCP socket of this network namespace (v4 and v6)."""
    rows: list[dict[str, Any]] = []
    for table in TCP_TABLES:
        try:
            with open(table) as f:
                rows += parse_tcp_table(f.read())
        except OSError:
            continue
    return rows


def parse_tcp_table(text: str) -> list[dict[str, Any]]:
    """Rows of /proc/net/tcp or tcp6: local address and port, state, uid, inode."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1]:
            continue
        hex_addr, hex_port = fields[1].rsplit(":", 1)
        rows.append(
            {
                "addr": hex_address(hex_addr),
                "port": int(hex_port, 16),
                "state": TCP_STATES.get(fields[3], fields[3]),
                "uid": int(fields[7]),
                "inode": int(fields[9]),
            }
        )
    return rows


def hex_address(hex_addr: str) -> str:
    """/proc/net/tcp's address (little-endian 32-bit words) as text."""
    import socket

    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words)


def port_listening(port: int) -> bool:
    """Whether anything on this host listens on TCP `port`."""
    return any(s["port"] == port and s["state"] == "LISTEN" for s in tcp_sockets())


def socket_owners(inodes: set[int]) -> dict[int, int]:
    """Which process holds each socket inode; processes we may not look into are skipped."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes if inode}
    owners: dict[int, int] = {}
    if not wanted:
        return owners
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(wanted[target], int(entry))
        if len(owners) == len(wanted):
            break
    return owners


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group; one that is gone already is no error."""
    import contextlib

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def signal_pid(pid: int, sig: int) -> None:
    """Signal a process; one that is gone already is no error."""
    import contextlib

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
