"""A detached job restarts without the laptop: a keeper on the master host
and a member on each host and spare stop a failed attempt and start the next, with no
orch process on the controller; `orch status` and `orch logs` then show the attempts
as for an attached submit; `orch kill` stops the keeper and its members too."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import (
    Lines,
    assert_no_job_left,
    controller_processes,
    job_id_of,
    job_processes,
    release,
    status_json,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.cluster


def submit_detached(orch: OrchRunner, job: Path, inventory: Path) -> str:
    done = orch("submit", "-d", job, "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    assert "a keeper on node1 restarts the job" in done.stderr, done.stderr
    return job_id_of(done.stdout)


def keeper_record(cluster: Cluster, job_id: str) -> dict[str, Any]:
    """The keeper's record on the master host (node1), read from its disk."""
    return keeper_record_on(cluster, 1, job_id, "node1")


def plain_restart_job(tmp_path: Path) -> Path:
    """Two torch-free nodes of steps.py, one restart, lost after 3 s of silence."""
    return write_job(
        tmp_path,
        "restart",
        "steps.py",
        nodes=2,
        args=["--plain"],
        restarts=1,
        lost_after=3,
        nproc_per_node=1,
    )


def test_a_detached_job_whose_rank_fails_restarts_with_no_controller_running(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "detached_restart",
        "fail_once.py",
        nodes=2,
        restarts=1,
        nproc_per_node=1,
        env={"FAIL_RANK": "1"},
        hosts=["node1", "node2"],
    )
    job_id = submit_detached(orch, job, inventory)
    seen: list[str] = []

    def restarted() -> bool:
        assert controller_processes(orch) == [], "an orch process runs on the controller"
        record = keeper_record(cluster, job_id)
        seen.append(str(record.get("state")))
        return record.get("state") == "succeeded"

    wait_for(restarted, 40, "the keeper to finish attempt 2", poll=0.2)
    assert "restarting" in seen or keeper_record(cluster, job_id)["attempts"], seen
    shown = orch("status", job_id, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "succeeded, attempt 2 of 2 (attempt 1 failed on node2)" in " ".join(shown.stdout.split())
    logs = orch("logs", job_id, timeout=60)
    assert logs.returncode == 0, logs.stderr
    assert "--- attempt 1 (node1 killed, node2 failed) ---" in logs.stderr, logs.stderr
    assert "--- attempt 2 ---" in logs.stderr
    lines = logs.stdout.splitlines()
    assert lines.index("[node2 r1] attempt 0 rank 1") < lines.index("[node1 r0] finished attempt 1")
    assert "[node2 r1] finished attempt 1" in lines
    wait_for(lambda: not any(n for i in (1, 2, 3) for n in _left(cluster, i)), 10, "no process")


def _left(cluster: Cluster, i: int) -> list[tuple[int, str]]:
    return job_processes(cluster, i)  # the warm interpreters left for a resubmit aside


def test_a_detached_job_finishes_on_a_spare_after_its_host_crashed(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = plain_restart_job(tmp_path)
    job_id = submit_detached(orch, job, inventory)
    rank_log = cluster.home(1) / ".orch" / "jobs" / job_id / "node1" / "logs" / "rank-0.log"
    wait_for(lambda: rank_log.exists() and "step 2 attempt 0" in rank_log.read_text(), 60, "step 2")
    cluster.crash(2)
    wait_for(
        lambda: keeper_record(cluster, job_id).get("state") == "succeeded", 60, "attempt 2's end"
    )
    record = status_json(orch, job_id)
    assert record["state"] == "succeeded", record
    assert [n["host"] for n in record["nodes"]] == ["node1", "node3"]
    assert record["spec"]["attempt"] == 1
    assert [n["host"] for n in record["spec"]["attempts"][0]["nodes"]] == ["node1", "node2"]
    logs = orch("logs", job_id, timeout=60).stdout
    resumed = [line for line in logs.splitlines() if "resumed at step" in line]
    assert len(resumed) == 1 and int(resumed[0].split()[-1]) >= 2, logs
    assert "[node1 r0] finished attempt 1" in logs
    assert any(line.startswith("[node1 r0] step 6 attempt 1 world 2") for line in logs.splitlines())
    # "succeeded" is recorded as the ranks exit; the members wind down just after.
    wait_for(lambda: not any(_left(cluster, i) for i in (1, 3)), 10, "no process left")


def test_orch_kill_stops_the_keeper_and_its_members_and_nothing_restarts(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path, "detached_restart", "fail_once.py", nodes=2, restarts=1, nproc_per_node=1
    )
    job_id = submit_detached(orch, job, inventory)
    port = keeper_record(cluster, job_id)["port"]
    listening = cluster.exec_on(1, ["ss", "-Hltn", f"sport = :{port}"]).stdout
    assert str(port) in listening  # the keeper listens
    assert any("keeper member" in c for _, c in _left(cluster, 3))  # the spare's member
    killed = orch("kill", job_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert_no_job_left(cluster, [1, 2, 3])
    assert cluster.exec_on(1, ["ss", "-Hltn", f"sport = :{port}"]).stdout.strip() == ""
    assert keeper_record(cluster, job_id)["state"] == "killed"
    master = cluster.home(1) / ".orch" / "jobs" / job_id / "node1"
    spare = cluster.home(3) / ".orch" / "jobs" / job_id / "node3"
    for path in (master / "keeper.json", master / "keeper.log", spare / "member.log"):
        assert path.stat().st_mode & 0o077 == 0, f"{path} is not owner-only"
    record = status_json(orch, job_id)
    assert record["state"] == "killed" and record["spec"]["attempt"] == 0
    assert not record["spec"].get("attempts")


def test_orch_logs_f_follows_a_failed_attempt_then_the_keepers_next_one_to_its_end(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "detached_restart",
        "fail_once.py",
        nodes=2,
        restarts=1,
        nproc_per_node=1,
        env={"FAIL_RANK": "1", "SLEEP": "60", "RELEASE": "~/release-fail-once"},
        hosts=["node1", "node2"],
    )
    job_id = submit_detached(orch, job, inventory)
    follower = orch.popen("logs", "-f", job_id)
    assert follower.stdout is not None and follower.stderr is not None
    out, err = Lines(follower.stdout), Lines(follower.stderr)
    out.wait_for("attempt 0 rank 1", 60)  # following attempt 0: now rank 1 may fail
    release(cluster, [2], "release-fail-once")
    assert follower.wait(timeout=90) == 0, err.text()  # attempt 2 succeeded
    stdout, stderr = out.text(), err.text()
    lines = stdout.splitlines()
    assert lines.index("[node1 r0] attempt 0 rank 0") < lines.index("[node1 r0] attempt 1 rank 0")
    assert "[node2 r1] finished attempt 1" in lines, stdout
    assert "the job's keeper starts it again if its restarts allow" in stderr
    assert "its keeper started it again as attempt 2 of 2" in stderr, stderr
    assert "--- attempt 2 ---" in stderr
    wait_for(  # its members report the nodes' ends within a second
        lambda: keeper_record(cluster, job_id).get("state") == "succeeded", 10, "the keeper's end"
    )
    assert keeper_record(cluster, job_id)["attempts"][0]["reason"] == "attempt 1 failed on node2"
    assert status_json(orch, job_id)["state"] == "succeeded"


def keeper_record_on(cluster: Cluster, i: int, job_id: str, home: str) -> dict[str, Any]:
    """A keeper's record in the job's directory `home` on host i, if one keeps there."""
    path = cluster.home(i) / ".orch" / "jobs" / job_id / home / "keeper.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data


def test_a_detached_job_restarts_after_its_master_host_crashed_kept_by_another_member(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = plain_restart_job(tmp_path)
    job_id = submit_detached(orch, job, inventory)
    assert "(kept by node1)" in orch("status", job_id, timeout=60).stdout
    rank_log = cluster.home(2) / ".orch" / "jobs" / job_id / "node2" / "logs" / "rank-1.log"
    wait_for(lambda: keeper_record(cluster, job_id).get("state") == "running", 60, "attempt 1")
    wait_for(lambda: rank_log.exists() and rank_log.stat().st_size > 0, 60, "rank 1 running")
    cluster.crash(1)  # the master host, and the keeper on it

    def attempt_2_runs() -> bool:
        assert controller_processes(orch) == [], "an orch process runs on the controller"
        record = keeper_record_on(cluster, 2, job_id, "node2")
        return record.get("epoch") == 1 and record["current"]["attempt"] == 1

    wait_for(attempt_2_runs, 60, "node2's member to keep the job and start attempt 2", poll=0.2)
    shown = orch("status", job_id, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "(kept by node2)" in shown.stdout, shown.stdout
    wait_for(
        lambda: keeper_record_on(cluster, 2, job_id, "node2").get("state") == "succeeded",
        60,
        "attempt 2's end",
    )
    record = status_json(orch, job_id)
    assert record["state"] == "succeeded", record
    assert record["spec"]["ssh"]["keeper"]["at"] == "node2"
    assert sorted(n["host"] for n in record["nodes"]) == ["node2", "node3"]
    assert record["spec"]["attempt"] == 1
    shown = orch("status", job_id, timeout=60)
    assert "succeeded, attempt 2 of 2 (attempt 1 lost on node1)" in " ".join(shown.stdout.split())
    logs = orch("logs", job_id, timeout=60).stdout
    assert any(line.endswith("] finished attempt 1") for line in logs.splitlines()), logs
    assert any("step 6 attempt 1 world 2" in line for line in logs.splitlines()), logs
    wait_for(lambda: not any(_left(cluster, i) for i in (2, 3)), 10, "no process left")


def test_orch_kill_stops_the_keeper_that_took_over_and_nothing_restarts(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "restart",
        "steps.py",
        nodes=2,
        args=["--plain"],
        restarts=2,
        lost_after=3,
        nproc_per_node=1,
    )
    job_id = submit_detached(orch, job, inventory)
    wait_for(lambda: keeper_record(cluster, job_id).get("state") == "running", 60, "attempt 1")
    cluster.crash(1)
    wait_for(
        lambda: (
            keeper_record_on(cluster, 2, job_id, "node2").get("state") in ("running", "restarting")
        ),
        60,
        "node2's member to keep the job",
        poll=0.2,
    )
    killed = orch("kill", job_id, timeout=90)
    assert killed.returncode == 0, killed.stderr
    assert keeper_record_on(cluster, 2, job_id, "node2")["state"] == "killed"
    wait_for(lambda: not any(_left(cluster, i) for i in (2, 3)), 10, "no process left")
    time.sleep(5)  # a keeper or member left behind would start an attempt by now
    assert not any(_left(cluster, i) for i in (2, 3))
    assert status_json(orch, job_id)["state"] == "killed"


def test_a_master_host_cut_off_keeps_nothing_while_another_member_restarts_the_job_once(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "restart",
        "steps.py",
        nodes=2,
        args=["--plain"],
        restarts=2,
        lost_after=3,
        nproc_per_node=1,
    )
    job_id = submit_detached(orch, job, inventory)
    wait_for(lambda: keeper_record(cluster, job_id).get("state") == "running", 60, "attempt 1")
    cluster.partition(1)  # the old keeper runs on, alone behind the cut
    wait_for(
        lambda: keeper_record_on(cluster, 2, job_id, "node2").get("state") == "succeeded",
        90,
        "node2's keeper to take the job to its end",
    )
    wait_for(lambda: keeper_record(cluster, job_id).get("state") == "failed", 30, "node1 to stop")
    # Its node stopped, its keeper and member gone:
    wait_for(lambda: _left(cluster, 1) == [], 10, "nothing left on node1")
    cluster.heal(1)
    record = status_json(orch, job_id)
    assert record["state"] == "succeeded" and record["spec"]["ssh"]["keeper"]["at"] == "node2"
    assert record["spec"]["attempt"] == 1  # restarted once, by one keeper
    assert sorted(n["host"] for n in record["nodes"]) == ["node2", "node3"]
    wait_for(lambda: not any(_left(cluster, i) for i in (1, 2, 3)), 10, "no process left")
