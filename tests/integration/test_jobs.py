"""Jobs that outlive the controller: detach, status, logs (issue: detach/status/logs)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner, orch_command
from tests.support import job_id_of, release, status_json, wait_for, write_job

pytestmark = pytest.mark.cluster


def assert_every_line_once_in_order(stdout: str, prefixes: dict[int, str], count: int) -> None:
    """Each rank's numbered lines arrived, each once, in the rank's own order."""
    for rank, host in prefixes.items():
        prefix = f"[{host} r{rank}] r{rank} "
        numbers = [
            int(line[len(prefix) :].split()[0])
            for line in stdout.splitlines()
            if line.startswith(prefix)
        ]
        assert numbers == list(range(count)), (
            f"rank {rank}: {len(numbers)} lines, first gaps/dups near "
            + str(next((i for i, n in enumerate(numbers) if n != i), None))
        )


def three_ranks(cluster: Cluster, tmp_path: Path) -> Path:
    return cluster.write_inventory(tmp_path / "inv.yaml", node1={"slots": 1}, node2={"slots": 2})


def test_detach_then_logs_follow_delivers_every_line_in_order(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = three_ranks(cluster, tmp_path)
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=2,
        args=["--plain", "--lines", "3000", "--until", "~/release-detached"],
    )
    started = time.monotonic()
    submitted = orch("submit", "-d", str(job), "-i", str(inventory), timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    assert time.monotonic() - started < 30, "detach returns once the nodes have started"
    job_id = job_id_of(submitted.stdout)
    assert submitted.stdout.strip() == f"job {job_id}", "detached: nothing but the job id"
    assert status_json(orch, job_id)["state"] == "running"
    release(cluster, [1, 2], "release-detached")
    followed = orch("logs", job_id, "-f", timeout=180)
    assert followed.returncode == 0, followed.stderr
    assert_every_line_once_in_order(followed.stdout, {0: "node1", 1: "node2", 2: "node2"}, 3000)
    final = status_json(orch, job_id)
    assert final["state"] == "succeeded" and final["exit_code"] == 0
    assert [n["state"] for n in final["nodes"]] == ["succeeded", "succeeded"]
    # Filters: one rank, and the tail of it.
    only = orch("logs", job_id, "--rank", "2", "--tail", "5", timeout=60)
    assert only.stdout.splitlines() == [f"[node2 r2] r2 {i}" for i in range(2996, 3000)] + [
        "[node2 r2] ready r2"
    ]


def test_sigkilled_submit_leaves_the_job_running_and_logs_lose_nothing(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = three_ranks(cluster, tmp_path)
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=2,
        args=["--plain", "--lines", "3000", "--until", "~/release-sigkilled"],
    )
    attached = subprocess.Popen(
        [*orch_command(), "submit", str(job), "-i", str(inventory)],
        env=orch.controller.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert attached.stdout is not None
    job_id = attached.stdout.readline().split()[1]
    for line in attached.stdout:  # some lines seen by the controller, then it dies
        if line.startswith("[node2 r1] r1 "):
            break
    attached.send_signal(signal.SIGKILL)
    attached.wait(timeout=10)
    assert status_json(orch, job_id)["state"] == "running"
    release(cluster, [1, 2], "release-sigkilled")
    followed = orch("logs", job_id, "-f", timeout=180)
    assert followed.returncode == 0, followed.stderr
    assert_every_line_once_in_order(followed.stdout, {0: "node1", 1: "node2", 2: "node2"}, 3000)
    assert status_json(orch, job_id)["state"] == "succeeded"


def test_partial_lines_and_binary_junk_do_not_garble_other_ranks(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = three_ranks(cluster, tmp_path)
    job = write_job(
        tmp_path, "workload", "workload.py", nodes=2, args=["--plain", "--lines", "1000", "--junk"]
    )
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for rank, host in {0: "node1", 1: "node2", 2: "node2"}.items():
        mine = [line for line in lines if line.startswith(f"[{host} r{rank}] r{rank} ")]
        assert [int(line.split()[3]) for line in mine] == list(range(1000))
        partial = [line for line in mine if " partial" in line]
        assert partial and all(line.endswith("junk end") for line in partial), (
            "pieces of a line stay together"
        )
        long = [line for line in mine if " long " in line]
        assert len(long) == 1 and long[0].endswith("x" * 200_000), "a long line is kept whole"


def test_status_goes_from_running_to_failed_with_exit_codes(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=2,
        # Long enough for `orch status` to see it running on a loaded machine: forked
        # from a warm interpreter, the ranks run the moment the submit returns.
        args=["--plain", "--fail-rank", "1", "--fail-how", "exit", "--fail-after", "10"],
    )
    job_id = job_id_of(orch("submit", "-d", str(job), "-i", str(inventory), timeout=120).stdout)
    assert status_json(orch, job_id)["state"] in ("pending", "running")
    wait_for(lambda: status_json(orch, job_id)["state"] != "running", 60, "the job to end", poll=1)
    data = status_json(orch, job_id)
    assert data["state"] == "failed"
    assert data["nodes"][1]["state"] == "failed" and data["nodes"][1]["exit_code"] != 0
    table = orch("status", timeout=60)
    assert job_id in table.stdout and "failed" in table.stdout


def test_unknown_job_id_suggests_the_nearest(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path, "echo_args", "echo_args.py", nodes=1)
    job_id = job_id_of(orch("submit", str(job), "-i", str(inventory), timeout=120).stdout)
    typo = job_id[:-1] + ("0" if job_id[-1] != "0" else "1")
    result = orch("logs", typo, timeout=30)
    assert result.returncode == 2
    assert (
        f"error: unknown job id '{typo}'" in result.stderr
        and f"did you mean: {job_id}" in result.stderr
    )


def test_logs_of_a_dead_host_show_the_local_copy_and_name_the_host(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path, "workload", "workload.py", nodes=2, args=["--plain", "--lines", "50"])
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    job_id = job_id_of(result.stdout)
    cluster.crash(2)
    logs = orch("logs", job_id, timeout=60)
    assert logs.returncode == 3
    assert "[node2 r1] r1 49" in logs.stdout, "the local copy of the dead host's lines"
    assert "(host node2)" in logs.stderr


def test_corrupt_store_gives_a_way_out(orch: OrchRunner) -> None:
    store = orch.controller.state_dir / "jobs.db"
    store.write_bytes(b"this is not a database" * 100)
    result = orch("status", timeout=30)
    assert result.returncode == 3
    assert f"error: the job store {store} is unreadable" in result.stderr
    assert f"hint: move it away (mv {store} {store}.bad)" in result.stderr
    assert "Traceback" not in result.stderr


def test_concurrent_submits_keep_every_record(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    jobs = []
    for i in range(3):
        path = write_job(tmp_path, "echo_args", "echo_args.py", hosts=[f"node{i + 1}"])
        target = tmp_path / f"job{i}.yaml"
        path.rename(target)
        jobs.append(target)
    procs = [
        subprocess.Popen(
            [*orch_command(), "submit", "-d", str(j), "-i", str(inventory)],
            env=orch.controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for j in jobs
    ]
    ids = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        ids.append(job_id_of(out))
    listed = json.loads(orch("status", "--json", timeout=60).stdout)
    assert sorted(j["id"] for j in listed) == sorted(ids)
    assert all(len(j["nodes"]) == 1 for j in listed)
