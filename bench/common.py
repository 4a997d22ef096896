"""Helpers shared by the benchmarks: OpenSSH baselines and finding a job's processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from tests.cluster import Cluster, Controller


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
