"""Scripts written for launching by hand, run unmodified: a self-spawning
script with its own -n/-g/-i arguments, the ImageNet example's --dist-url form, and a
torch.distributed.launch-era script that needs --local_rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import (
    assert_no_job_left,
    job_id_of,
    job_processes,
    spawn_job,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.cluster


@pytest.fixture
def two_and_one(cluster: Cluster, tmp_path: Path) -> Path:
    """node1 with 2 slots, node2 with 1."""
    return cluster.write_inventory(tmp_path / "two_and_one.yaml", [1, 2], node1={"slots": 2})


def results(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if "sum=" in line)


def test_a_self_spawning_script_gets_its_node_arguments_and_master(
    orch: OrchRunner, two_and_one: Path, tmp_path: Path
) -> None:
    result = orch("submit", spawn_job(tmp_path), "-i", two_and_one, timeout=120)
    assert result.returncode == 0, result.stderr
    assert results(result.stdout) == [
        "[node1] rank=0 world=3 node=0 host=node1 sum=6",
        "[node1] rank=1 world=3 node=0 host=node1 sum=6",
        "[node2] rank=2 world=3 node=1 host=node2 sum=6",
    ]


def test_the_dist_url_form_of_the_imagenet_example(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    args = ["--dist-url", "tcp://{master_addr}:{master_port}", "--world-size", "{num_nodes}"]
    args += ["--rank", "{node_rank}", "--multiprocessing-distributed"]
    job = write_job(tmp_path, "launchers", "dist_url.py", launcher="python", nodes=2, args=args)
    result = orch("submit", job, "-i", inventory, timeout=120)
    assert result.returncode == 0, result.stderr
    assert results(result.stdout) == [
        "[node1] rank=0 world=2 host=node1 sum=3",
        "[node2] rank=1 world=2 host=node2 sum=3",
    ]


def test_a_legacy_script_gets_local_rank_as_an_argument(
    orch: OrchRunner, cluster: Cluster, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", [1, 2], node1={"slots": 2})
    under_torchrun = write_job(tmp_path, "launchers", "legacy.py", nodes=2, args=["--tag", "x"])
    failed = orch("submit", under_torchrun, "-i", inventory, timeout=120)
    assert failed.returncode == 1, "the script refuses to run without --local_rank"
    assert "the following arguments are required: --local_rank" in failed.stdout

    job = write_job(
        tmp_path,
        "launchers",
        "legacy.py",
        launcher="torch.distributed.launch",
        nodes=2,
        args=["--tag", "{node_rank}"],
    )
    result = orch("submit", job, "-i", inventory, timeout=120)
    assert result.returncode == 0, result.stderr
    assert results(result.stdout) == [
        "[node1 r0] rank=0 local_rank=0 host=node1 sum=6 tag=0",
        "[node1 r1] rank=1 local_rank=1 host=node1 sum=6 tag=0",
        "[node2 r2] rank=2 local_rank=0 host=node2 sum=6 tag=1",
    ]


def test_a_failing_spawned_child_stops_the_job_on_every_host(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    job = spawn_job(tmp_path, "--fail-rank", "2", "--sleep", "120", "--plain")
    result = orch("submit", job, "-i", two_and_one, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "RuntimeError: boom from rank 2" in result.stdout
    assert "failed: node node2 exited with code 1" in result.stderr, result.stderr
    assert_no_job_left(cluster, [1, 2])


def test_kill_of_a_detached_self_spawning_job_leaves_nothing(
    orch: OrchRunner, cluster: Cluster, two_and_one: Path, tmp_path: Path
) -> None:
    job = spawn_job(tmp_path, "--sleep", "120", "--plain")
    submitted = orch("submit", "-d", job, "-i", two_and_one, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    # The script's processes and every spawned child run (1 + 2 on node1).
    wait_for(
        lambda: (
            sum(
                "spawn.py" in cmd or "multiprocessing" in cmd
                for _, cmd in job_processes(cluster, 1)
            )
            >= 3
        ),
        30,
        "the spawned children on node1",
    )
    killed = orch("kill", job_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert_no_job_left(cluster, [1, 2])
