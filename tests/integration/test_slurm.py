"""The Slurm backend against a real Slurm cluster (tests/cluster/slurm.py): node1 is the
login node (slurmctld, munged), node2..node4 the compute nodes (slurmd), one shared
home. The real `orch` CLI talks to the login node only; every job runs through sbatch
and srun, a real torchrun per node, gloo between the nodes."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import PARTITION, SUBNET, OrchRunner, SlurmCluster
from tests.support import Lines, assert_slurm_clean, job_id_of, slurm_job_root

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slurm,
    pytest.mark.xdist_group("slurm"),
]  # one Slurm cluster serves the module

# Only the first test needs the ranks to meet (ALLREDUCE=1): the others leave torch out,
# which costs each rank an import of about 2 s of CPU.
TRAIN = """\
import os, socket, time

rank, world, total = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None
if os.environ.get("ALLREDUCE") == "1":
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    summed = torch.tensor([rank])
    dist.all_reduce(summed)
    total = int(summed.item())
print(f"rank {rank} of {world} on {socket.gethostname()} sum {total} "
      f"master {os.environ['MASTER_ADDR']} slurm {os.environ['ORCH_SLURM_JOB_ID']} "
      f"ifname {os.environ.get('GLOO_SOCKET_IFNAME')} node {os.environ['ORCH_NODE_RANK']} "
      f"setup {os.path.exists('made-by-setup.txt')}",
      flush=True)
for i in range(int(os.environ.get("LINES", "3"))):
    print(f"line {i} of rank {rank}", flush=True)
if os.environ.get("FAIL_RANK") == str(rank):
    time.sleep(0.5)
    raise RuntimeError(f"rank {rank} fails on purpose")
time.sleep(float(os.environ.get("SLEEP", "0")))
if total is not None:
    dist.barrier()
    dist.destroy_process_group()  # else gloo may abort the exit (SIGABRT), as it did once
"""


def job_file(tmp_path: Path, name: str = "ddp", **keys: Any) -> Path:
    """A job file whose workdir holds TRAIN; `env` and other keys as given."""
    workdir = tmp_path / "work"
    workdir.mkdir(exist_ok=True)
    (workdir / "train.py").write_text(TRAIN)
    spec = {"name": name, "workdir": str(workdir), "script": "train.py", "nodes": 3, **keys}
    spec = {key: value for key, value in spec.items() if value is not None}
    path = tmp_path / f"{name}-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def status_table(orch: OrchRunner) -> subprocess.CompletedProcess[str]:
    """`orch status`, wide enough that no row wraps."""
    return orch("status", env={"COLUMNS": "250"})


def test_three_node_job_streams_every_rank_prefixed_and_exits_0(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = job_file(tmp_path, setup="echo done > made-by-setup.txt", env={"ALLREDUCE": "1"})
    result = orch("submit", job, "-i", hpc, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    job_id = job_id_of(result.stdout)
    assert f"setup: running on the login node {slurm.login.address}" in result.stderr
    slurm_id = re.search(rf"slurm job (\d+) on partition {PARTITION}", result.stderr)
    assert slurm_id, result.stderr
    for rank, node in enumerate(("node2", "node3", "node4")):
        lines = [
            line for line in result.stdout.splitlines() if line.startswith(f"[{node} r{rank}] ")
        ]
        # Node rank from SLURM_NODEID; the master is node2, found on the node (NodeAddr).
        assert any(
            f"rank {rank} of 3 on {node} sum 3 master {SUBNET}.12 slurm {slurm_id[1]} "
            f"ifname eth0 node {rank} setup True" in line
            for line in lines
        ), result.stdout
        for i in range(3):  # every line once: none lost, none doubled
            assert sum(line.endswith(f" line {i} of rank {rank}") for line in lines) == 1
    assert [j["state"] for j in slurm.squeue() if j["id"] == slurm_id[1]] == ["COMPLETED"]
    root = slurm_job_root(slurm, job_id)
    made = [root, *root.rglob("*")]
    assert len(made) > 10 and (root / "node4" / "logs" / "rank-2.log").exists()
    shared = [
        f"{path.relative_to(root)} {stat.S_IMODE(path.lstat().st_mode):o}"
        for path in made
        if not path.is_symlink() and path.lstat().st_mode & 0o077
    ]
    assert shared == []  # everything orch or its launcher made is the user's alone
    status = status_table(orch)
    assert re.search(rf"{job_id}\s+ddp\s+succeeded \(slurm {slurm_id[1]}\)", status.stdout)
    one = orch("status", job_id, env={"COLUMNS": "250"})
    assert f"job {job_id} (ddp): succeeded (slurm {slurm_id[1]})" in one.stdout, one.stdout
    assert all(
        re.search(rf"node{i}\s+{i - 2}\s+{i - 2}\s+succeeded", one.stdout) for i in (2, 3, 4)
    )
    assert_slurm_clean(slurm)


def test_a_raising_rank_fails_the_job_and_slurm_frees_every_node(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = job_file(tmp_path, "boom", env={"FAIL_RANK": "1", "SLEEP": "150"})
    started = time.monotonic()
    result = orch("submit", job, "-i", hpc, timeout=180)
    assert result.returncode == 1, result.stderr[-3000:]
    # Well before the others' 150 s: kill-on-bad-exit (a loaded machine took 48 s).
    assert time.monotonic() - started < 100
    assert "failed: node node3 exited with code 1; first failure: rank 1" in result.stderr
    assert "last lines of [node3 r1]:" in result.stderr
    assert "RuntimeError: rank 1 fails on purpose" in result.stderr
    assert "Traceback" not in result.stderr.split("error:")[0].split("\n")[-1]
    assert_slurm_clean(slurm)
    status = status_table(orch)
    assert re.search(r"boom\s+failed \(slurm \d+, FAILED\)", status.stdout), status.stdout


def test_ctrl_c_cancels_the_slurm_job_and_exits_130(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    secret = f"s3cret-{time.monotonic_ns()}"
    job = job_file(tmp_path, "interrupted", env={"SLEEP": "120", "TOKEN": secret})
    proc = orch.popen("submit", job, "-i", hpc)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    out.wait_for("line 2 of rank 2", timeout=60)
    for host in slurm.hosts:  # the job's env is in no process's argv, on any host
        assert not [cmd for _, cmd in slurm.cluster.host_pids(host.index) if secret in cmd]
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60) == 130, err.text()
    assert "cancelled, its allocation gone" in err.text()
    assert_slurm_clean(slurm)


def test_detached_job_is_followed_to_its_end_by_logs_f(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    job = job_file(tmp_path, "detached", env={"SLEEP": "3", "LINES": "4"})
    submitted = orch("submit", job, "-i", hpc, "--detach", timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    assert len(submitted.stdout.splitlines()) == 1  # detached: no rank's line
    followed = orch("logs", "-f", job_id, timeout=90)
    assert followed.returncode == 0, followed.stderr
    for rank, node in enumerate(("node2", "node3", "node4")):
        for i in range(4):
            assert followed.stdout.count(f"[{node} r{rank}] line {i} of rank {rank}\n") == 1
    again = orch("logs", job_id, "--rank", "1", timeout=60)
    assert again.returncode == 0
    assert "[node3 r1] line 3 of rank 1" in again.stdout and "r0]" not in again.stdout
    assert orch("status", "--json", job_id).returncode == 0
    assert '"state": "succeeded"' in orch("status", "--json", job_id).stdout


def test_second_job_waits_pending_while_the_first_holds_the_nodes_then_runs(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    first = orch("submit", job_file(tmp_path, "first", env={"SLEEP": "120"}), "-i", hpc, "-d")
    assert first.returncode == 0, first.stderr
    first_id = job_id_of(first.stdout)
    slurm.wait_for(
        lambda: any(j["state"] == "RUNNING" for j in slurm.squeue()), "the first job running", 30
    )
    second = orch("submit", job_file(tmp_path, "second"), "-i", hpc, "-d")
    assert second.returncode == 0, second.stderr
    second_id = job_id_of(second.stdout)
    status = status_table(orch)
    assert re.search(
        rf"{second_id}\s+second\s+pending \(slurm \d+, (Resources|Priority)\)", status.stdout
    ), status.stdout
    assert re.search(rf"{first_id}\s+first\s+running", status.stdout), status.stdout

    killed = orch("kill", first_id, timeout=60)  # scancel, until squeue has it gone
    assert killed.returncode == 0, killed.stderr
    assert "gone from squeue" in killed.stdout and f"job {first_id} killed" in killed.stdout
    followed = orch("logs", "-f", second_id, timeout=90)
    assert followed.returncode == 0, followed.stderr
    assert "[node4 r2] line 2 of rank 2" in followed.stdout
    status = status_table(orch)
    assert re.search(rf"{first_id}\s+first\s+killed \(slurm \d+, CANCELLED\)", status.stdout)
    assert re.search(rf"{second_id}\s+second\s+succeeded", status.stdout), status.stdout
    assert_slurm_clean(slurm)


def test_bad_inputs_are_refused_before_anything_is_queued(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    before = slurm.squeue()
    cases = [
        (
            job_file(tmp_path),
            slurm.write_inventory(tmp_path / "p.yaml", partition="gpu"),
            2,
            "slurm.partition: the cluster has no partition 'gpu'",
            f"partitions on {slurm.login.address}: {PARTITION}",
        ),
        (
            job_file(tmp_path, nodes=5),
            hpc,
            2,
            f"nodes=5 but Slurm partition '{PARTITION}' has 3 nodes",
            "lower nodes",
        ),
        (
            job_file(tmp_path, hosts=["node2"], nodes=None),
            hpc,
            2,
            "hosts: names SSH hosts",
            "sbatch: [--nodelist=",
        ),
        (
            job_file(tmp_path, labels=["a100"], nodes=None),
            hpc,
            2,
            "labels: selects SSH hosts",
            "sbatch: [--constraint=",
        ),
        (
            job_file(tmp_path),
            slurm.write_inventory(tmp_path / "t.yaml", sbatch=["--time=forever"]),
            2,
            "sbatch refused the job",
            "hint:",
        ),
    ]
    for job, inventory, code, message, hint in cases:
        result = orch("submit", job, "-i", inventory, timeout=60)
        assert result.returncode == code, (message, result.stderr)
        assert message in result.stderr and hint in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert slurm.squeue() == before

    hidden = slurm.cluster.exec_on(
        slurm.login.index, ["mount", "--bind", "/dev/null", "/usr/bin/sbatch"]
    )
    assert hidden.returncode == 0, hidden.stderr
    try:
        result = orch("submit", job_file(tmp_path), "-i", hpc, timeout=60)
        checked = orch("check", "-i", hpc, timeout=60)
    finally:
        slurm.cluster.exec_on(slurm.login.index, ["umount", "/usr/bin/sbatch"])
    assert result.returncode == 3, result.stderr
    assert f"no sbatch on the Slurm login node {slurm.login.address}" in result.stderr
    assert checked.returncode == 3 and "no sbatch" in checked.stderr
    assert slurm.squeue() == before


def test_check_sees_the_partition_and_probes_a_compute_node(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    result = orch("check", "-i", hpc, job_file(tmp_path), "--compute", timeout=90)
    assert result.returncode == 0, result.stderr
    assert f"partition {PARTITION}: 3 nodes (up, default)" in result.stdout
    assert f"3 nodes of partition {PARTITION}: ok" in result.stdout
    assert re.search(r"compute probe on node\d: python 3\.\d+\.\d+, torch \S+", result.stdout)
    too_many = orch("check", "-i", hpc, job_file(tmp_path, nodes=4), timeout=60)
    assert too_many.returncode == 3 and "nodes=4 but Slurm partition" in too_many.stderr


def test_dry_run_prints_the_batch_script_and_touches_no_host(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    before = slurm.squeue()
    result = orch("submit", job_file(tmp_path), "-i", hpc, "--dry-run", timeout=30)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --nodes=3" in result.stdout
    assert "srun --kill-on-bad-exit=1" in result.stdout
    assert "sbatch --parsable slurm/batch.sh" in result.stdout
    assert slurm.squeue() == before
