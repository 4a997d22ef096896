"""`orch stack` on the test cluster: a hung job (jobs/stack/hang.py: the last rank
sleeps before an all_reduce, the others wait in it) on node1 (2 ranks) and node2 (1),
read with py-spy carried to the hosts, cold and detached; then with faulthandler,
warm and attached; a host cut off while stacks are taken; and the error for a job
that has ended, naming the dumps kept.

No host here has Yama (this kernel has none): the prctl that scope 1 needs, and the
choice each scope leads to, are tests/unit/test_stacks.py's."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import (
    Lines,
    assert_no_job_left,
    job_id_of,
    start_attached,
    two_and_one_inventory,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.cluster

HOSTS = [1, 2]


@pytest.fixture
def two_and_one(cluster: Cluster, tmp_path: Path) -> Path:
    """node1 with 2 slots, node2 with 1. Warm interpreters other tests left stay: these
    jobs start cold (`warm: false`) or from their own environment's (`orch warm`), and
    ending them would cost the worker's next jobs a cold start."""
    return two_and_one_inventory(cluster, tmp_path)


def hang_job(tmp_path: Path, **keys: object) -> Path:
    return write_job(tmp_path, "stack", "hang.py", nodes=2, args=["300"], **keys)


def telling(path: str) -> str:
    """A `notify:` command that appends a line per event of the job to `path`."""
    return f'echo "$ORCH_EVENT $ORCH_STATE $ORCH_EXIT_CODE $ORCH_JOB_ID" >> {path}'


def wait_ready(cluster: Cluster, job_id: str) -> None:
    """Every rank printed `ready`: the sleeper sleeps, the others are in all_reduce."""
    logs = [(1, 0), (1, 1), (2, 2)]

    def ready() -> bool:
        for i, rank in logs:
            log = cluster.home(i) / ".orch" / "jobs" / job_id / f"node{i}" / "logs"
            path = log / f"rank-{rank}.log"
            if not (path.exists() and f"ready {rank}" in path.read_text()):
                return False
        return True

    wait_for(ready, 120, "every rank's first line")
    time.sleep(1.0)  # from print to all_reduce


def test_stack_names_the_sleeping_ranks_line_and_the_others_all_reduce(
    cluster: Cluster, orch: OrchRunner, two_and_one: Path, tmp_path: Path
) -> None:
    submitted = orch("submit", "-d", hang_job(tmp_path, warm=False), "-i", two_and_one, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    try:
        wait_ready(cluster, job_id)
        taken = orch("stack", job_id, timeout=60)
        assert taken.returncode == 0, taken.stderr
        lines = taken.stdout.splitlines()
        assert lines[0] == "2 ranks  node1 r0-r1", taken.stdout
        assert lines[1].split()[0] == "all_reduce", taken.stdout
        assert "torch/distributed/" in lines[1], "files named from their package"
        assert "1 rank   node2 r2" in lines
        assert lines[lines.index("1 rank   node2 r2") + 1].split() == ["load_batch", "hang.py:17"]
        assert "read: 3 ranks with py-spy" in lines
        saved = Path(taken.stderr.split("saved: ")[1].split()[0])
        assert saved.read_text().startswith("2 ranks  node1 r0-r1")
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        for i in HOSTS:  # each host kept its part, and the carried py-spy, owner-only
            node_dir = cluster.home(i) / ".orch" / "jobs" / job_id / f"node{i}"
            assert list((node_dir / "stacks").glob("*.json")), f"node{i} kept its dump"
            (tool,) = (cluster.home(i) / ".orch" / "tools").glob("py-spy-*")
            assert stat.S_IMODE(tool.stat().st_mode) == 0o700

        one = orch("stack", job_id, "--rank", "2", "-v", "--json", timeout=60)
        assert one.returncode == 0, one.stderr
        view = json.loads(one.stdout)
        assert [(r["host"], r["rank"], r["via"]) for r in view["ranks"]] == [("node2", 2, "py-spy")]
        main = next(t for t in view["ranks"][0]["threads"] if t["name"] == "MainThread")
        assert (main["frames"][0]["function"], main["frames"][0]["file"]) == (
            "load_batch",
            "hang.py",
        )

        cluster.partition(2)  # lost while stacks are taken: node1's still come, at once
        try:
            started = time.monotonic()
            cut = orch("stack", job_id, timeout=60)
            elapsed = time.monotonic() - started
        finally:
            cluster.heal(2)
        assert cut.returncode == 0, cut.stderr
        assert cut.stdout.splitlines()[0] == "2 ranks  node1 r0-r1", cut.stdout
        assert any(line.startswith("node2: no stacks:") for line in cut.stdout.splitlines())
        assert elapsed < 10, f"a lost host held orch stack for {elapsed:.1f} s"
    finally:
        killed = orch("kill", job_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert_no_job_left(cluster, HOSTS)
    ended = orch("stack", job_id, timeout=30)
    assert ended.returncode == 2, ended.stderr
    assert f"error: job {job_id} has ended (killed)" in ended.stderr
    assert "hint: the stacks taken while it ran: " in ended.stderr
    assert str(saved.parent) in ended.stderr
    assert "Traceback" not in ended.stderr and ended.stdout == ""


def test_a_warm_attached_job_is_read_through_faulthandler_when_its_env_asks(
    cluster: Cluster, orch: OrchRunner, two_and_one: Path, tmp_path: Path
) -> None:
    job = hang_job(tmp_path, env={"ORCH_STACKS": "faulthandler"})
    ahead = orch("warm", job, "-i", two_and_one, timeout=180)
    assert ahead.returncode == 0, ahead.stderr
    attached = start_attached(orch, job, two_and_one)
    out = Lines(attached.stdout)  # type: ignore[arg-type]
    job_id = ""
    try:
        out.wait_for("job ", 60)
        job_id = job_id_of("".join(out.lines))
        wait_ready(cluster, job_id)
        for i in HOSTS:
            record = cluster.home(i) / ".orch" / "jobs" / job_id / f"node{i}" / "pid.json"
            assert json.loads(record.read_text()).get("warm"), f"node{i} started warm"
        taken = orch("stack", job_id, "-v", timeout=60)
        assert taken.returncode == 0, taken.stderr
        lines = taken.stdout.splitlines()
        assert lines[0] == "2 ranks  node1 r0-r1", taken.stdout
        assert lines[1].split()[0] == "all_reduce", taken.stdout
        assert lines[lines.index("1 rank   node2 r2") + 1].split() == ["load_batch", "hang.py:17"]
        assert "read: 3 ranks with faulthandler" in lines
        assert not any("orch_agent" in line for line in lines), "the warm launcher's frames"
    finally:
        if job_id:
            orch("kill", job_id, timeout=60)
        attached.wait(timeout=60)
    assert attached.returncode == 1
    assert_no_job_left(cluster, HOSTS)


def test_stall_after_ends_a_hung_job_with_its_stacks_and_restarts_apply(
    cluster: Cluster, orch: OrchRunner, two_and_one: Path, tmp_path: Path
) -> None:
    said = tmp_path / "said"
    job = hang_job(tmp_path, warm=False, stall_after=15, restarts=1, notify=telling(str(said)))
    attached = start_attached(orch, job, two_and_one)
    out, err = Lines(attached.stdout), Lines(attached.stderr)  # type: ignore[arg-type]
    try:
        out.wait_for("ready 2", 120)
        quiet_since = time.monotonic()  # the last line of attempt 0 (r2's comes last)
        stalled = err.wait_for("stopping the job; every rank's stack:", 40)
        assert stalled - quiet_since <= 20, f"stalled after {stalled - quiet_since:.1f} s"
        out.wait_for("done 2", 120)  # attempt 2 runs through
        attached.wait(timeout=60)
    finally:
        if attached.poll() is None:
            attached.kill()
    stdout, stderr = out.text(), err.text()
    assert attached.returncode == 0, stderr
    job_id = job_id_of(stdout)
    assert "no rank printed a line for" in stderr and "(stall_after: 15)" in stderr
    assert "orch:   2 ranks  node1 r0-r1" in stderr, stderr
    assert any(line.split()[1:] == ["load_batch", "hang.py:17"] for line in stderr.splitlines())
    kept_line = next(line for line in stderr.splitlines() if "stacks kept: " in line)
    kept = Path(kept_line.split("stacks kept: ")[1])
    assert kept.is_file() and "1 rank   node2 r2" in kept.read_text()
    assert "starting the job again" in stderr and "attempt 2 of 2" in stderr
    (record,) = json.loads(orch("status", job_id, "--json", timeout=30).stdout)
    (first,) = record["spec"]["attempts"]
    assert {n["error"] for n in first["nodes"]} == {"stalled: no output for 15 s"}, first
    assert said.read_text().splitlines() == [  # notify:, from the laptop
        f"stalled running  {job_id}",
        f"restarted restarting  {job_id}",
        f"ended succeeded 0 {job_id}",
    ]
    assert_no_job_left(cluster, HOSTS)


def test_a_detached_jobs_keeper_ends_it_as_stalled_with_its_stacks(
    cluster: Cluster, orch: OrchRunner, two_and_one: Path, tmp_path: Path
) -> None:
    job = hang_job(tmp_path, warm=False, stall_after=15, notify=telling("$HOME/said-$ORCH_JOB_ID"))
    submitted = orch("submit", "-d", job, "-i", two_and_one, timeout=90)
    assert submitted.returncode == 0, submitted.stderr
    assert "stall_after: a keeper on node1 watches the job" in submitted.stderr
    job_id = job_id_of(submitted.stdout)
    try:
        wait_ready(cluster, job_id)
        quiet_since = time.monotonic()
        keeper_dir = cluster.home(1) / ".orch" / "jobs" / job_id / "node1"

        def stopped() -> bool:
            record = keeper_dir / "keeper.json"
            return record.exists() and json.loads(record.read_text())["state"] == "failed"

        wait_for(stopped, 40, "the keeper to end the job")
        assert time.monotonic() - quiet_since <= 22, "stall_after 15, and the stop"
        status = orch("status", job_id, "--json", timeout=60)
        assert status.returncode == 0, status.stderr
        (record,) = json.loads(status.stdout)
        assert record["state"] == "failed", record
        assert {n["error"] for n in record["nodes"]} == {"stalled: no output for 15 s"}
        assert "seen by the job's keeper: stacks kept: " in status.stderr, status.stderr
        kept = Path(status.stderr.split("stacks kept: ")[1].split()[0])
        text = kept.read_text()
        assert "2 ranks  node1 r0-r1" in text and "1 rank   node2 r2" in text, text
        assert "load_batch  hang.py:17" in text
        said = cluster.home(1) / f"said-{job_id}"  # notify:, from the keeper's host
        told = lambda: said.exists() and len(said.read_text().splitlines()) >= 2  # noqa: E731
        wait_for(told, 30, "the keeper's word")
        assert said.read_text().splitlines() == [
            f"stalled running  {job_id}",
            f"failed failed 1 {job_id}",
        ]
    finally:
        orch("kill", job_id, timeout=60)
    assert_no_job_left(cluster, HOSTS)
    ended = orch("stack", job_id, timeout=30)
    assert ended.returncode == 2 and str(kept) in ended.stderr
