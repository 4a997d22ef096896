"""Code push on the real cluster: exact copies, incremental pushes, per-job snapshots,
setup caching and gc, through the real `orch` CLI over SSH."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.hostile_names import HOSTILE_NAMES
from tests.support import pushed_files, write_workdir_job


def write_job(tmp_path: Path, workdir: Path, script: str, **keys: Any) -> Path:
    return write_workdir_job(tmp_path, workdir, script, name="sync", **keys)


pytestmark = pytest.mark.cluster

# Prints one line describing every path under the job's working directory (its code
# snapshot), computed on the host: kind, sha256 or link target, links not followed.
LISTING_SCRIPT = r"""
import hashlib, json, os, socket, stat
def listing(root):
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ["link", os.readlink(path)]
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ["dir", ""]
            else:
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                found[rel] = ["exec" if st.st_mode & stat.S_IXUSR else "file", digest]
    return found
if __name__ == "__main__":
    print("LISTING", socket.gethostname(), json.dumps(listing("."), sort_keys=True), flush=True)
"""


def local_listing(root: Path) -> dict[str, list[str]]:
    namespace: dict[str, Any] = {}
    exec(LISTING_SCRIPT.split('if __name__ == "__main__":')[0], namespace)
    result: dict[str, list[str]] = namespace["listing"](str(root))
    return result


def listings(stdout: str) -> dict[str, dict[str, list[str]]]:
    """Each host's LISTING line, by the hostname the job saw."""
    found = {}
    for line in stdout.splitlines():
        if "] LISTING " in line:
            host, data = line.split("] LISTING ", 1)[1].split(" ", 1)
            found[host] = json.loads(data)
    return found


def job_id(stdout: str) -> str:
    match = re.match(r"^job (\S+)$", stdout.splitlines()[0])
    assert match, stdout
    return match.group(1)


def job_dir(cluster: Cluster, host: str, job: str) -> Path:
    return cluster.home(host) / ".orch" / "jobs" / job / host


def test_hostile_tree_arrives_byte_exact_on_three_hosts(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    (work / "a/b/c/d/e/f/g").mkdir(parents=True)
    (work / "listing.py").write_text(LISTING_SCRIPT)
    for n, name in enumerate(HOSTILE_NAMES):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(f"content {n}\n".encode() + os.urandom(n * 100))
    (work / "a/b/c/d/e/f/g/deep.py").write_text("deep = True\n")
    (work / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "run.sh").chmod(0o755)
    (work / "outputs").mkdir()
    (work / "data").symlink_to("/etc")  # a link out of the tree: kept as a link, never followed
    (work / "latest.py").symlink_to("run.sh")
    (work / ".gitignore").write_text("*.ckpt\n")
    (work / "model.ckpt").write_text("ignored")
    expected = local_listing(work)
    del expected["model.ckpt"]

    result = orch(
        "submit", write_job(tmp_path, work, "listing.py", nodes=3), "-i", inventory, timeout=120
    )

    assert result.returncode == 0, result.stderr
    found = listings(result.stdout)
    assert sorted(found) == ["node1", "node2", "node3"]
    for host, tree in found.items():
        assert tree == expected, f"{host} got a different tree"
    assert "model.ckpt" not in found["node1"] and found["node1"]["data"] == ["link", "/etc"]
    for i in (1, 2, 3):
        assert not (cluster.home(i) / "pwned").exists()


def test_edits_and_deletions_propagate_and_an_unchanged_resubmit_sends_nothing(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "listing.py").write_text(LISTING_SCRIPT)
    for n in range(5):
        (work / f"m{n}.py").write_text(f"x = {n}\n")
    job = write_job(tmp_path, work, "listing.py", nodes=2)
    first = orch("-v", "submit", job, "-i", inventory, timeout=120)
    assert first.returncode == 0, first.stderr
    assert pushed_files(first.stderr) == {"node1": 6, "node2": 6}

    (work / "m1.py").write_text("x = 'edited'\n")
    (work / "m2.py").unlink()
    (work / "new.py").write_text("new = 1\n")
    second = orch("-v", "submit", job, "-i", inventory, timeout=120)
    assert second.returncode == 0, second.stderr
    assert pushed_files(second.stderr) == {"node1": 2, "node2": 2}
    for tree in listings(second.stdout).values():
        assert tree == local_listing(work)
        assert "m2.py" not in tree and "new.py" in tree

    third = orch("-v", "submit", job, "-i", inventory, timeout=120)
    assert third.returncode == 0, third.stderr
    assert pushed_files(third.stderr) == {"node1": 0, "node2": 0}


WAIT_SCRIPT = r"""
import sys, time
print("start", open("data.txt").read().strip(), flush=True)
time.sleep(float(sys.argv[1]))
print("end", open("data.txt").read().strip(), flush=True)
"""


def test_a_running_job_keeps_its_snapshot_while_the_next_push_changes_files(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "wait.py").write_text(WAIT_SCRIPT)
    (work / "data.txt").write_text("v1\n")
    # Pinned ports: A may not listen yet when B probes for a free one.
    first = orch(
        "submit",
        "-d",
        write_job(tmp_path, work, "wait.py", nodes=1, args=["8"], rendezvous={"port": 29611}),
        "-i",
        inventory,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    running = job_id(first.stdout)

    (work / "data.txt").write_text("v2\n")
    second = orch(
        "submit",
        write_job(tmp_path, work, "wait.py", nodes=1, args=["0"], rendezvous={"port": 29612}),
        "-i",
        inventory,
        timeout=120,
    )
    assert second.returncode == 0, second.stderr
    assert "start v2" in second.stdout and "end v2" in second.stdout

    old = job_dir(cluster, "node1", running)
    deadline = time.monotonic() + 60
    while not (old / "exit.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    log = (old / "logs" / "rank-0.log").read_text()
    assert "start v1" in log and "end v1" in log, log
    new = job_dir(cluster, "node1", job_id(second.stdout))
    assert (old / "code" / "data.txt").read_text() == "v1\n"
    # The cluster logs in as root, whom modes stop not: each snapshot has its own copy.
    assert (old / "code" / "wait.py").stat().st_ino != (new / "code" / "wait.py").stat().st_ino


def test_setup_runs_once_per_code_version_and_says_when_it_is_cached(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text("print('ran main', flush=True)\n")
    marker = f"setup-runs-{time.monotonic_ns()}"
    setup = f'echo "setup in $(basename "$PWD")"; echo run >> ~/{marker}'
    job = write_job(tmp_path, work, "main.py", nodes=2, setup=setup)

    first = orch("submit", job, "-i", inventory, timeout=120)
    assert first.returncode == 0, first.stderr
    assert (
        "[node1 setup] setup in code" in first.stdout
        and "[node2 setup] setup in code" in first.stdout
    )
    second = orch("submit", job, "-i", inventory, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "setup: cached on node1, node2" in second.stderr
    assert "setup]" not in second.stdout and "ran main" in second.stdout
    (work / "main.py").write_text("print('ran main, edited', flush=True)\n")
    third = orch("submit", job, "-i", inventory, timeout=120)
    assert third.returncode == 0, third.stderr
    assert "[node1 setup] setup in code" in third.stdout
    for host in ("node1", "node2"):
        assert (cluster.home(host) / marker).read_text() == "run\nrun\n"


def test_a_failing_setup_names_its_host_shows_its_output_and_starts_nothing(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text("print('ran main', flush=True)\n")
    setup = (
        'echo preparing; if [ "$(hostname)" = node2 ]; then echo "no such package" >&2; exit 7; fi'
    )
    result = orch(
        "submit",
        write_job(tmp_path, work, "main.py", nodes=2, setup=setup),
        "-i",
        inventory,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    assert "error: setup failed on node2: it exited with code 7" in result.stderr
    assert "no such package" in result.stderr.split("error:", 1)[1]
    assert "Traceback" not in result.stderr and "hint: fix the job's setup" in result.stderr
    assert "ran main" not in result.stdout
    started = job_id(result.stdout)
    for host in ("node1", "node2"):
        assert (job_dir(cluster, host, started) / "code" / "main.py").exists()
        assert not (job_dir(cluster, host, started) / "pid.json").exists()


def test_gc_removes_finished_snapshots_and_content_only_they_used(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=["node3"])
    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text("print('done', flush=True)\n")
    unique_bytes = os.urandom(5000)
    (work / "unique.bin").write_bytes(unique_bytes)
    result = orch("submit", write_job(tmp_path, work, "main.py"), "-i", inventory, timeout=120)
    assert result.returncode == 0, result.stderr
    finished = job_dir(cluster, "node3", job_id(result.stdout))
    store = cluster.home("node3") / ".orch" / "store" / "objects"
    unique = store / hashlib.sha256(unique_bytes).hexdigest()
    assert unique.read_bytes() == unique_bytes
    for path in store.glob("*"):  # older than the grace period that protects pushes in flight
        os.utime(path, (time.time() - 3600, time.time() - 3600))

    gc = orch("gc", "-i", inventory, "--keep", "0", timeout=60)

    assert gc.returncode == 0, gc.stderr
    assert re.match(r"^node3: removed [1-9]\d* snapshots and [1-9]\d* files", gc.stdout), gc.stdout
    assert not (finished / "code").exists() and (finished / "exit.json").exists()
    assert not unique.exists()
