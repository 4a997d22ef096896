"""Relay push on real hosts: the controller sends the code to the master's
host only, the others fetch it from there; a host that cannot reach the master gets
it directly, with a notice."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.models.inventory import load_inventory
from orchestrator.nodes.group import HostGroup
from orchestrator.sync.manifest import HostMemory, scan_workdir
from orchestrator.sync.push import push
from orchestrator.sync.relay import Relay
from orchestrator.transport import ConnectOptions
from tests.cluster import SUBNET, Cluster, OrchRunner
from tests.support import JOBS, job_processes, write_workdir_job

pytestmark = pytest.mark.cluster


@pytest.fixture
def big_tree(tmp_path: Path) -> Path:
    """The digest script beside 6 MB of random bytes: enough to be worth relaying."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOBS / "relay" / "digest.py", work / "digest.py")
    (work / "data.bin").write_bytes(os.urandom(6 << 20))
    (work / "more").mkdir()
    (work / "more" / "notes.txt").write_text("relay me\n")
    return work


def local_digest(work: Path) -> str:
    result = subprocess.run(
        [sys.executable, "digest.py"], cwd=work, capture_output=True, text=True, check=True
    )
    return result.stdout.split()[1]


def push_log(stderr: str, verb: str) -> dict[str, int]:
    """Files per host from the `-v` line `pushed ...` or `relayed ...`."""
    line = next((x for x in stderr.splitlines() if f"orchestrator.ssh.submit: {verb} " in x), "")
    return {h: int(n) for n, h in re.findall(r"(\d+) files \(\d+ kB\) to (\S+?)(?:,|$)", line)}


def submit_digest(
    orch: OrchRunner, tmp_path: Path, work: Path, inventory: Path
) -> subprocess.CompletedProcess[str]:
    job = write_workdir_job(tmp_path, work, "digest.py", name="relay", launcher="python")
    return orch("-v", "submit", job, "-i", inventory, timeout=180)


def test_the_code_crosses_the_controllers_link_once(
    orch: OrchRunner, inventory: Path, tmp_path: Path, big_tree: Path
) -> None:
    result = submit_digest(orch, tmp_path, big_tree, inventory)
    assert result.returncode == 0, result.stderr
    pushed = push_log(result.stderr, "pushed")
    fresh = pushed["node1"]  # what node1 lacked: data.bin at least, it is new
    assert fresh >= 1 and pushed == {"node1": fresh, "node2": 0, "node3": 0}
    assert push_log(result.stderr, "relayed") == {"node2": fresh, "node3": fresh}
    expected = f"tree {local_digest(big_tree)}"
    assert sorted(line for line in result.stdout.splitlines() if "tree" in line) == [
        f"[{name}] {expected}" for name in ("node1", "node2", "node3")
    ]


@pytest.fixture
def node3_cut_from_node1(cluster: Cluster) -> Iterator[None]:
    """node3 cannot open connections to node1 (as behind a firewall); the controller
    still reaches both."""
    route = ["ip", "route", "add", "prohibit", f"{cluster.host(1).address}/32"]
    assert cluster.exec_on(3, route).returncode == 0
    try:
        yield
    finally:
        cluster.exec_on(3, ["ip", "route", "del", "prohibit", f"{cluster.host(1).address}/32"])


def test_a_host_that_cannot_reach_the_seed_gets_the_code_directly(
    cluster: Cluster, inventory: Path, tmp_path: Path, big_tree: Path, node3_cut_from_node1: None
) -> None:
    """The push alone: a job's preflight would refuse node3 (it cannot reach the
    master), but a firewall that lets only the rendezvous port through leaves a push
    in just this state."""
    notices: list[str] = []
    controller = cluster.new_controller()
    hosts = load_inventory(inventory).hosts
    tree = scan_workdir(big_tree)
    dirs = {h.name: f"{h.workdir}/jobs/relay-cut/{h.name}" for h in hosts}
    options = ConnectOptions(known_hosts=controller.known_hosts, notice=notices.append)
    with HostGroup(hosts, options) as group:
        group.connect()
        results = push(
            group,
            tree,
            dirs,
            memory=HostMemory(tmp_path / "memory"),
            relay=Relay("node1", f"{SUBNET}.11"),
        )
    assert [n for n in notices if "relay" in n] == [
        next(n for n in notices if n.startswith(f"node3: cannot reach the relay at {SUBNET}.11:"))
    ]
    assert notices[0].endswith("; pushing to it directly")
    sent = {name: (r.files_sent, r.relayed) for name, r in results.items()}
    fresh = sent["node1"][0]  # what the stores lacked: data.bin at least, it is new
    assert fresh >= 1 and sent == {"node1": (fresh, 0), "node2": (0, fresh), "node3": (fresh, 0)}
    for i in (1, 2, 3):
        code = cluster.home(i) / ".orch" / "jobs" / "relay-cut" / f"node{i}" / "code"
        assert local_digest(code) == local_digest(big_tree), f"node{i}'s snapshot"


def test_check_says_which_hosts_fetch_from_the_relay_and_leaves_nothing(
    cluster: Cluster, orch: OrchRunner, inventory: Path
) -> None:
    result = orch("check", "-i", inventory, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "code relay: node2, node3 fetch the code from node1" in result.stdout
    assert job_processes(cluster, 1) == [], "the check's relay is gone"


def test_check_warns_of_a_host_that_cannot_reach_the_relay(
    cluster: Cluster, orch: OrchRunner, inventory: Path, node3_cut_from_node1: None
) -> None:
    result = orch("check", "-i", inventory, timeout=120)
    out = " ".join(result.stdout.split())  # rich wraps long lines
    assert "code relay: node2 fetch the code from node1" in out, result.stdout
    assert "cannot fetch the code from node1's relay" in out and "node3" in out
    assert "orch pushes it to node3 directly" in out
    assert job_processes(cluster, 1) == [], "the check's relay is gone"
