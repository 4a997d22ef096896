"""What one job, and one user, can see or change of another's, on the real cluster:
a job that writes into its own pushed files changes no later job's code, and a
second Unix user on the host (uid 65534, nobody) reads nothing of a running job:
not its environment through ps or /proc, not a file under its workdir, and nothing
of the controller's $ORCH_HOME."""

from __future__ import annotations

import secrets
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import (
    assert_no_job_left,
    job_id_of,
    job_processes,
    pushed_files,
    wait_for,
    write_workdir_job,
)

pytestmark = pytest.mark.cluster

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

TAMPER_SCRIPT = r"""
import sys
print("saw", open("config.txt").read().strip(), flush=True)
if sys.argv[1:] == ["tamper"]:
    with open("config.txt", "r+") as f:  # the same length: the store's sizes still match
        f.write("lr = 9.9\n")
"""


def test_a_job_that_overwrites_its_pushed_file_leaves_the_next_job_the_pushed_bytes(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=["node3"])
    work = tmp_path / "work"
    work.mkdir()
    (work / "tamper.py").write_text(TAMPER_SCRIPT)
    (work / "config.txt").write_text(f"lr = 0.1\n# {secrets.token_hex(8)}\n")
    first = orch(
        "submit", write_workdir_job(tmp_path, work, "tamper.py", args=["tamper"]), "-i", inventory
    )
    assert first.returncode == 0, first.stderr
    assert "saw lr = 0.1" in first.stdout
    tampered = cluster.home("node3") / ".orch" / "jobs" / job_id_of(first.stdout) / "node3"
    assert (tampered / "code" / "config.txt").read_text().startswith("lr = 9.9\n")

    second = orch("-v", "submit", write_workdir_job(tmp_path, work, "tamper.py"), "-i", inventory)

    assert second.returncode == 0, second.stderr
    # The store had lent that file to the first job: it checks it, finds it changed,
    # and has it sent again (tamper.py stays as it was: it is not sent).
    assert pushed_files(second.stderr) == {"node3": 1}
    assert "[node3 r0] saw lr = 0.1" in second.stdout, second.stdout


SECRET_SCRIPT = r"""
import os, time
print("secret", os.environ["ORCH_TEST_SECRET"], flush=True)
time.sleep(300)
"""

WORKDIR = "/run/orchwork"  # /run: each test host's own tmpfs, 0755 like a shared /home


@pytest.fixture
def open_state_dir() -> Iterator[Path]:
    """An $ORCH_HOME whose parents anyone may traverse, created 0755 as a careless
    mkdir would: what keeps another user out is then orch's own doing."""
    parent = Path(tempfile.mkdtemp(prefix="orch-privacy-"))
    try:
        parent.chmod(0o755)
        (parent / "state").mkdir(mode=0o755)
        (parent / "state").chmod(0o755)
        yield parent / "state"
    finally:
        shutil.rmtree(parent)


# Prints each argument that the running user can read (a file) or list (a directory).
OPENABLE = """for p; do
  if [ -d "$p" ]; then ls -- "$p"; else cat -- "$p"; fi >/dev/null 2>&1 && echo "$p"
done"""


def as_nobody_on(cluster: Cluster, host: str, script: str, *args: str) -> str:
    """What `sh -c script` prints, run on `host` as uid/gid 65534 with no groups
    (its exit status is left alone: every "Permission denied" makes it fail)."""
    return cluster.exec_on(host, [*NOBODY, "sh", "-c", script, "sh", *args], timeout=60).stdout


def openable_here_by_nobody(paths: list[Path]) -> list[str]:
    """The paths on this machine (the controller) that uid 65534 can read or list."""
    argv = [*NOBODY, "sh", "-c", OPENABLE, "sh", *map(str, paths)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return result.stdout.splitlines()


def test_another_user_on_the_host_reads_nothing_of_a_running_job_nor_the_controllers_state(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path, open_state_dir: Path
) -> None:
    host = "node2"
    made = cluster.exec_on(host, ["sh", "-c", f"mkdir -p {WORKDIR} && chmod 0755 {WORKDIR}"])
    assert made.returncode == 0, made.stderr
    inventory = cluster.write_inventory(
        tmp_path / "inv.yaml", hosts=[host], defaults={"workdir": WORKDIR}
    )
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    work = tmp_path / "work"
    work.mkdir()
    (work / "secret.py").write_text(SECRET_SCRIPT)
    job = write_workdir_job(tmp_path, work, "secret.py", env={"ORCH_TEST_SECRET": secret})
    state = {"ORCH_HOME": str(open_state_dir)}
    submitted = orch("submit", "-d", job, "-i", inventory, env=state)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    node_dir = f"{WORKDIR}/jobs/{job_id}/{host}"
    log = f"{node_dir}/logs/rank-0.log"
    try:
        wait_for(
            lambda: secret in cluster.exec_on(host, ["cat", log]).stdout,
            60,
            "the rank to print",
            poll=0.5,
        )
        # Root finds the secret in a rank's environment: there is something to hide.
        assert secret in cluster.exec_on(host, ["sh", "-c", "cat /proc/[0-9]*/environ"]).stdout

        seen = as_nobody_on(
            cluster,
            host,
            "ps -eo args; for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do "
            'cat "$f" 2>/dev/null; echo; done',
        )
        assert "secret.py" in seen  # nobody sees the job's processes, not its secret
        assert secret not in seen

        below = cluster.exec_on(host, ["find", WORKDIR, "-mindepth", "1"]).stdout.splitlines()
        for path in (f"{node_dir}/node.json", log, f"{node_dir}/code/secret.py"):
            assert path in below
        assert any(p.startswith(f"{WORKDIR}/store/objects/") for p in below)
        assert "jobs" in as_nobody_on(cluster, host, f"ls {WORKDIR}").split()  # the top: 0755
        assert as_nobody_on(cluster, host, f"find {WORKDIR} -mindepth 1 -readable") == ""
        assert as_nobody_on(cluster, host, OPENABLE, *below) == ""

        # The controller: orch made $ORCH_HOME owner-only, and all it holds.
        held = [open_state_dir, *open_state_dir.rglob("*")]
        assert len(held) > 1
        for path in held:
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), f"{path}: {mode:o}"
        assert openable_here_by_nobody(held) == []
        assert openable_here_by_nobody([open_state_dir.parent]) == [str(open_state_dir.parent)]
    finally:
        killed = orch("kill", job_id, env=state, timeout=60)
    assert killed.returncode == 0, killed.stderr
    wait_for(lambda: job_processes(cluster, 2) == [], 15, "the job's processes to go")
    assert_no_job_left(cluster, [2])
