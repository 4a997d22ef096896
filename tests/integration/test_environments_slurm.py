"""`environment:` on the Slurm cluster (tests/cluster/slurm.py): built once on the login
node in the shared home, and every node of the job runs with its python."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster import OrchRunner, SlurmCluster
from tests.index import serve_index
from tests.integration.test_environments import make_wheel
from tests.integration.test_environments_offline import pip_reads_only
from tests.support import assert_slurm_clean

pytestmark = [pytest.mark.cluster, pytest.mark.slurm, pytest.mark.xdist_group("slurm")]

SCRIPT = (
    "import os, sys, orchtiny\n"
    "print('TINY', orchtiny.VERSION, os.environ['ORCH_NODE_RANK'], sys.prefix, flush=True)\n"
)


def test_a_slurm_job_runs_every_node_in_the_environment_built_once_on_the_login_node(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(SCRIPT)
    make_wheel(tmp_path, work / "wheels", "8.0")
    spec = {
        "name": "envslurm",
        "workdir": str(work),
        "script": "tiny.py",
        "nodes": 3,
        "environment": ["orchtiny==8.0"],
        "wheels": str(work / "wheels"),
    }
    job = tmp_path / f"env-{time.monotonic_ns()}.yaml"
    job.write_text(yaml.safe_dump(spec))
    first = orch("submit", job, "-i", hpc, timeout=180)
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    assert "environment: built on the login node" in first.stderr
    runs = re.findall(r"TINY (\S+) (\d) (\S+)", first.stdout)
    assert sorted(r for _, r, _ in runs) == ["0", "1", "2"], first.stdout
    assert all(v == "8.0" and "/.orch/envs/" in p for v, _, p in runs), runs
    again = orch("submit", job, "-i", hpc, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert "environment: built" not in again.stderr
    assert len(re.findall(r"TINY 8.0 \d", again.stdout)) == 3
    assert_slurm_clean(slurm)
    # orch env lists it where it was built: the login node, in the shared home.
    listed = orch("env", "-i", hpc, timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = [line for line in listed.stdout.splitlines() if "orchtiny==8.0" in line]
    login = slurm.login
    assert len(rows) == 1 and rows[0].split(":")[0] in (login.name, login.address), listed.stdout


def test_a_slurm_job_gets_wheels_from_a_directory_outside_its_workdir(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(SCRIPT)
    make_wheel(tmp_path, tmp_path / "outside", "8.2")
    spec = {
        "name": "envoutside",
        "workdir": str(work),
        "script": "tiny.py",
        "nodes": 2,
        "environment": ["orchtiny==8.2"],
        "wheels": str(tmp_path / "outside"),
    }
    job = tmp_path / f"env-{time.monotonic_ns()}.yaml"
    job.write_text(yaml.safe_dump(spec))
    ran = orch("submit", job, "-i", hpc, timeout=180)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    runs = re.findall(r"TINY (\S+) (\d) (\S+)", ran.stdout)
    assert sorted(r for _, r, _ in runs) == ["0", "1"], ran.stdout
    assert all(v == "8.2" and "/.orch/envs/" in p for v, _, p in runs), runs
    assert_slurm_clean(slurm)


def test_a_slurm_job_gets_the_wheels_the_controller_downloads_for_the_login_nodes_python(
    slurm: SlurmCluster, orch: OrchRunner, hpc: Path, tmp_path: Path
) -> None:
    """The index is on this machine's loopback: only the controller reaches it."""
    made = tmp_path / "made"
    make_wheel(tmp_path, made, "8.3")
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(SCRIPT)
    spec = {
        "name": "envdownload",
        "workdir": str(work),
        "script": "tiny.py",
        "nodes": 2,
        "environment": ["orchtiny==8.3"],
        "wheels": "download",
    }
    job = tmp_path / f"env-{time.monotonic_ns()}.yaml"
    job.write_text(yaml.safe_dump(spec))
    with serve_index(made, tmp_path / "index") as index:
        ran = orch("submit", job, "-i", hpc, env=pip_reads_only(tmp_path, index.url), timeout=180)
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    assert "wheels: downloading for the login node " in ran.stderr, ran.stderr[-3000:]
    runs = re.findall(r"TINY (\S+) (\d) (\S+)", ran.stdout)
    assert sorted(r for _, r, _ in runs) == ["0", "1"], ran.stdout
    assert all(v == "8.3" and "/.orch/envs/" in p for v, _, p in runs), runs
    assert_slurm_clean(slurm)
