"""When anything fails the whole job goes, and `orch kill` leaves nothing behind.

"Nothing left" is always checked in each host's own process table.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.nodes.ops import KILL_GRACE_S
from tests.cluster import Cluster, OrchRunner
from tests.support import (
    Lines,
    assert_no_job_left,
    ending,
    job_id_of,
    job_processes,
    release,
    start_attached,
    status_json,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.cluster
PAUSE_S = 1.0  # a host too busy to run orch's own kill command for a moment


def wait_ready(proc: subprocess.Popen[str], ranks: int) -> tuple[str, list[str]]:
    """The job id, and the lines read until every rank printed 'ready'."""
    assert proc.stdout is not None
    job_id = proc.stdout.readline().split()[1]
    seen, lines = set(), []
    for line in proc.stdout:
        lines.append(line)
        if " ready r" in line:
            seen.add(line.split(" ready r")[1].strip())
        if len(seen) == ranks:
            return job_id, lines
    raise AssertionError("the job ended before every rank was ready: " + "".join(lines[-20:]))


def test_raising_rank_fails_the_job_shows_the_traceback_and_leaves_nothing(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    # With torch: survivors hold a gloo group when a rank fails, as a real job's do (the
    # other tests here use `--plain` ranks: orch's handling is the same without torch).
    job = write_job(
        tmp_path, "workload", "workload.py", nodes=3, args=["--fail-rank", "1", "--hang"]
    )
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    assert result.returncode == 1, result.stderr
    summary = result.stderr.split("error: ")[-1]
    assert "node node2 exited with code 1; first failure: rank 1, exit code 1" in summary
    assert (
        "Traceback (most recent call last)" in summary
        and "RuntimeError: boom from rank 1" in summary
    )
    assert_no_job_left(cluster, [1, 2, 3])
    assert status_json(orch, job_id_of(result.stdout))["state"] == "failed"


def test_sigkilled_rank_fails_the_job_everywhere(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=3,
        args=["--plain", "--fail-rank", "2", "--fail-how", "sigkill", "--hang"],
    )
    result = orch("submit", str(job), "-i", str(inventory), timeout=120)
    assert result.returncode == 1, result.stderr
    assert "first failure: rank 2, signal 9 (SIGKILL)" in result.stderr
    assert_no_job_left(cluster, [1, 2, 3])


def test_crashed_node_is_lost_and_the_rest_is_torn_down(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path, "workload", "workload.py", nodes=3, args=["--plain", "--hang"])
    proc = start_attached(orch, job, inventory)
    job_id, _ = wait_ready(proc, 3)
    assert proc.stderr is not None
    stderr = Lines(proc.stderr)
    crashed = time.monotonic()
    cluster.crash(3)
    # A refused connection while the others answer: no waiting for a timeout.
    assert stderr.wait_for("lost node node3", 20) - crashed < 5
    stderr.wait_for("not reachable; stopping the job there once it is", 20)
    proc.send_signal(signal.SIGINT)  # stop trying to reach it
    assert proc.wait(timeout=30) == 1, stderr.text()
    assert "stop it there with: orch kill" in stderr.text()
    assert_no_job_left(cluster, [1, 2])
    data = status_json(orch, job_id)
    assert data["state"] == "failed" and data["nodes"][2]["state"] == "lost"


def lost_and_given_up(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> tuple[str, Lines]:
    """A 3-node job whose node2 was partitioned and lost, its submit stopped trying to
    reach it (Ctrl-C), node2 healed: the job ended, and behind the partition it ran on.
    Returns its id and the submit's stderr."""
    job = write_job(
        tmp_path, "workload", "workload.py", nodes=3, args=["--plain", "--hang"], lost_after=5
    )
    proc = start_attached(orch, job, inventory)
    job_id, _ = wait_ready(proc, 3)
    assert proc.stderr is not None
    stderr = Lines(proc.stderr)
    cluster.partition(2)
    stderr.wait_for("lost node node2", 40)
    stderr.wait_for("not reachable; stopping the job there once it is", 20)
    proc.send_signal(signal.SIGINT)  # stop trying to reach it
    assert proc.wait(timeout=30) == 1, stderr.text()
    assert_no_job_left(cluster, [1, 3])
    assert job_processes(cluster, 2), "behind the partition the job still runs"
    cluster.heal(2)
    return job_id, stderr


def test_partitioned_node_is_lost_and_orch_status_stops_it_once_healed(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job_id, _ = lost_and_given_up(cluster, orch, inventory, tmp_path)
    status = orch("status", job_id, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "stopped the job on node2: lost earlier, found still running there" in status.stderr, (
        status.stderr
    )
    assert_no_job_left(cluster, [1, 2, 3])
    assert "still running" not in status.stdout, status.stdout
    assert "orch kill" not in status.stderr  # nothing left for the user to stop
    assert status_json(orch, job_id)["nodes"][1]["error"] == "lost; stopped later"
    again = orch("status", job_id, timeout=60)
    assert "stopped the job" not in again.stderr and "still running" not in again.stdout


def test_orch_logs_follow_stops_a_lost_node_it_finds_still_running(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job_id, _ = lost_and_given_up(cluster, orch, inventory, tmp_path)
    follow = orch("logs", job_id, "-f", timeout=60)
    assert follow.returncode == 1, follow.stderr  # the job failed
    assert "[node2 r1] ready r1" in follow.stdout
    assert "stopped the job on node2: lost earlier, found still running there" in follow.stderr, (
        follow.stderr
    )
    assert_no_job_left(cluster, [1, 2, 3])
    assert status_json(orch, job_id)["nodes"][1]["error"] == "lost; stopped later"


def test_three_lost_hosts_at_once_are_all_stopped_within_the_15_s(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Tried one after another, each 3 s connect timeout delays the next host: healed
    12 s into the 15, the first host's try would wait past the end, never tried again."""
    with cluster.extra_hosts(1):
        orch = OrchRunner(cluster.new_controller())  # one that knows node4's host key
        inventory = cluster.write_inventory(tmp_path / "inv.yaml")
        job = write_job(
            tmp_path, "workload", "workload.py", nodes=4, args=["--plain", "--hang"], lost_after=5
        )
        proc = start_attached(orch, job, inventory)
        wait_ready(proc, 4)
        assert proc.stderr is not None
        stderr = Lines(proc.stderr)
        for i in (2, 3, 4):
            cluster.partition(i)
        try:
            trying = stderr.wait_for("not reachable; stopping the job there once it is", 60)
        except AssertionError:
            raise AssertionError(f"orch said: {stderr.text()}") from None
        assert "node2, node3, node4: not reachable" in stderr.lines[-1]
        time.sleep(max(0.0, trying + 12 - time.monotonic()))
        for i in (2, 3, 4):
            cluster.heal(i)
        for i in (2, 3, 4):
            stopped = stderr.wait_for(f"stopped the job on node{i}, reachable again", 15)
            # tried within the 15 s; the stop itself may take a few s on a busy machine
            assert stopped - trying < 22, f"node{i} stopped {stopped - trying:.1f} s in"
        assert proc.wait(timeout=30) == 1, stderr.text()
        assert "the job may still run" not in stderr.text()
        assert_no_job_left(cluster, [1, 2, 3, 4])


def test_a_secondary_failure_that_arrives_first_is_not_named_as_the_cause(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    """node2's rank fails first, behind a partition; node3's rank fails 4 s later (exit
    code 7) and its news comes first. Once node2 is back, its earlier failure is the one named."""
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=3,
        lost_after=60,  # node2's silence must not make it lost
        args=[
            "--plain",
            *("--fail-rank", "1", "--fail-after", "3"),
            *("--later-fail-rank", "2", "--later-fail-after", "7", "--hang"),
        ],
    )
    proc = start_attached(orch, job, inventory)
    wait_ready(proc, 3)
    cluster.partition(2)
    assert proc.stderr is not None
    stderr = Lines(proc.stderr)
    stderr.wait_for("node node3 exited with code 1", 30)  # the news that came first
    cluster.heal(2)
    assert proc.wait(timeout=120) == 1, stderr.text()
    summary = stderr.text().split("error: ")[-1]
    assert "node node2 exited with code 1; first failure: rank 1, exit code 1" in summary
    assert "RuntimeError: boom from rank 1" in summary
    assert "node3" not in summary.splitlines()[0] and "exit code 7" not in summary
    assert_no_job_left(cluster, [1, 2, 3])


def test_lost_node_is_stopped_once_reachable_while_the_submit_waits(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path, "workload", "workload.py", nodes=3, args=["--plain", "--hang"], lost_after=5
    )
    proc = start_attached(orch, job, inventory)
    wait_ready(proc, 3)
    assert proc.stderr is not None
    stderr = Lines(proc.stderr)
    cut = time.monotonic()
    cluster.partition(2)
    assert stderr.wait_for("lost node node2", 30) - cut < 12  # the job's lost_after: 5 s
    stderr.wait_for("not reachable; stopping the job there once it is", 20)
    cluster.heal(2)
    stderr.wait_for("stopped the job on node2, reachable again", 20)
    assert proc.wait(timeout=30) == 1, stderr.text()
    assert_no_job_left(cluster, [1, 2, 3])


def test_kill_finds_escaped_daemons_frees_the_port_and_is_idempotent(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=2,
        args=["--plain", "--daemon", "--hang"],
        rendezvous={"port": 29611},
    )
    job_id = job_id_of(orch("submit", "-d", str(job), "-i", str(inventory), timeout=120).stdout)
    wait_for(
        lambda: any("workload" in cmd for _, cmd in job_processes(cluster, 2)), 60, "the job to run"
    )
    wait_for(
        lambda: len([c for _, c in job_processes(cluster, 1) if "workload.py" in c]) >= 2,
        30,
        "the escaped daemon",
    )
    started = time.monotonic()
    killed = orch("kill", job_id, timeout=60)
    elapsed = time.monotonic() - started
    assert killed.returncode == 0, killed.stderr
    assert "[node1] killed" in killed.stdout and "[node2] killed" in killed.stdout
    assert "rendezvous port free" in killed.stdout
    assert_no_job_left(cluster, [1, 2])
    assert elapsed < 15
    assert status_json(orch, job_id)["state"] == "killed"
    again = orch("kill", job_id, timeout=60)
    assert again.returncode == 0 and "nothing to kill" in again.stdout


@pytest.mark.parametrize("on_term", ["cleanup", "ignore"])
def test_kill_gives_ranks_the_grace_then_forces(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path, on_term: str
) -> None:
    """Ranks that clean up on TERM get to finish; ranks that ignore it are KILLed after the grace."""
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=2,
        args=["--plain", "--on-term", on_term, "--hang"],
    )
    job_id = job_id_of(orch("submit", "-d", str(job), "-i", str(inventory), timeout=120).stdout)
    wait_for(
        lambda: orch("logs", job_id).stdout.count(" ready r") == 2, 60, "every rank to be ready"
    )
    started = time.monotonic()
    killed = orch("kill", job_id, timeout=60)
    elapsed = time.monotonic() - started
    assert killed.returncode == 0, killed.stderr
    assert_no_job_left(cluster, [1, 2])
    logs = orch("logs", job_id).stdout
    if on_term == "cleanup":
        assert "[node1 r0] cleanup r0 done" in logs and "[node2 r1] cleanup r1 done" in logs, logs
    else:
        assert "cleanup" not in logs
        assert elapsed >= 3  # the whole grace was given before KILL
    assert status_json(orch, job_id)["state"] == "killed"


def test_killing_one_job_leaves_the_other_running(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    first = write_job(
        tmp_path, "workload", "workload.py", nodes=2, args=["--plain", "--hang"]
    ).rename(tmp_path / "first.yaml")
    keep = write_job(
        tmp_path, "workload", "workload.py", nodes=2, args=["--plain", "--until", "~/release-keep"]
    ).rename(tmp_path / "keep.yaml")
    submitted = orch("submit", "-d", str(first), "-i", str(inventory), timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    victim = job_id_of(submitted.stdout)
    survivor = job_id_of(orch("submit", "-d", str(keep), "-i", str(inventory), timeout=120).stdout)
    killed = orch("kill", victim, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert status_json(orch, survivor)["state"] == "running"
    release(cluster, [1, 2], "release-keep")
    followed = orch("logs", survivor, "-f", timeout=120)
    assert followed.returncode == 0, followed.stderr
    assert status_json(orch, survivor)["state"] == "succeeded"
    assert_no_job_left(cluster, [1, 2])


def test_ctrl_c_stops_the_job_everywhere_and_exits_130(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = write_job(tmp_path, "workload", "workload.py", nodes=3, args=["--plain", "--hang"])
    proc = start_attached(orch, job, inventory)
    job_id, _ = wait_ready(proc, 3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert_no_job_left(cluster, [1, 2, 3])
    assert status_json(orch, job_id)["state"] == "killed"


def interrupted_once(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> tuple[subprocess.Popen[str], str, Lines, Lines]:
    """An attached two-node job whose ranks ignore TERM, pressed Ctrl-C once: its
    process, job id, stderr and stdout, once it says to press again."""
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=2,
        args=["--plain", "--on-term", "ignore", "--hang"],
    )
    proc = start_attached(orch, job, inventory)
    job_id, _ = wait_ready(proc, 2)
    assert proc.stderr is not None and proc.stdout is not None
    err, out = Lines(proc.stderr), Lines(proc.stdout)
    proc.send_signal(signal.SIGINT)
    err.wait_for("Ctrl-C again", 30)
    return proc, job_id, err, out


def test_a_second_ctrl_c_kills_at_once_without_the_grace_and_leaves_nothing(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    """Ranks that ignore TERM would get the whole grace before KILL; a second Ctrl-C
    during the teardown skips it, and the submit still stops everything and records
    the job killed."""
    proc, job_id, err, out = interrupted_once(orch, inventory, tmp_path)
    again = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    elapsed = time.monotonic() - again
    text = err.text() + out.text()
    assert proc.returncode == 130, text
    assert "Traceback" not in text
    assert "killing the job's processes now" in text, text
    assert elapsed < KILL_GRACE_S, f"{elapsed:.1f} s: the grace was not skipped"
    assert_no_job_left(cluster, [1, 2])
    assert status_json(orch, job_id)["state"] == "killed"


def test_a_second_ctrl_c_exits_only_once_the_first_ctrl_cs_kill_has_ended_on_every_host(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    """The first Ctrl-C's stop runs on each host as an agent `kill` that waits out the
    grace. The second Ctrl-C kills the ranks at once, which leaves that kill nothing to
    wait for; the submit exits only once it has ended, even on a host too busy to run
    it for a moment (here it is stopped for PAUSE_S)."""
    proc, job_id, err, out = interrupted_once(orch, inventory, tmp_path)

    def graceful_kills(host: int) -> list[int]:
        return [
            pid
            for pid, cmd in cluster.host_pids(host)
            if " kill " in cmd and f" {KILL_GRACE_S} {job_id}" in cmd and not ending(cmd)
        ]

    def signal_kills(kills: list[tuple[int, int]], name: str) -> None:
        for host, pid in kills:
            cluster.exec_on(host, ["sh", "-c", f"kill -{name} {pid}"])

    wait_for(
        lambda: all(graceful_kills(i) for i in (1, 2)),
        KILL_GRACE_S,
        "the first Ctrl-C's kill to run on every host",
        poll=0.05,
    )
    paused = [(i, pid) for i in (1, 2) for pid in graceful_kills(i)]
    signal_kills(paused, "STOP")
    resume = threading.Timer(PAUSE_S, signal_kills, args=(paused, "CONT"))
    again = time.monotonic()
    proc.send_signal(signal.SIGINT)
    resume.start()
    try:
        proc.wait(timeout=60)
        elapsed = time.monotonic() - again
        # Looked at once, without the moment assert_no_job_left gives what is ending.
        left = [graceful_kills(i) for i in (1, 2)]
    finally:
        resume.join()  # whatever happened, nothing is left stopped
    text = err.text() + out.text()
    assert proc.returncode == 130, text
    assert left == [[], []], text
    assert PAUSE_S <= elapsed < KILL_GRACE_S, f"{elapsed:.1f} s"
    assert_no_job_left(cluster, [1, 2])
    assert status_json(orch, job_id)["state"] == "killed"


def test_controller_killed_during_launch_leaves_nothing_orch_kill_cannot_find(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "big"
    workdir.mkdir()
    (workdir / "workload.py").write_bytes(
        (Path(__file__).parent / "jobs/workload/workload.py").read_bytes()
    )
    (workdir / "weights.bin").write_bytes(
        bytes(range(256)) * 4096 * 24
    )  # a push that takes a moment
    job = tmp_path / "big.yaml"
    job.write_text(
        f"name: big\nworkdir: {workdir}\nscript: workload.py\nargs: [--plain, --hang]\nnodes: 3\n"
    )
    proc = start_attached(orch, job, inventory)
    store = orch.controller.state_dir / "jobs.db"

    def recorded() -> bool:
        if not store.exists():
            return False
        with sqlite3.connect(store) as db:
            try:
                return db.execute("SELECT count(*) FROM jobs").fetchone()[0] > 0
            except sqlite3.Error:
                return False

    wait_for(recorded, 60, "the job record")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    with sqlite3.connect(store) as db:
        job_id = db.execute("SELECT id FROM jobs").fetchone()[0]
    time.sleep(1)  # whatever the dead controller had set going has landed
    killed = orch("kill", job_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert_no_job_left(cluster, [1, 2, 3])
