"""Restarts and failures on a real Slurm cluster (tests/cluster/slurm.py): node1 the
login node, node2..node4 compute nodes, one shared home. A compute node "fails" as
far as Slurm and the job can tell: its slurmd and every job process on it killed
(SlurmCluster.fail_node); it is brought back after each test.

The job is the SSH restart tests' own (tests/integration/jobs/restart/steps.py): six
steps, rank 0 keeping the step reached in ORCH_OUTPUT_DIR, a later attempt
(ORCH_ATTEMPT > 0) resuming from there."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Host, OrchRunner, SlurmCluster
from tests.support import (
    Lines,
    assert_slurm_clean,
    job_id_of,
    slurm_job_root,
    status_json,
    write_job,
    write_workdir_job,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slurm, pytest.mark.xdist_group("slurm-restarts")]


@pytest.fixture
def revive(slurm: SlurmCluster) -> Iterator[list[Host]]:
    """The nodes a test failed, brought back (slurmd, idle) after it."""
    failed: list[Host] = []
    yield failed
    for host in failed:
        slurm.revive_node(host)


def restart_job(
    tmp_path: Path, restarts: int | None = 1, torch: bool = False, **keys: object
) -> Path:
    """steps.py on two nodes; torch-free (`--plain`) unless the test is about the
    collective: how orch restarts, kills and reports is the same without it."""
    if restarts is not None:
        keys["restarts"] = restarts
    if not torch:
        keys["args"] = ["--plain"]
    return write_job(tmp_path, "restart", "steps.py", nodes=2, **keys)


SLEEPER = """\
import time
print("started", flush=True)
time.sleep(300)
"""


def running_nodes(slurm: SlurmCluster, name: str) -> list[Host]:
    """The compute hosts of the running Slurm job named `name`, in node-rank order."""
    found: list[str] = []

    def running() -> bool:
        jobs = [j for j in slurm.squeue() if j["name"] == name and j["state"] == "RUNNING"]
        found[:] = [jobs[0]["nodes"]] if jobs else []
        return bool(found)

    slurm.wait_for(running, f"{name} running", 60)
    listed = slurm.run_on_login(f"scontrol show hostnames {found[0]}").stdout.split()
    return [h for name in listed for h in slurm.compute if h.name == name]


def test_a_failed_node_restarts_the_job_as_attempt_2_without_that_node(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path, revive: list[Host]
) -> None:
    submit = orch.popen("submit", restart_job(tmp_path, torch=True), "-i", hpc)
    assert submit.stdout is not None and submit.stderr is not None
    out, err = Lines(submit.stdout), Lines(submit.stderr)
    out.wait_for("step 2 attempt 0", 90)
    first, victim = running_nodes(slurm, "restart")
    slurm.fail_node(victim)
    revive.append(victim)
    assert submit.wait(timeout=180) == 0, err.text()
    stdout, stderr = out.text(), err.text()
    assert re.search(
        rf"attempt 1 (failed|lost) on {victim.name} \(slurm \w+\): starting the job again as "
        rf"attempt 2 of 2, Slurm job \d+, leaving out {victim.name}",
        stderr,
    ), stderr
    resumed = [line for line in stdout.splitlines() if "resumed at step" in line]
    assert len(resumed) == 1 and int(resumed[0].split()[-1]) >= 2, stdout
    assert "finished attempt 1" in stdout and "finished attempt 0" not in stdout
    job_id = job_id_of(stdout)
    record = status_json(orch, job_id)
    assert record["state"] == "succeeded" and record["spec"]["attempt"] == 1
    earlier = record["spec"]["attempts"][0]["nodes"]
    assert [n["host"] for n in earlier] == [first.name, victim.name]
    now = [n["host"] for n in record["nodes"]]
    assert victim.name not in now and len(now) == 2
    shown = " ".join(orch("status", job_id, timeout=60).stdout.split())
    assert re.search(rf"attempt 2 of 2 \(attempt 1 (failed|lost) on {victim.name}\)", shown), shown
    logs = orch("logs", job_id, timeout=60)
    assert "--- attempt 1 (" in logs.stderr and "--- attempt 2 ---" in logs.stderr, logs.stderr
    lines = logs.stdout.splitlines()
    step1 = next(i for i, line in enumerate(lines) if line.endswith("step 1 attempt 0 world 2"))
    assert step1 < next(i for i, line in enumerate(lines) if line.endswith("finished attempt 1"))
    assert_slurm_clean(slurm)


def test_a_detached_job_restarts_on_the_cluster_with_no_controller_running(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path, revive: list[Host]
) -> None:
    submitted = orch("submit", restart_job(tmp_path), "-i", hpc, "--detach", timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    root = slurm_job_root(slurm, job_id)
    first, victim = running_nodes(slurm, "restart")
    log = root / first.name / "logs" / "rank-0.log"
    slurm.wait_for(lambda: log.exists() and "step 2 attempt 0" in log.read_text(), "step 2", 90)
    slurm.fail_node(victim)  # no orch process runs from here until the job has ended
    revive.append(victim)
    second = root / "slurm" / "attempt-1.json"
    slurm.wait_for(
        lambda: second.exists() and '"returncode": 0' in second.read_text(),
        "attempt 2 ended",
        180,
    )
    slurm.wait_for(lambda: not slurm.active_jobs(), "no allocation", 60)
    assert (root / "outputs" / "step").read_text() == "6"
    record = status_json(orch, job_id)
    assert record["state"] == "succeeded" and record["spec"]["attempt"] == 1, record
    assert victim.name not in [n["host"] for n in record["nodes"]]
    logs = orch("logs", job_id, timeout=60)
    assert logs.returncode == 0, logs.stderr
    assert "--- attempt 2 ---" in logs.stderr
    assert any(line.endswith("finished attempt 1") for line in logs.stdout.splitlines())
    assert any(line.endswith("step 1 attempt 0 world 2") for line in logs.stdout.splitlines())
    assert_slurm_clean(slurm)


def test_orch_kill_cancels_every_attempt_and_none_follows(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    submitted = orch(
        "submit", restart_job(tmp_path, restarts=2, torch=True), "-i", hpc, "-d", timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    running_nodes(slurm, "restart")
    # The next attempt waits behind the running one from its start.
    slurm.wait_for(lambda: len(slurm.active_jobs()) == 2, "attempt 2 queued", 30)
    killed = orch("kill", job_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert_slurm_clean(slurm)
    assert status_json(orch, job_id)["state"] == "killed"
    assert not (slurm_job_root(slurm, job_id) / "slurm" / "attempt-1.json").exists()


def test_ctrl_c_cancels_every_attempt_and_exits_130(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    proc = orch.popen("submit", restart_job(tmp_path), "-i", hpc)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    out.wait_for("step 1 attempt 0", 90)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130, err.text()
    assert "starting the job again" not in err.text()
    assert_slurm_clean(slurm)


def test_a_node_down_mid_job_without_restarts_is_one_error_and_frees_the_allocation(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path, revive: list[Host]
) -> None:
    proc = orch.popen("submit", restart_job(tmp_path, restarts=None), "-i", hpc)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    out.wait_for("step 2 attempt 0", 90)
    _, victim = running_nodes(slurm, "restart")
    started = time.monotonic()
    slurm.fail_node(victim)
    revive.append(victim)
    assert proc.wait(timeout=120) == 1, err.text()
    stderr = err.text()
    assert stderr.count("error:") == 1 and "hint:" in stderr.split("error:")[1], stderr
    assert victim.name in stderr.split("error:")[1], stderr
    assert "Traceback" not in stderr
    assert time.monotonic() - started < 90
    assert_slurm_clean(slurm)


def test_a_job_past_its_time_limit_is_one_error_naming_the_limit(
    slurm: SlurmCluster, orch: OrchRunner, tmp_path: Path
) -> None:
    hpc = slurm.write_inventory(tmp_path / "limited.yaml", sbatch=["--time=1"])
    (tmp_path / "sleeper").mkdir()
    (tmp_path / "sleeper" / "sleep.py").write_text(SLEEPER)
    job = write_workdir_job(tmp_path, tmp_path / "sleeper", "sleep.py", "sleeper", restarts=1)
    proc = orch.popen("submit", job, "-i", hpc)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    out.wait_for("started", 90)
    slurm_id = next(j["id"] for j in slurm.squeue() if j["state"] == "RUNNING")
    # A minute is Slurm's shortest limit: shorten the running job's instead of waiting.
    updated = slurm.run_on_login(f"scontrol update JobId={slurm_id} TimeLimit=0:01")
    assert updated.returncode == 0, updated.stderr
    assert proc.wait(timeout=120) == 1, err.text()
    stderr = err.text()
    assert stderr.count("error:") == 1 and "TIMEOUT" in stderr, stderr
    assert "hint:" in stderr and "--time" in stderr.split("hint:")[1], stderr
    assert "starting the job again" not in stderr  # a restart would meet the same limit
    assert_slurm_clean(slurm)


def test_an_unreachable_login_node_is_exit_3_and_queues_nothing(
    slurm: SlurmCluster, orch: OrchRunner, tmp_path: Path
) -> None:
    before = sorted(j["id"] for j in slurm.squeue())
    slurm.cluster.partition(slurm.login.index)
    try:
        result = orch(
            "submit",
            restart_job(tmp_path),
            "-i",
            slurm.write_inventory(tmp_path / "h.yaml"),
            timeout=90,
        )
    finally:
        slurm.cluster.heal(slurm.login.index)
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("error:") == 1 and "hint:" in result.stderr
    assert slurm.login.address in result.stderr.split("hint:")[0]
    assert sorted(j["id"] for j in slurm.squeue()) == before
