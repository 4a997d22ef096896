"""Restarts: a job whose node is lost starts again on a spare host, as the
next attempt with ORCH_ATTEMPT set, and resumes from what it kept in its output
directory; `orch kill` never leads to a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import Lines, assert_no_job_left, job_id_of, status_json, write_job

pytestmark = pytest.mark.cluster


def restart_job(tmp_path: Path, *args: str) -> Path:
    return write_job(
        tmp_path,
        "restart",
        "steps.py",
        nodes=2,
        restarts=1,
        lost_after=3,
        nproc_per_node=1,
        args=list(args),
    )


def test_a_lost_node_is_replaced_by_a_spare_and_the_job_resumes(
    orch: OrchRunner,
    cluster: Cluster,
    inventory: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    submit = orch.popen("submit", restart_job(tmp_path), "-i", inventory)
    assert submit.stdout is not None and submit.stderr is not None
    out, err = Lines(submit.stdout), Lines(submit.stderr)
    out.wait_for("step 2 attempt 0", 60)
    cluster.crash(2)
    err.wait_for("starting the job again", 60)
    submit.wait(timeout=120)
    stdout, stderr = out.text(), err.text()
    assert submit.returncode == 0, stderr
    assert (
        "attempt 1 lost on node2: starting the job again now as attempt 2 of 2, on node1, node3"
        in stderr
    )
    resumed = [line for line in stdout.splitlines() if "resumed at step" in line]
    assert len(resumed) == 1 and int(resumed[0].split()[-1]) >= 2, stdout
    assert "[node1 r0] finished attempt 1" in stdout
    record = status_json(orch, job_id_of(stdout))
    assert record["state"] == "succeeded"
    assert [n["host"] for n in record["nodes"]] == ["node1", "node3"]
    assert record["spec"]["attempt"] == 1
    assert [n["host"] for n in record["spec"]["attempts"][0]["nodes"]] == ["node1", "node2"]
    shown = orch("status", job_id_of(stdout), timeout=60).stdout
    assert "attempt 2 of 2 (attempt 1 lost on node2)" in " ".join(shown.split())
    logs = orch("logs", job_id_of(stdout), timeout=60)
    assert "--- attempt 1 (" in logs.stderr and "node2 lost" in logs.stderr, logs.stderr
    assert "--- attempt 2 ---" in logs.stderr
    lines = logs.stdout.splitlines()
    assert lines.index("[node1 r0] step 1 attempt 0 world 2") < lines.index(
        "[node1 r0] finished attempt 1"
    )
    assert_no_job_left(cluster, [1, 3])
    assert_the_time_line_shows_the_spare(orch, job_id_of(stdout), monkeypatch)


def assert_the_time_line_shows_the_spare(
    orch: OrchRunner, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempts on a time line (`orch ui`'s, api.attempts) from the job's records:
    node2 lost, then node3 in its place, after it."""
    from orchestrator.api import attempts

    monkeypatch.setenv("ORCH_HOME", str(orch.controller.state_dir))
    line = attempts.timeline(job_id)
    spans = [(s.attempt, s.host, s.node_rank, s.state.value, s.took_place_of) for s in line.spans]
    assert spans == [
        (0, "node1", 0, "killed", None),
        (0, "node2", 1, "lost", None),
        (1, "node1", 0, "succeeded", None),
        (1, "node3", 1, "succeeded", "node2"),
    ], spans
    first, lost, again, spare = line.spans
    assert first.start == lost.start == line.started
    assert lost.start is not None and lost.end is not None and lost.start < lost.end
    assert again.start == spare.start and spare.start is not None and spare.start >= lost.end
    assert spare.end is not None and spare.end <= (line.ended or 0)


def test_orch_kill_is_never_followed_by_a_restart(
    orch: OrchRunner, cluster: Cluster, inventory: Path, tmp_path: Path
) -> None:
    submit = orch.popen("submit", restart_job(tmp_path, "--plain"), "-i", inventory)
    assert submit.stdout is not None and submit.stderr is not None
    out, err = Lines(submit.stdout), Lines(submit.stderr)
    out.wait_for("step 1 attempt 0", 60)
    job_id = job_id_of(out.text(timeout=0.1))
    killed = orch("kill", job_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    submit.wait(timeout=60)
    assert submit.returncode == 1
    assert "starting the job again" not in err.text()
    assert status_json(orch, job_id)["state"] == "killed"
    assert_no_job_left(cluster, [1, 2, 3])
