"""The test network: its number (``ORCH_TEST_NET``), the names and addresses made from
it, the lock that keeps one cluster per network, the kernel's ARP table limits, and
the removal of what a crashed run left on it."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tests.cluster.commands import ClusterError, _json_list, _kill_children_first, _run

log = logging.getLogger(__name__)


def _net_number(environ: Mapping[str, str] = os.environ) -> int:
    """Which of the machine's test networks this process builds its cluster on.

    ``ORCH_TEST_NET`` (default 0) plus the pytest-xdist worker's number (``gw3`` is 3):
    each worker gets a cluster of its own, with its own bridge, namespaces, subnet
    (10.77.N.0/24, inside 10.77.0.0/16) and lock, so workers never wait for each other.
    """
    base = int(environ.get("ORCH_TEST_NET", "0") or 0)
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    number = base + (int(worker[2:]) if worker.startswith("gw") else 0)
    if not 0 <= number <= 250:
        raise ValueError(f"ORCH_TEST_NET plus the worker number must be within 0..250: {number}")
    return number


NET = _net_number()
# Network 0 keeps the names the harness always had; network N > 0 carries N in each.
_TAG = "" if NET == 0 else str(NET)
BRIDGE = f"orchbr{NET}"
SUBNET = f"10.77.{NET}"
BRIDGE_ADDRESS = f"{SUBNET}.1"
NETNS_PREFIX = f"orch{_TAG}-node"
VETH_PREFIX = "orchv" if NET == 0 else f"orchv{NET}x"
PEER_PREFIX = "orchi" if NET == 0 else f"orchi{NET}x"  # a veth's host end, before its rename
TMP_PREFIX = f"orch-testcluster{_TAG}-"
MAX_HOSTS = 64  # addresses .11 to .74 of the subnet
# The kernel's one IPv4 neighbour (ARP) table, shared by every network namespace.
NEIGH_SYSCTLS = Path("/proc/sys/net/ipv4/neigh/default")
NEIGH_LIMITS = ("gc_thresh2", "gc_thresh3")
NEIGH_SAVED = Path(tempfile.gettempdir()) / f"orch-testcluster{_TAG}-arp-limits.json"
# An abstract unix socket: machine-wide (per network namespace, and every test runs in
# the root one), released by the kernel when its holder dies, and leaves no file behind.
LOCK_ADDRESS = f"\0orch-testcluster{_TAG}.lock"


def _acquire_machine_lock(timeout: float) -> socket.socket:
    """Hold the one-cluster-per-machine lock, waiting up to ``timeout`` seconds for it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.bind(LOCK_ADDRESS)
            return sock
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                sock.close()
                raise ClusterError(
                    f"another test cluster holds the machine for over {timeout}s"
                ) from exc
            time.sleep(0.5)


def remove_leftovers() -> None:
    """Remove what a crashed earlier run left: namespaces (and their processes), links, temp dirs.

    Only things with this harness's exact names; callers hold the machine lock, so
    none of them can belong to a live cluster.
    """
    for netns in _json_list(["ip", "-j", "netns", "list"]):
        name = netns["name"]
        if re.fullmatch(rf"{NETNS_PREFIX}\d+", name):
            pids = [
                int(pid) for pid in _run(["ip", "netns", "pids", name], check=False).stdout.split()
            ]
            log.warning("removing stale namespace %s and its processes %s", name, pids)
            _kill_children_first(pids)
            _run(["ip", "netns", "del", name], check=False)
    for link in _json_list(["ip", "-j", "link", "show"]):
        name = link["ifname"]
        if name == BRIDGE or re.fullmatch(rf"{VETH_PREFIX}\d+", name):
            log.warning("removing stale link %s", name)
            _run(["ip", "link", "del", name], check=False)
    _restore_neighbour_limits()
    for stale_dir in Path(tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(stale_dir, ignore_errors=True)


def _restore_neighbour_limits() -> None:
    """Put back the ARP table limits a cluster raised (``NEIGH_SAVED``), if any."""
    try:
        saved = json.loads(NEIGH_SAVED.read_text())
    except (OSError, ValueError):
        return
    for name in NEIGH_LIMITS:
        if name in saved:
            with contextlib.suppress(OSError):
                (NEIGH_SYSCTLS / name).write_text(str(int(saved[name])))
    NEIGH_SAVED.unlink(missing_ok=True)


def _neighbour_limits(n_hosts: int, current: Mapping[str, int]) -> dict[str, int]:
    """The ARP table limits (``NEIGH_LIMITS``) a cluster of ``n_hosts`` needs, never
    below ``current``.

    Every network namespace's entries count against one kernel-wide table. A job whose
    ranks all talk to each other (gloo's full mesh) makes an entry per pair of hosts,
    beside this machine's one per host: (n+1)^2 in all. Past gc_thresh3 (1024 by
    default, so 32 hosts) a new entry is refused ("neighbour table overflow" in dmesg)
    and hosts whose entries expired stop answering this machine: `orch kill` of a
    32-host job found half of the hosts unreachable. Twice and four times the need
    leave the garbage collector room.
    """
    entries = (n_hosts + 1) ** 2
    wanted = {"gc_thresh2": 2 * entries, "gc_thresh3": 4 * entries}
    return {name: max(wanted[name], current[name]) for name in NEIGH_LIMITS}


def _mac_for(address: str) -> str:
    """A locally administered unicast MAC that spells the IPv4 ``address`` in its last bytes."""
    return "02:00:" + ":".join(f"{int(octet):02x}" for octet in address.split("."))
