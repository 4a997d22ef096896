"""Helpers shared by the benchmarks: OpenSSH baselines and finding a job's processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.cluster import Cluster, Controller


@dataclass(frozen=True)
class Usage:
    """What one process used, with the children it waited for: CPU seconds (user +
    system, every thread) and its peak resident memory."""

    cpu_s: float
    peak_rss_mb: float


def wait_usage(proc: subprocess.Popen[Any], timeout: float | None = None) -> Usage:
    """Wait for a child as `proc.wait()` does, and return what it used.

    `os.wait4` gives that one process's rusage; `RUSAGE_CHILDREN` would mix in every
    other child this process ever waited for (the baselines' ssh clients), and its
    ru_maxrss is the largest of them all, not this one's.

    Raises:
        subprocess.TimeoutExpired: it still runs after `timeout` seconds.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, 0 if deadline is None else os.WNOHANG)
        if pid:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0)
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Usage(usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)  # kB on Linux


def run_usage(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[float, Usage]:
    """Run a command to its end (its output discarded); its wall seconds and usage.

    Raises:
        RuntimeError: it failed (with the end of its stderr).
    """
    with tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        usage = wait_usage(proc, timeout)
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{argv[0]} {argv[1]} exited {proc.returncode}: {tail}")
    return seconds, usage


def cpu_seconds(pid: int) -> float:
    """CPU seconds a running process has used so far (user + system, every thread)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot, all cores together: the
    test hosts' processes, sshds and agents as well as the controller (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(t) for t in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is in user


def ssh_client(cluster: Cluster, controller: Controller) -> list[str]:
    """Plain OpenSSH, as a user types it, with the test cluster's key and known_hosts.

    The argv up to the destination: ``ssh_argv`` adds one, ``rsync -e`` takes it whole.
    """
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(cluster.client_key),
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={controller.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
    ]


def ssh_argv(cluster: Cluster, controller: Controller, address: str, command: str) -> list[str]:
    """``command`` run as root on ``address`` through ``ssh_client``."""
    return [*ssh_client(cluster, controller), f"root@{address}", command]


def tagged_pids(tag: bytes) -> list[int]:
    """Processes anywhere on this machine whose environment holds `tag` (NAME=value).

    The test hosts' pid namespaces are nested in this one, so one scan of /proc sees
    every host's processes at once, with no round trip to any host.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat") as s:
                        if s.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(entry))
        except OSError:
            continue
    return found


def wait_gone(tag: bytes, timeout: float, poll: float = 0.01) -> float | None:
    """Seconds (time.time()) when the last tagged process was gone, or None at timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not tagged_pids(tag):
            return time.time()
        time.sleep(poll)
    return None


def place_file(cluster: Cluster, controller: Controller, source: Path, remote_dir: str) -> None:
    """Put a file on every host (not timed): what the baselines start from."""
    data = source.read_bytes()
    for host in cluster.hosts:
        cmd = f"mkdir -p {remote_dir} && cat > {remote_dir}/{source.name}"
        subprocess.run(ssh_argv(cluster, controller, host.address, cmd), input=data, check=True)


def wait_ranks_ready(cluster: Cluster, job_id: str, ranks: int, timeout: float = 120) -> None:
    """Wait until every rank of a job printed `ready r<RANK>` (tests' workload.py), read
    from the hosts' own log files, which this machine sees, with no round trip."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = 0
        for host in cluster.hosts:
            for log in (host.home / ".orch" / "jobs" / job_id / host.name / "logs").glob(
                "rank-*.log"
            ):
                with contextlib.suppress(OSError):
                    ready += b"ready r" in log.read_bytes()
        if ready >= ranks:
            return
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id}: not every rank got ready within {timeout:.0f} s")
