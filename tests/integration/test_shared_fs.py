"""Hosts that share a filesystem (an NFS home), on the real cluster: hosts whose home
is one directory run every node in one snapshot, pushed once, set up once; pushes
into one store never clash; gc leaves what a running job uses."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import assert_no_job_left, job_id_of, pushed_files, wait_for, write_workdir_job


def write_job(tmp_path: Path, workdir: Path, script: str, **keys: Any) -> Path:
    return write_workdir_job(tmp_path, workdir, script, name="shared", **keys)


pytestmark = pytest.mark.cluster

# Rank 0 writes a file in its working directory; after a barrier every rank says
# whether it sees the file and what its working directory is.
SHARED_FILE_SCRIPT = r"""
import os, socket
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    with open("from-rank0.txt", "w") as f:
        f.write(os.environ["ORCH_JOB_ID"])
dist.barrier()
seen = open("from-rank0.txt").read() if os.path.exists("from-rank0.txt") else "nothing"
print(f"RANK {rank} {socket.gethostname()} sees {seen} in {os.getcwd()}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""
SLEEP_SCRIPT = "import time, sys\nprint('up', flush=True)\ntime.sleep(float(sys.argv[1]))\n"


def rank_lines(stdout: str) -> dict[int, tuple[str, str, str]]:
    """rank -> (hostname, what it saw, its working directory)."""
    found = {}
    for line in stdout.splitlines():
        match = re.search(r"RANK (\d+) (\S+) sees (\S+) in (\S+)", line)
        if match:
            found[int(match[1])] = (match[2], match[3], match[4])
    return found


def test_mixed_cluster_two_hosts_share_one_directory_and_setup_runs_once_per_filesystem(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "shared.py").write_text(SHARED_FILE_SCRIPT)
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", defaults={"slots": 2})
    setup = "echo setup ran on $(hostname) >> ~/setup-runs"
    job = write_job(tmp_path, work, "shared.py", nproc_per_node=2, setup=setup)
    with cluster.shared_home([1, 2]) as home:
        check = orch("check", "-i", inventory, timeout=120)
        assert "shared filesystem: node1, node2" in check.stdout, check.stdout + check.stderr

        first = orch("-v", "submit", job, "-i", inventory, timeout=180)
        assert first.returncode == 0, first.stdout + first.stderr
        job_id = job_id_of(first.stdout)
        # The code went once to the shared home and once to node3's own disk.
        assert pushed_files(first.stderr) == {"node1": 1, "node3": 1}
        assert "code: node2 share the filesystem of node1: one copy for all" in first.stderr
        assert "setup: node2 uses node1's (one filesystem)" in first.stderr
        assert (home / "setup-runs").read_text() == "setup ran on node1\n"
        assert (cluster.home(3) / "setup-runs").read_text() == "setup ran on node3\n"
        ranks = rank_lines(first.stdout)
        assert sorted(ranks) == list(range(6))
        shared_code = f"/root/.orch/jobs/{job_id}/code"
        for rank in range(4):  # node1 and node2: one directory, rank 0's file in it
            assert ranks[rank][1:] == (job_id, shared_code), ranks[rank]
        for rank in (4, 5):  # node3 works on its own disk
            assert ranks[rank][1:] == ("nothing", f"/root/.orch/jobs/{job_id}/node3/code")
        jobs = home / ".orch" / "jobs" / job_id
        assert sorted(p.name for p in jobs.iterdir()) == [
            "agent",
            "code",
            "node1",
            "node2",
            "outputs",  # one ORCH_OUTPUT_DIR for the nodes of the shared filesystem
            "seal.json",  # as root: what a later snapshot checks before it takes the files
            "snapshot.json",
        ]
        for node in ("node1", "node2"):  # each node's own files stay its own
            assert os.readlink(jobs / node / "code") == "../code"
            assert (jobs / node / "exit.json").exists()
            assert (jobs / node / "logs").is_dir()

        again = orch("-v", "submit", job, "-i", inventory, timeout=180)
        assert again.returncode == 0, again.stdout + again.stderr
        assert pushed_files(again.stderr) == {"node1": 0, "node3": 0}
        assert "setup: cached on node1, node3" in again.stderr
        assert (home / "setup-runs").read_text() == "setup ran on node1\n"
    assert_no_job_left(cluster, [1, 2, 3])


def test_four_sharing_hosts_get_one_push_and_a_resubmit_sends_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "shared.py").write_text(SHARED_FILE_SCRIPT)
    for n in range(20):
        (work / f"m{n}.py").write_bytes(os.urandom(2000))
    with cluster.extra_hosts(1), cluster.shared_home([1, 2, 3, 4]):
        orch = OrchRunner(cluster.new_controller())  # one that knows node4's host key
        inventory = cluster.write_inventory(tmp_path / "inv.yaml")
        job = write_job(tmp_path, work, "shared.py")
        first = orch("-v", "submit", job, "-i", inventory, timeout=180)
        assert first.returncode == 0, first.stdout + first.stderr
        assert pushed_files(first.stderr) == {"node1": 21}
        job_id = job_id_of(first.stdout)
        ranks = rank_lines(first.stdout)
        assert [ranks[r][:2] for r in range(4)] == [(f"node{r + 1}", job_id) for r in range(4)]
        again = orch("-v", "submit", job, "-i", inventory, timeout=180)
        assert again.returncode == 0, again.stdout + again.stderr
        assert pushed_files(again.stderr) == {"node1": 0}


def test_concurrent_pushes_into_one_store_never_fail(cluster: Cluster, tmp_path: Path) -> None:
    """Two jobs from two laptops at once, with common and own files, into one shared
    store: found out as shared, and not (shared_fs: false, so both hosts write it).
    Reverting the writer-unique temporary names makes the second round fail."""
    with cluster.shared_home([1, 2]):
        for round_, shared_fs in enumerate([None, False]):
            common = os.urandom(3 << 20)  # several pieces: parts of it meet on the host
            extras = {} if shared_fs is None else {"shared_fs": shared_fs}
            inventory = cluster.write_inventory(
                tmp_path / f"inv{round_}.yaml", hosts=[1, 2], defaults=extras
            )
            runs = []
            for name in ("a", "b"):
                work = tmp_path / f"work-{round_}-{name}"
                work.mkdir()
                (work / "common.bin").write_bytes(common)
                (work / "own.bin").write_bytes(os.urandom(1 << 20))
                (work / "main.py").write_text(f"print('job {name} ok', flush=True)\n")
                job = write_job(tmp_path, work, "main.py")
                orch = OrchRunner(cluster.new_controller())
                runs.append((name, orch.popen("submit", job, "-i", inventory)))
            for name, process in runs:
                out, err = process.communicate(timeout=180)
                assert process.returncode == 0, f"round {round_} job {name}: {out}{err}"
                assert out.count(f"job {name} ok") == 2, out
    assert_no_job_left(cluster, [1, 2])


def test_push_killed_half_way_then_resubmit(cluster: Cluster, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "big.bin").write_bytes(os.urandom(60 << 20))
    (work / "main.py").write_text("import os\nprint('size', os.path.getsize('big.bin'))\n")
    with cluster.shared_home([1, 2]) as home:
        inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1, 2])
        job = write_job(tmp_path, work, "main.py")
        orch = OrchRunner(cluster.new_controller())
        objects = home / ".orch" / "store" / "objects"
        process = orch.popen("submit", job, "-i", inventory)
        wait_for(
            lambda: objects.is_dir() and any(p.suffix == ".part" for p in objects.iterdir()),
            timeout=60,
            what="the push to begin writing",
            poll=0.02,
        )
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)
        again = orch("submit", job, "-i", inventory, timeout=180)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.count(f"size {60 << 20}") == 2, again.stdout
    assert_no_job_left(cluster, [1, 2])


def test_gc_leaves_the_snapshot_a_running_job_shares(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "sleep.py").write_text(SLEEP_SCRIPT)
    with cluster.shared_home([1, 2]) as home:
        inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1, 2])
        finished = orch(
            "submit",
            write_job(tmp_path, work, "sleep.py", args=["0"]),
            "-i",
            inventory,
            timeout=120,
        )
        assert finished.returncode == 0, finished.stderr
        running = orch(
            "submit",
            write_job(tmp_path, work, "sleep.py", args=["300"]),
            "-i",
            inventory,
            "--detach",
            timeout=120,
        )
        assert running.returncode == 0, running.stderr
        job_id = job_id_of(running.stdout)
        gc = orch("gc", "-i", inventory, "--keep", "0", timeout=120)
        assert gc.returncode == 0, gc.stderr
        jobs = home / ".orch" / "jobs"
        assert (jobs / job_id / "code" / "sleep.py").exists()
        assert not (jobs / job_id_of(finished.stdout) / "code").exists()
        assert orch("kill", job_id, timeout=60).returncode == 0
        # The store's objects of the running job are still linked, so still there.
        assert any((home / ".orch" / "store" / "objects").iterdir())
    assert_no_job_left(cluster, [1, 2])
