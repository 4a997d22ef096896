"""Outputs on real hosts: ORCH_OUTPUT_DIR on every node, copied back exact
when the job ends (also after a failure, and after orch kill), and orch pull while it
runs, moving only what changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import expected_data, job_id_of, outputs_job, wait_for

pytestmark = pytest.mark.cluster


def assert_came_back(where: Path, hosts: list[str]) -> None:
    for host in hosts:
        got = where / host
        assert (got / f"data-{host}.bin").read_bytes() == expected_data(host)
        assert (got / "logs" / f"{host}.txt").read_text() == f"log of {host}\n"
        assert os.readlink(got / "latest") == f"data-{host}.bin"
        assert (got / f"data-{host}.bin").stat().st_mode & 0o777 == 0o600


def test_every_nodes_outputs_come_back_exact_when_the_job_ends(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    result = orch("submit", outputs_job(tmp_path), "-i", inventory, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    job_id = job_id_of(result.stdout)
    where = tmp_path / "orch-outputs" / job_id
    assert f"outputs: 4 files (2.1 MB) in orch-outputs/{job_id}" in result.stderr
    assert_came_back(where, ["node1", "node2"])


def test_outputs_come_back_after_a_failure_too(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = outputs_job(tmp_path, "--fail-on", "node2")
    result = orch("submit", job, "-i", inventory, cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stderr
    assert_came_back(tmp_path / "orch-outputs" / job_id_of(result.stdout), ["node1", "node2"])


def test_pull_while_running_moves_only_the_change_and_kill_brings_the_rest(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = outputs_job(tmp_path, "--wait", paths=["data-*", "more-*", "next"])
    submitted = orch("submit", "-d", job, "-i", inventory, cwd=tmp_path, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    node1_outputs = cluster.home(1) / ".orch" / "jobs" / job_id / "outputs"
    wait_for(lambda: (node1_outputs / "data-node1.bin").exists(), 30, "node1's first output")

    first = orch("pull", job_id, "--rank0", cwd=tmp_path, timeout=60)
    assert first.returncode == 0, first.stderr
    target = tmp_path / "orch-outputs" / job_id
    assert first.stdout.strip() == f"[node1] 1 files (1.0 MB) -> orch-outputs/{job_id}"
    assert (target / "data-node1.bin").read_bytes() == expected_data("node1")

    node2_outputs = cluster.home(2) / ".orch" / "jobs" / job_id / "outputs"
    for outputs in (node1_outputs, node2_outputs):
        (outputs / "next").write_text("")
    wait_for(lambda: (node1_outputs / "more-node1.txt").exists(), 30, "node1's next output")
    wait_for(lambda: (node2_outputs / "more-node2.txt").exists(), 30, "node2's next output")
    second = orch("pull", job_id, "--rank0", cwd=tmp_path, timeout=60)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == (
        f"[node1] 2 files (0.0 MB), 1 unchanged -> orch-outputs/{job_id}"
    ), "only next and more-node1.txt moved"

    killed = orch("kill", job_id, cwd=tmp_path, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert "outputs: 6 files" in killed.stderr, killed.stderr
    assert (target / "node2" / "more-node2.txt").read_text() == "more\n"

    # Kept with the logs until asked: gc --outputs removes ended jobs' outputs only.
    assert node1_outputs.is_dir()
    gc = orch("gc", "--outputs", "-i", inventory, timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert "output directories" in gc.stdout
    assert not node1_outputs.exists() and not node2_outputs.exists()
    assert (cluster.home(1) / ".orch" / "jobs" / job_id / "node1" / "logs").is_dir()
