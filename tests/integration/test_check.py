"""`orch check` and submit's preflight against real sshd hosts: each problem of the issue
is made for real (a wrong python, a second torch, a held port, a firewall, a second
interface) and must be named, with submit refusing where it would hang."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster import SUBNET, Cluster, ClusterError, OrchRunner, repo_python, skip_or_fail
from tests.support import assert_nothing_started, clear_jobs, job_processes, write_job

pytestmark = pytest.mark.cluster

# torch's version as the probe reads it, from torch/version.py: importing torch.version
# would import torch itself (about 2 CPU-seconds in every worker that collects this).
READ_TORCH_VERSION = """
import importlib.util, os, runpy
torch = importlib.util.find_spec("torch").submodule_search_locations[0]
print(runpy.run_path(os.path.join(torch, "version.py"))["__version__"])
"""
TORCH = subprocess.run(
    [str(repo_python()), "-c", READ_TORCH_VERSION],
    capture_output=True,
    text=True,
    check=True,
).stdout.strip()


def rows(stdout: str) -> dict[str, list[str]]:
    """check's table as {host: cells}, cells split on runs of 2+ spaces."""
    table = {}
    for line in stdout.splitlines():
        match = re.match(r"^(node\d)(?: \(master\))?\s{2,}(.*)$", line)
        if match:
            table[match.group(1)] = re.split(r"\s{2,}", match.group(2).strip())
    return table


def test_healthy_cluster_passes_with_a_row_per_host(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=3)
    result = orch("check", "-i", inventory, job, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    table = rows(result.stdout)
    assert sorted(table) == ["node1", "node2", "node3"]
    for i, name in enumerate(["node1", "node2", "node3"], start=1):
        ssh, _os, python, torch, *_rest, route = table[name]
        assert re.fullmatch(r"ok \d+ ms", ssh)
        assert python == sys.version.split()[0] and torch == TORCH
        assert route == f"eth0 {SUBNET}.1{i}"
    assert "(a free port); reached from node2, node3" in result.stdout
    assert result.stdout.rstrip().endswith("3 hosts: all checks passed")


def test_wrong_python_path_is_named_and_other_hosts_still_checked(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(
        tmp_path / "inv.yaml", node2={"python": "/opt/nowhere/bin/python"}
    )
    result = orch("check", "-i", inventory, timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "error: python not found at /opt/nowhere/bin/python (host node2)" in result.stdout
    table = rows(result.stdout)
    assert table["node2"][2] == "not found"
    assert table["node1"][3] == TORCH and table["node3"][3] == TORCH
    assert "3 hosts: 1 error" in result.stdout


def fake_torch_venv(root: Path, version: str) -> Path:
    """A second venv whose torch reports `version`: only its files are read, never imported.

    Installing a second real torch needs a download; the probe reads versions from
    torch/version.py, so this venv looks to it exactly like one with that torch.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("raise ImportError('a stand-in torch')\n")
    (site / "torch" / "version.py").write_text(f"__version__ = '{version}'\ncuda = None\n")
    return root / "bin" / "python"


def test_differing_torch_versions_are_caught_and_submit_refuses(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    clear_jobs(cluster)
    other = fake_torch_venv(tmp_path / "venv-old", "2.12.0+cpu")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", node3={"python": str(other)})
    expected = (
        f"error: torch 2.12.0+cpu differs from {TORCH.split('+')[0]} on node1, node2 (host node3)"
    )
    result = orch("check", "-i", inventory, timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr
    assert expected in result.stdout
    assert rows(result.stdout)["node3"][3] == "2.12.0+cpu"
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=3)
    submitted = orch("submit", job, "-i", inventory, timeout=60)
    assert submitted.returncode == 3, submitted.stderr
    assert expected in submitted.stderr and "hint: install torch==" in submitted.stderr
    assert submitted.stdout == ""
    assert_nothing_started(cluster, [1, 2, 3])


@pytest.fixture
def held_port(cluster: Cluster) -> Iterator[int]:
    """Port 29555 held on the master node1 by a leftover process."""
    holder = cluster.hold_port(1, 29555)
    yield 29555
    cluster.release_port(holder)


def test_port_held_on_master_is_named_and_submit_refuses(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path, held_port: int
) -> None:
    clear_jobs(cluster)
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=2, rendezvous={"port": held_port})
    result = orch("check", "-i", inventory, job, timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr
    error = next(line for line in result.stdout.splitlines() if line.startswith("error:"))
    assert re.search(
        rf"error: rendezvous port {held_port} on the master {re.escape(SUBNET)}\.11 is busy: held by "
        r"pid \d+ \(.*leftover-trainer\) of user root \(host node1\)",
        error,
    ), error
    submitted = orch("submit", job, "-i", inventory, timeout=60)
    assert submitted.returncode == 3, submitted.stderr
    assert error in submitted.stderr.splitlines()
    assert "hint: stop that process" in submitted.stderr
    assert submitted.stdout == ""
    for i in (1, 2):  # nothing of the job: no job directory, no process but the holder
        jobs = cluster.home(i) / ".orch" / "jobs"
        assert not jobs.exists() or not any(jobs.iterdir())
        left = [cmd for _, cmd in job_processes(cluster, i) if "leftover-trainer" not in cmd]
        assert left == []


def test_unpinned_job_takes_a_free_port_even_when_29500_is_busy(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    holder = cluster.hold_port(1, 29500)
    try:
        job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=2)
        checked = orch("check", "-i", inventory, job, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "(a free port)" in checked.stdout and ":29500 " not in checked.stdout
        submitted = orch("submit", job, "-i", inventory, timeout=120)
        assert submitted.returncode == 0, submitted.stderr
        assert submitted.stdout.count("sum=3") == 2
    finally:
        cluster.release_port(holder)


def block_or_skip(cluster: Cluster, i: int, port: int, source: int) -> None:
    """TCP to `port` on host i dropped from host `source`, where the namespaces have a
    firewall."""
    try:
        cluster.block_port(i, port, source=source)
    except ClusterError as exc:
        skip_or_fail(f"no firewall in the namespaces (make test-deps installs iptables): {exc}")


def test_port_blocked_between_nodes_is_caught(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=3, rendezvous={"port": 29556})
    block_or_skip(cluster, 1, 29556, 3)
    try:
        result = orch("check", "-i", inventory, job, timeout=60)
    finally:
        cluster.unblock_port(1, 29556, source=3)
    assert result.returncode == 3, result.stdout + result.stderr
    assert (
        f"error: cannot connect to the master node1 at {SUBNET}.11:29556: no answer within 3 s"
        in result.stdout
    )
    assert "(host node3)" in result.stdout and "(host node2)" not in result.stdout
    assert "reached from node2, not from node3" in result.stdout


def test_a_host_that_cannot_reach_the_package_index_is_named_for_an_environment(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    """An `environment:` with no `wheels:` installs from the index: a listener on node1
    stands in for it, cut off from node3 only."""
    index = f"http://{SUBNET}.11:8633/simple"
    job = write_job(
        tmp_path,
        "echo_args",
        "echo_args.py",
        nodes=3,
        environment=["orchtiny==9.0"],
        env={"PIP_INDEX_URL": index},
    )
    holder = cluster.hold_port(1, 8633)
    try:
        block_or_skip(cluster, 1, 8633, 3)
        try:
            result = orch("check", "-i", inventory, job, timeout=60)
        finally:
            cluster.unblock_port(1, 8633, source=3)
    finally:
        cluster.release_port(holder)
    said = [line for line in result.stdout.splitlines() if "package index" in line]
    assert said == [
        f"error: cannot reach the package index http://{SUBNET}.11:8633/… (no answer within "
        "3 s): the job's environment cannot be built there (host node3)"
    ], result.stdout + result.stderr
    assert result.returncode == 3
    assert "wheels: DIR" in result.stdout


IFACE_JOB = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"iface={os.environ.get('GLOO_SOCKET_IFNAME')} nccl={os.environ.get('NCCL_SOCKET_IFNAME')} "
      f"sum={int(t.item())}", flush=True)
dist.destroy_process_group()
"""


def test_interface_choice_follows_the_route_to_the_master(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    """node2 gets a second interface, eth1, and its route to the master goes there."""
    _, node2_end = cluster.add_link(1, 2)
    try:
        cluster.route_via_link(2, 1, source=node2_end)
        workdir = tmp_path / "iface"
        workdir.mkdir()
        (workdir / "main.py").write_text(IFACE_JOB)
        job = tmp_path / "iface.yaml"
        job.write_text(
            yaml.safe_dump(
                {"name": "iface", "workdir": str(workdir), "script": "main.py", "nodes": 2}
            )
        )
        checked = orch("check", "-i", inventory, job, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        table = rows(checked.stdout)
        assert table["node1"][-1] == f"eth0 {SUBNET}.11"
        assert table["node2"][-1] == f"eth1 {node2_end}"
        submitted = orch("submit", job, "-i", inventory, timeout=120)
        assert submitted.returncode == 0, submitted.stderr
        lines = sorted(line for line in submitted.stdout.splitlines() if "iface=" in line)
        assert lines == [
            "[node1 r0] iface=eth0 nccl=eth0 sum=2",
            "[node2 r1] iface=eth1 nccl=eth1 sum=2",
        ]
    finally:
        cluster.remove_link(2)


def test_bandwidth_prints_gbits_both_ways_for_each_node(orch: OrchRunner, inventory: Path) -> None:
    result = orch("check", "-i", inventory, "--bandwidth", timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "TCP throughput with the master node1 (1 s each way):" in result.stdout
    measured = re.findall(r"^(node\d)\s+([\d.]+) Gbit/s\s+([\d.]+) Gbit/s\s*$", result.stdout, re.M)
    assert [m[0] for m in measured] == ["node2", "node3"]
    for _, up, down in measured:
        assert 0.01 < float(up) < 1000 and 0.01 < float(down) < 1000
    assert "warning" not in result.stdout, "no GPUs: slow links are no problem"
