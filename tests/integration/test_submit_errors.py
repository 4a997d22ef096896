"""Bad hosts: a clear error naming the host, exit 3, and nothing started anywhere."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster import SUBNET, Cluster, OrchRunner
from tests.support import assert_nothing_started, clear_jobs, write_job

pytestmark = pytest.mark.cluster


def test_refused_connection_names_the_host_and_starts_nothing(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    clear_jobs(cluster)
    cluster.crash(2)
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=3)
    result = orch("submit", str(job), "-i", str(inventory), timeout=60)
    assert result.returncode == 3, result.stderr
    assert f"error: connection refused by root@{SUBNET}.12 (host node2)" in result.stderr
    assert "hint:" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == "", "no job id: no job was started"
    assert_nothing_started(cluster, [1, 3])


def test_silent_host_times_out_within_10_seconds(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    clear_jobs(cluster)
    cluster.partition(3)
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=3)
    started = time.monotonic()
    result = orch("submit", str(job), "-i", str(inventory), timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    assert f"no answer from root@{SUBNET}.13 within 10 s (host node3)" in result.stderr
    # 10 s of silence, plus what a loaded machine adds: far from the 30 s of a default
    assert elapsed < 25, f"took {elapsed:.1f} s"
    assert_nothing_started(cluster, [1, 2])


def test_refused_key_gives_ssh_copy_id_hint(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    inventory = cluster.write_inventory(
        tmp_path / "inv.yaml", node2={"identity_file": str(stranger)}
    )
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=2)
    result = orch("submit", str(job), "-i", str(inventory), timeout=60)
    assert result.returncode == 3, result.stderr
    assert f"authentication refused for root@{SUBNET}.12 (host node2)" in result.stderr
    assert (
        f"hint: install your public key on the host: ssh-copy-id -i {stranger} root@{SUBNET}.12"
        in result.stderr
    )


def test_missing_python_names_host_and_path(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    clear_jobs(cluster)
    inventory = cluster.write_inventory(
        tmp_path / "inv.yaml", node2={"python": "/opt/nowhere/bin/python"}
    )
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=2)
    result = orch("submit", str(job), "-i", str(inventory), timeout=60)
    assert result.returncode == 3, result.stderr
    assert "error: python not found at /opt/nowhere/bin/python (host node2)" in result.stderr
    assert_nothing_started(cluster, [1, 2])


def test_python_without_torch_names_host_and_path(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    bare = str(Path(sys.base_prefix) / "bin" / "python3")  # the interpreter the venv was made from
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", node1={"python": bare})
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=2)
    result = orch("submit", str(job), "-i", str(inventory), timeout=60)
    assert result.returncode == 3, result.stderr
    assert f"error: torch is not installed for {bare} (host node1)" in result.stderr


def test_unknown_host_key_is_recorded_with_a_notice(
    cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    controller = cluster.new_controller(trust_hosts=False)
    run = OrchRunner(controller)
    job = write_job(tmp_path, "echo_args", "echo_args.py", nodes=2)
    first = run("submit", str(job), "-i", str(inventory), timeout=120)
    assert first.returncode == 0, first.stderr
    assert (
        f"added host key for {SUBNET}.11" in first.stderr
        and f"added host key for {SUBNET}.12" in first.stderr
    )
    recorded = controller.known_hosts.read_text()
    assert cluster.host(1).known_hosts_line().split()[2] in recorded
    second = run("submit", str(job), "-i", str(inventory), timeout=120)
    assert second.returncode == 0 and "added host key" not in second.stderr


def test_changed_host_key_is_refused_and_never_replaced(
    cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    clear_jobs(cluster)
    controller = cluster.new_controller(trust_hosts=True)
    impostor = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(impostor)], check=True)
    key_type, key = impostor.with_suffix(".pub").read_text().split()[:2]
    lines = [
        line
        for line in controller.known_hosts.read_text().splitlines()
        if not line.startswith(f"{SUBNET}.12 ")
    ]
    controller.known_hosts.write_text("\n".join([*lines, f"{SUBNET}.12 {key_type} {key}"]) + "\n")
    before = controller.known_hosts.read_text()
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=2)
    result = OrchRunner(controller)("submit", str(job), "-i", str(inventory), timeout=60)
    assert result.returncode == 3, result.stderr
    assert (
        f"host key of {SUBNET}.12 has CHANGED" in result.stderr and "(host node2)" in result.stderr
    )
    assert f"ssh-keygen -R {SUBNET}.12" in result.stderr
    assert controller.known_hosts.read_text() == before
    assert_nothing_started(cluster, [1, 2])
