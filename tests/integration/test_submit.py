"""`orch submit` end to end: the real CLI, real sshd hosts, real torchrun jobs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.cluster import REPO_ROOT, SUBNET, Cluster, OrchRunner
from tests.support import assert_no_job_left, write_job

pytestmark = pytest.mark.cluster

RANK_LINE = re.compile(
    r"^\[(?P<host>[\w.-]+) r(?P<prefix_rank>\d+)\] rank=(?P<rank>\d+) world=(?P<world>\d+) "
    r"local_rank=(?P<local_rank>\d+) node_rank=(?P<node_rank>\d+) host=(?P<hostname>\S+) "
    r"sum=(?P<sum>\d+)$"
)


def rank_lines(stdout: str) -> list[re.Match[str]]:
    return [m for line in stdout.splitlines() if (m := RANK_LINE.match(line))]


def test_two_node_job_streams_every_rank_and_succeeds(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=2)
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    assert result.returncode == 0, result.stderr
    assert re.match(r"^job allreduce-[0-9a-f]{6}$", result.stdout.splitlines()[0])
    lines = rank_lines(result.stdout)
    assert sorted(int(m["rank"]) for m in lines) == [0, 1]
    for m in lines:
        assert m["prefix_rank"] == m["rank"]
        assert m["host"] == m["hostname"], "each rank ran on the host its prefix names"
        assert m["world"] == "2" and m["sum"] == "3"
    assert_no_job_left(cluster, [1, 2])


def test_mixed_slots_give_world_four_with_contiguous_ranks(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(
        tmp_path / "inv.yaml", node1={"slots": 1}, node2={"slots": 2}, node3={"slots": 1}
    )
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=3, nproc_per_node="auto")
    result = orch("submit", str(job), "-i", str(inventory), timeout=180)
    assert result.returncode == 0, result.stderr
    placed = {
        int(m["rank"]): (m["host"], m["hostname"], m["node_rank"])
        for m in rank_lines(result.stdout)
    }
    assert placed == {
        0: ("node1", "node1", "0"),
        1: ("node2", "node2", "1"),
        2: ("node2", "node2", "1"),
        3: ("node3", "node3", "2"),
    }
    assert {m["sum"] for m in rank_lines(result.stdout)} == {"10"}, "1+2+3+4 across the whole world"
    assert {m["world"] for m in rank_lines(result.stdout)} == {"4"}


def test_failing_rank_exits_1_and_leaves_nothing_running(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    # A rank without torch: the failure is orch's to report, whatever the rank ran.
    job = write_job(
        tmp_path, "workload", "workload.py", nodes=2, args=["--plain", "--fail-rank", "1"]
    )
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    assert result.returncode == 1, result.stderr
    assert "RuntimeError: boom from rank 1" in result.stdout
    assert "error: job workload-" in result.stderr and "failed" in result.stderr
    assert "Traceback" not in result.stderr.split("error:")[0], (
        "no orch traceback before the error line"
    )
    assert_no_job_left(cluster, [1, 2])


def test_script_exit_code_makes_the_job_fail(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=2,
        args=["--plain", "--fail-rank", "0", "--fail-how", "exit"],
    )
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    assert result.returncode == 1
    assert "node1" in result.stderr.split("error:")[1]
    assert "rank 0, exit code 3" in result.stderr, result.stderr


def test_args_and_env_reach_the_script_verbatim_over_ssh(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    hostile = [
        "a b",
        "it's",
        '"dq"',
        "$(touch /tmp/orch-pwned)",
        "; ls",
        "`id`",
        "line\nbreak",
        "-x",
        "ünï",
    ]
    env = {"ORCH_TEST_A": "$HOME; rm -rf / `id` 'q' \"d\"", "ORCH_TEST_B": "x\ny"}
    job = write_job(tmp_path, "echo_args", "echo_args.py", nodes=2, args=hostile, env=env)
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    assert result.returncode == 0, result.stderr
    args_lines = [
        line.split("ARGS=", 1)[1] for line in result.stdout.splitlines() if "ARGS=" in line
    ]
    env_lines = [line.split("ENV=", 1)[1] for line in result.stdout.splitlines() if "ENV=" in line]
    assert len(args_lines) == 2 and all(json.loads(a) == hostile for a in args_lines)
    assert len(env_lines) == 2 and all(json.loads(e) == env for e in env_lines)
    assert not Path("/tmp/orch-pwned").exists()


def test_dry_run_prints_each_host_command_and_touches_no_host(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=3, rendezvous={"port": 29555})
    result = orch("submit", str(job), "-i", str(inventory), "--dry-run", timeout=60)
    assert result.returncode == 0, result.stderr
    for i, name in enumerate(["node1", "node2", "node3"]):
        assert f"[{name}] node rank {i}" in result.stdout
        assert f"--node-rank {i}" in result.stdout
    assert f"--master-addr {SUBNET}.11 --master-port 29555" in result.stdout
    for i in (1, 2, 3):
        assert (
            not (cluster.home(i) / ".orch" / "jobs").exists()
            or not any(
                p.name.startswith("allreduce-")
                for p in (cluster.home(i) / ".orch" / "jobs").iterdir()
            )
            or _only_older_jobs(cluster, i, result.stdout)
        )


def _only_older_jobs(cluster: Cluster, host: int, stdout: str) -> bool:
    job_id = stdout.split()[1]
    return not (cluster.home(host) / ".orch" / "jobs" / job_id).exists()


def test_code_is_pushed_honouring_gitignore_and_orchignore(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "code"
    (workdir / "data").mkdir(parents=True)
    (workdir / "main.py").write_text(
        "import os\nprint('files', sorted(os.listdir('.')), flush=True)\n"
    )
    (workdir / ".gitignore").write_text("*.ckpt\n")
    (workdir / ".orchignore").write_text("data/\n")
    (workdir / "model.ckpt").write_text("big")
    (workdir / "data" / "x.bin").write_text("big")
    (workdir / "util.py").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump({"name": "push", "workdir": str(workdir), "script": "main.py", "nodes": 2})
    )
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    assert result.returncode == 0, result.stderr
    listed = [line for line in result.stdout.splitlines() if "files [" in line]
    assert len(listed) == 2
    for line in listed:
        assert "'main.py'" in line and "'util.py'" in line and "'.gitignore'" in line
        assert "model.ckpt" not in line and "'data'" not in line


def test_local_inventory_runs_two_nodes_without_ssh(tmp_path: Path, orch: OrchRunner) -> None:
    job = write_job(tmp_path, "allreduce", "allreduce.py", nodes=2)
    # The two entries declare slots: one machine's leases, in the test's own directory
    # rather than this machine's /run/lock (the local nodes inherit the controller's env).
    leases = tmp_path / "leases"
    result = orch(
        "submit",
        str(job),
        "-i",
        str(REPO_ROOT / "inventory" / "local.yaml"),
        timeout=120,
        env={"ORCH_LEASE_DIR": str(leases)},
    )
    assert result.returncode == 0, result.stderr
    placed = sorted((m["host"], int(m["rank"]), m["sum"]) for m in rank_lines(result.stdout))
    assert placed == [("local1", 0, "3"), ("local2", 1, "3")]
    assert leases.is_dir() and not list(leases.glob("[LT]-*"))  # taken, and given back
