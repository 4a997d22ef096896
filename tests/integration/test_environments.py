"""`environment:` on the real cluster, offline (the test hosts reach no index): wheels
made in the test travel with the code; one environment per host (one for the two
hosts that share a home), reused by the next job, rebuilt for a changed requirement;
an unresolvable requirement starts nothing (docs/ENVIRONMENTS.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import (
    assert_no_job_left,
    job_id_of,
    job_processes,
    wait_for,
    write_workdir_job,
)
from tests.wheels import tiny_wheel

pytestmark = pytest.mark.cluster

SCRIPT = "import sys, socket, orchtiny\nprint('TINY', orchtiny.VERSION, socket.gethostname(), sys.prefix, flush=True)\n"


def make_wheel(tmp_path: Path, wheels: Path, version: str) -> None:
    """A wheel of `orchtiny` (one module), built here with no index."""
    tiny_wheel(wheels, "orchtiny", version)


def tiny_lines(stdout: str) -> dict[str, tuple[str, str]]:
    """host -> (orchtiny's version, the rank's sys.prefix)."""
    return {m[2]: (m[1], m[3]) for m in re.finditer(r"TINY (\S+) (\S+) (\S+)", stdout)}


def published(home: Path) -> list[str]:
    envs = home / ".orch" / "envs"
    return sorted(p.name for p in envs.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_environment_built_once_per_filesystem_reused_rebuilt_and_refused(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(SCRIPT)
    make_wheel(tmp_path, work / "wheels", "1.0")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    common = {"launcher": "python", "nodes": 3, "wheels": str(work / "wheels")}
    job = write_workdir_job(tmp_path, work, "tiny.py", environment=["orchtiny==1.0"], **common)
    with cluster.shared_home([1, 2]) as home:
        before = orch("check", "-i", inventory, job, timeout=120)
        assert (
            "environment: " in before.stdout
            and "(orchtiny==1.0, from wheels with no index): the next submit builds it on "
            "node1, node2, node3"
            in before.stdout
        ), before.stdout + before.stderr
        first = orch("submit", job, "-i", inventory, timeout=300)
        assert first.returncode == 0, first.stdout + first.stderr
        built = [line for line in first.stderr.splitlines() if "environment: built on" in line]
        # node1 and node2 share one home: one build there (node2 waited for it), one on node3.
        assert len(built) == 1 and "node1" in built[0] and "node3" in built[0], first.stderr
        assert "node2" not in built[0]
        ran = tiny_lines(first.stdout)
        assert {h: v for h, (v, _) in ran.items()} == {
            "node1": "1.0",
            "node2": "1.0",
            "node3": "1.0",
        }
        assert all("/.orch/envs/" in prefix for _, prefix in ran.values()), ran
        assert len(published(home)) == 1 and len(published(cluster.home(3))) == 1
        after = orch("check", "-i", inventory, job, timeout=120)
        assert "no index): built on node1, node2, node3" in after.stdout, after.stdout

        # The same requirements again (the code edited): nothing is installed.
        (work / "tiny.py").write_text(SCRIPT + "print('edited', flush=True)\n")
        second = orch("-v", "submit", job, "-i", inventory, timeout=300)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "environment: built" not in second.stderr, second.stderr
        # Checked in the push's own round trip on node1 and node3 (node2 shares node1's).
        assert "environment: the push found it built on node1, node3" in second.stderr
        assert tiny_lines(second.stdout) == ran

        # A changed requirement: another environment, built on each filesystem.
        make_wheel(tmp_path, work / "wheels", "2.0")
        changed = write_workdir_job(
            tmp_path, work, "tiny.py", environment=["orchtiny==2.0"], **common
        )
        third = orch("submit", changed, "-i", inventory, timeout=300)
        assert third.returncode == 0, third.stdout + third.stderr
        assert "environment: built on" in third.stderr
        assert {v for v, _ in tiny_lines(third.stdout).values()} == {"2.0"}
        assert len(published(home)) == 2 and len(published(cluster.home(3))) == 2

        # A requirement no wheel satisfies: exit 3 naming it and the hosts, nothing
        # started, nothing half-built left.
        bad = write_workdir_job(
            tmp_path, work, "tiny.py", environment=["orch-no-such-package==1"], **common
        )
        refused = orch("submit", bad, "-i", inventory, timeout=300)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "orch-no-such-package" in refused.stderr
        assert "node1, node2, node3" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert "TINY" not in refused.stdout
        for where in (home, cluster.home(3)):
            assert len(published(where)) == 2
            assert [
                p for p in (where / ".orch" / "envs").iterdir() if p.name.startswith(".build-")
            ] == []
        assert_no_job_left(cluster, [1, 2, 3])

        # orch env lists them per host; orch gc keeps them while they are recent, and
        # removes them once unused for ORCH_KEEP_ENVS_DAYS.
        listed = orch("env", "-i", inventory, timeout=120)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        rows = [line for line in listed.stdout.splitlines() if "orchtiny==" in line]
        assert {line.split(":")[0] for line in rows} == {"node1", "node2", "node3"}
        assert sum("orchtiny==2.0" in line for line in rows) == 3
        kept = orch("gc", "-i", inventory, timeout=120)
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert len(published(home)) == 2
        gone = orch("gc", "-i", inventory, env={"ORCH_KEEP_ENVS_DAYS": "0"}, timeout=120)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert "unused environments" in gone.stdout
        assert published(home) == [] and published(cluster.home(3)) == []


WARM_SCRIPT = (
    "import os, sys, orchtiny\n"
    "print('TINY', orchtiny.VERSION, os.environ['ORCH_NODE_RANK'], sys.prefix, flush=True)\n"
)


def node_pids(cluster: Cluster, i: int, job_id: str) -> dict[str, Any]:
    path = cluster.home(i) / ".orch" / "jobs" / job_id / f"node{i}" / "pid.json"
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def warm_ready(cluster: Cluster, i: int) -> list[dict[str, Any]]:
    folder = cluster.home(i) / ".orch" / "warm"
    found = []
    for path in sorted(folder.glob("*/*.json")) if folder.exists() else []:
        try:
            record = json.loads(path.read_text())
        except ValueError:  # being written
            continue
        if record.get("state") == "ready":
            found.append(record)
    return found


def test_an_edit_resubmit_in_an_environment_runs_warm_with_no_install(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(WARM_SCRIPT)
    make_wheel(tmp_path, work / "wheels", "3.0")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(
        tmp_path,
        work,
        "tiny.py",
        environment=["orchtiny==3.0"],
        wheels=str(work / "wheels"),
        hosts=["node1", "node2"],
    )
    try:
        first = orch("submit", job, "-i", inventory, timeout=300)
        assert first.returncode == 0, first.stdout + first.stderr
        first_id = job_id_of(first.stdout)
        # Even the first submit is forked: from the warm interpreter it started in the
        # environment (an earlier test's may be ready there beside it, with the host's).
        assert all(node_pids(cluster, i, first_id).get("warm") for i in (1, 2))
        assert "cold start" not in first.stderr, first.stderr

        def in_environment(i: int) -> bool:
            return any("/.orch/envs/" in str(r.get("python")) for r in warm_ready(cluster, i))

        assert all(in_environment(i) for i in (1, 2))

        (work / "tiny.py").write_text(WARM_SCRIPT + "print('edited', flush=True)\n")
        again = orch("submit", job, "-i", inventory, timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "environment: built" not in again.stderr and "cold start" not in again.stderr
        again_id = job_id_of(again.stdout)
        assert all(node_pids(cluster, i, again_id).get("warm") for i in (1, 2))
        versions = re.findall(r"TINY (\S+) \d (\S+)", again.stdout)
        assert len(versions) == 2 and all(
            v == "3.0" and "/.orch/envs/" in p for v, p in versions
        ), again.stdout
        assert again.stdout.count("edited") == 2
    finally:
        orch("warm", "--stop", "-i", inventory, timeout=120)


def test_setup_with_setup_inputs_runs_again_only_when_they_change(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "main.py").write_text("print('ran main', flush=True)\n")
    (work / "prepare.txt").write_text("v1\n")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    marker = f"setup-inputs-{tmp_path.name}"
    job = write_workdir_job(
        tmp_path,
        work,
        "main.py",
        launcher="python",
        hosts=["node1", "node3"],
        setup=f"cat prepare.txt >> ~/{marker}",
        setup_inputs=["prepare.txt"],
    )
    first = orch("submit", job, "-i", inventory, timeout=180)
    assert first.returncode == 0, first.stdout + first.stderr
    (work / "main.py").write_text("print('ran main, edited', flush=True)\n")
    edited = orch("submit", job, "-i", inventory, timeout=180)
    assert edited.returncode == 0, edited.stdout + edited.stderr
    assert "setup: cached on node1, node3 (same setup and setup_inputs ran there)" in edited.stderr
    assert "ran main, edited" in edited.stdout
    (work / "prepare.txt").write_text("v2\n")
    changed = orch("submit", job, "-i", inventory, timeout=180)
    assert changed.returncode == 0, changed.stdout + changed.stderr
    for host in ("node1", "node3"):
        assert (cluster.home(host) / marker).read_text() == "v1\nv2\n"


RESTART_SCRIPT = """
import os, sys, time, orchtiny
attempt, rank = int(os.environ["ORCH_ATTEMPT"]), os.environ["RANK"]
print("ENVRUN", attempt, rank, orchtiny.VERSION, sys.prefix, flush=True)
if attempt == 0:
    if rank == "1":
        sys.exit(3)
    time.sleep(30)
"""


def test_a_detached_jobs_restart_by_its_keeper_runs_in_the_environment(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "restart.py").write_text(RESTART_SCRIPT)
    make_wheel(tmp_path, work / "wheels", "4.0")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(
        tmp_path,
        work,
        "restart.py",
        environment=["orchtiny==4.0"],
        wheels=str(work / "wheels"),
        hosts=["node1", "node2"],
        restarts=1,
        nproc_per_node=1,
        warm=False,
    )
    done = orch("submit", "-d", job, "-i", inventory, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = job_id_of(done.stdout)

    def ended() -> bool:
        shown = orch("status", job_id, timeout=60)
        return "succeeded" in shown.stdout

    wait_for(ended, 90, "the keeper's second attempt to succeed", poll=1.0)
    logs = orch("logs", job_id, timeout=60)
    runs = re.findall(r"ENVRUN (\d) (\d) (\S+) (\S+)", logs.stdout)
    assert {(a, r) for a, r, _, _ in runs} == {("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")}
    assert all(v == "4.0" and "/.orch/envs/" in p for _, _, v, p in runs), runs
    wait_for(lambda: not any(job_processes(cluster, i) for i in (1, 2)), 15, "no job process left")


def test_a_keeper_restart_with_a_spare_at_hand_runs_in_the_environment_where_it_runs(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "restart.py").write_text(RESTART_SCRIPT)
    make_wheel(tmp_path, work / "wheels", "5.0")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(
        tmp_path,
        work,
        "restart.py",
        environment=["orchtiny==5.0"],
        wheels=str(work / "wheels"),
        nodes=2,
        restarts=1,
        nproc_per_node=1,
        warm=False,
    )
    done = orch("submit", "-d", job, "-i", inventory, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "spares: node3" in done.stderr, done.stderr
    job_id = job_id_of(done.stdout)
    wait_for(lambda: "succeeded" in orch("status", job_id, timeout=60).stdout, 90, "attempt 2")
    logs = orch("logs", job_id, timeout=60)
    runs = re.findall(r"\[(node\d) r\d\] ENVRUN (\d) \d (\S+) (\S+)", logs.stdout)
    # A failed rank's host is not lost: the restart may run where the last did
    # (docs/RUNNING.md), or on the spare; wherever it runs, in the environment built there.
    assert {a for _, a, _, _ in runs} == {"0", "1"}, logs.stdout
    assert all(v == "5.0" and "/.orch/envs/" in p for _, _, v, p in runs), runs
    wait_for(lambda: not any(job_processes(cluster, i) for i in (1, 2, 3)), 15, "no job process")


def test_a_bare_host_python_without_torch_runs_a_job_whose_environment_brings_its_packages(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    bare = getattr(sys, "_base_executable", sys.executable)  # the hosts' venv's own base
    probe = subprocess.run([bare, "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{bare} has torch: no bare python to test with here")
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(SCRIPT)
    make_wheel(tmp_path, work / "wheels", "6.0")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", defaults={"python": bare})
    plain = write_workdir_job(tmp_path, work, "tiny.py", launcher="python", hosts=["node3"])
    refused = orch("submit", plain, "-i", inventory, timeout=120)
    assert refused.returncode == 3 and "torch is not installed" in refused.stderr, refused.stderr
    job = write_workdir_job(
        tmp_path,
        work,
        "tiny.py",
        launcher="python",
        hosts=["node3"],
        environment=["orchtiny==6.0"],
        wheels=str(work / "wheels"),
    )
    ran = orch("submit", job, "-i", inventory, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert tiny_lines(ran.stdout)["node3"][0] == "6.0"


def test_two_jobs_asking_at_once_for_one_environment_share_one_build(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(SCRIPT)
    make_wheel(tmp_path, work / "wheels", "7.0")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    jobs = [
        write_workdir_job(
            tmp_path,
            work,
            "tiny.py",
            launcher="python",
            hosts=["node1", "node3"],
            environment=["orchtiny==7.0"],
            wheels=str(work / "wheels"),
            name=f"twin{i}",
        )
        for i in range(2)
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda j: orch("submit", j, "-i", inventory, timeout=300), jobs))
    for result in results:
        assert result.returncode == 0, result.stdout + result.stderr
        assert {v for v, _ in tiny_lines(result.stdout).values()} == {"7.0"}
    said = "".join(r.stderr for r in results)
    # Each host built it once, whichever job asked first; the other job waited and used it.
    for host in ("node1", "node3"):
        assert said.count(f"{host} (") == 1, said
    for i in (1, 3):
        envs = cluster.home(i) / ".orch" / "envs"
        assert [p for p in envs.iterdir() if p.name.startswith(".build-")] == []
