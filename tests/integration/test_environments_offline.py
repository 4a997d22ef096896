"""Offline hosts on the real cluster (docs/ENVIRONMENTS.md, "Offline hosts"): the
controller downloads the wheels from an index only it reaches (served on this
machine's loopback, which the hosts' network namespaces cannot reach), once, and
they travel with the code; wheels from a directory outside the workdir; and the
faults of a build: Ctrl-C with a build killed halfway, and a full disk."""

from __future__ import annotations

import os
import re
import signal
import stat
import time
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner, repo_python
from tests.index import serve_index
from tests.support import assert_no_job_left, wait_for, write_workdir_job
from tests.wheels import tiny_wheel

pytestmark = pytest.mark.cluster

TOKEN = "s3cret-index-token"
SCRIPT = (
    "import sys, socket, orchtop, orchdep, orchplat\n"
    "print('OFFLINE', orchtop.VERSION, orchdep.VERSION, orchplat.VERSION, "
    "socket.gethostname(), sys.prefix, flush=True)\n"
)
TINY = "import sys, socket, orchtiny\nprint('TINY', orchtiny.VERSION, socket.gethostname(), sys.prefix, flush=True)\n"


def abi_and_machine() -> tuple[str, str]:
    """The hosts' python's ABI tag and machine (they run this repository's python)."""
    import sysconfig

    soabi = str(sysconfig.get_config_var("SOABI"))
    return "cp" + soabi.split("-")[1], sysconfig.get_platform().split("-")[-1]


def index_wheels(tmp_path: Path) -> Path:
    """orchdep; orchtop, which needs orchdep (5 MB); orchplat, a wheel for the hosts'
    python on manylinux_2_17 only; orchwin, a wheel for Windows only."""
    made = tmp_path / "made"
    tiny_wheel(made, "orchdep", "1.0")
    # 5 MB: past what the relay takes over (sync/relay.py RELAY_MIN_BYTES).
    tiny_wheel(made, "orchtop", "1.0", ["orchdep>=1"], payload_bytes=5 << 20)
    abi, machine = abi_and_machine()
    for name, platform in (("orchplat", f"manylinux_2_17_{machine}"), ("orchwin", "win_amd64")):
        tiny_wheel(made, name, "1.0")
        (made / f"{name}-1.0-py3-none-any.whl").rename(
            made / f"{name}-1.0-{abi}-{abi}-{platform}.whl"
        )
    return made


def pip_reads_only(tmp_path: Path, url: str) -> dict[str, str]:
    """The controller's pip settings: the test's index, and no config file or local
    wheel directory of this machine's."""
    nothing = tmp_path / "no-links"
    nothing.mkdir(exist_ok=True)
    return {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(nothing), "PIP_INDEX_URL": url}


def push_log(stderr: str, verb: str) -> dict[str, int]:
    """Files per host from the `-v` line `pushed ...` or `relayed ...`."""
    line = next((x for x in stderr.splitlines() if f"orchestrator.ssh.submit: {verb} " in x), "")
    return {h: int(n) for n, h in re.findall(r"(\d+) files \(\d+ kB\) to (\S+?)(?:,|$)", line)}


def published(home: Path) -> list[str]:
    envs = home / ".orch" / "envs"
    if not envs.is_dir():
        return []
    return sorted(p.name for p in envs.iterdir() if p.is_dir() and not p.name.startswith("."))


def leftovers(home: Path) -> list[str]:
    envs = home / ".orch" / "envs"
    return sorted(p.name for p in envs.iterdir() if p.name.startswith(".build-"))


def holds(root: Path, secret: bytes) -> list[Path]:
    """The files under `root` that hold `secret`."""
    found = []
    for top, _dirs, files in os.walk(root):
        for name in files:
            path = Path(top) / name
            try:
                if not path.is_symlink() and secret in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def test_the_controller_downloads_the_wheels_once_for_hosts_that_reach_no_index(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "offline.py").write_text(SCRIPT)
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    common = {"launcher": "python", "nodes": 3, "wheels": "download"}
    job = write_workdir_job(
        tmp_path, work, "offline.py", environment=["orchtop==1.0", "orchplat"], **common
    )
    with serve_index(index_wheels(tmp_path), tmp_path / "index", f"orch:{TOKEN}") as index:
        port = index.url.rsplit(":", 1)[1].split("/")[0]
        # The hosts reach no index: the controller's loopback is not theirs.
        reach = f"import socket; socket.create_connection(('127.0.0.1', {port}), 2)"
        assert cluster.exec_on(1, [str(repo_python()), "-c", reach]).returncode != 0
        pip = pip_reads_only(tmp_path, index.url)
        # orch check asks no host for the index: they install with none.
        checked = orch("check", "-i", inventory, job, env=pip, timeout=120)
        assert "cannot reach the package index" not in checked.stdout + checked.stderr
        assert (
            "(orchtop==1.0, orchplat, from wheels this machine downloads for the hosts at "
            "submit, no index there): not asked" in checked.stdout
        ), checked.stdout + checked.stderr

        first = orch("-v", "submit", job, "-i", inventory, env=pip, timeout=300)
        assert first.returncode == 0, first.stdout + first.stderr
        # Over the controller's link once: node1 got them, node2 and node3 from its relay.
        pushed, relayed = push_log(first.stderr, "pushed"), push_log(first.stderr, "relayed")
        assert pushed["node1"] >= 4 and pushed["node2"] == pushed["node3"] == 0, pushed
        assert relayed == {"node2": pushed["node1"], "node3": pushed["node1"]}, relayed
        assert "wheels: downloading for node1, node2, node3 (python " in first.stderr
        assert "environment: built on node1" in first.stderr
        ran = re.findall(r"OFFLINE (\S+) (\S+) (\S+) (node\d) (\S+)", first.stdout)
        assert sorted(r[3] for r in ran) == ["node1", "node2", "node3"], first.stdout
        assert all(r[:3] == ("1.0", "1.0", "1.0") and "/.orch/envs/" in r[4] for r in ran)
        asked = len(index.asked)
        assert sum("/files/" in a for a in index.asked) == 3, index.asked  # each wheel once

        # Cached on the controller, owner-only; the token nowhere on the hosts.
        cache = orch.controller.state_dir / "wheels"
        assert stat.S_IMODE(cache.stat().st_mode) == 0o700
        assert len([p for p in cache.iterdir()]) == 1
        assert TOKEN not in first.stdout + first.stderr
        for i in (1, 2, 3):
            assert holds(cluster.home(i) / ".orch", TOKEN.encode()) == []

        # An edit of the code: nothing downloaded, nothing asked of the index, no build.
        (work / "offline.py").write_text(SCRIPT + "print('edited', flush=True)\n")
        again = orch("submit", job, "-i", inventory, env=pip, timeout=300)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "wheels: downloading" not in again.stderr
        assert "environment: built" not in again.stderr
        assert len(index.asked) == asked and again.stdout.count("edited") == 3

        # No wheel of a requirement for the hosts' platform: exit 3 naming it and the
        # hosts, nothing recorded or started, nothing cached.
        bad = write_workdir_job(
            tmp_path, work, "offline.py", name="nowheel", environment=["orchwin"], **common
        )
        refused = orch("submit", bad, "-i", inventory, env=pip, timeout=300)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "error: environment: cannot download orchwin for node1, node2, node3" in refused.stderr
    assert "hint: " in refused.stderr and "Traceback" not in refused.stderr
    assert "nowheel" not in orch("status", timeout=60).stdout
    assert len(list(cache.iterdir())) == 1
    assert_no_job_left(cluster, [1, 2, 3])


def test_wheels_from_a_directory_outside_the_workdir_travel_with_the_code(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(TINY)
    outside = tiny_wheel(tmp_path / "outside", "orchtiny", "8.0")
    other = tiny_wheel(tmp_path / "other", "orchtiny", "9.0")
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(
        tmp_path,
        work,
        "tiny.py",
        launcher="python",
        hosts=["node1", "node3"],
        environment=["orchtiny"],
        wheels=str(outside),
    )
    first = orch("submit", job, "-i", inventory, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    ran = re.findall(r"TINY (\S+) (node\d) (\S+)", first.stdout)
    assert sorted((v, h) for v, h, _ in ran) == [("8.0", "node1"), ("8.0", "node3")]
    # --wheels names another directory outside it, relative to where orch runs.
    second = orch("submit", job, "-i", inventory, "--wheels", "other", cwd=tmp_path, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert {v for v, _, _ in re.findall(r"TINY (\S+) (node\d) (\S+)", second.stdout)} == {"9.0"}
    assert other.is_dir()


def hold_build(job_id: str, timeout: float = 120) -> tuple[int, int]:
    """Stop (SIGSTOP) the installer of the job's environment build the moment it runs,
    and return its pid and its parent's (the agent's `env ensure`), as this machine
    numbers them. /proc is read here in a tight loop: the installer may take only a
    fraction of a second, which a listing through the host's namespaces could miss."""
    deadline = time.monotonic() + timeout
    mark = f"/jobs/{job_id}/".encode()
    while time.monotonic() < deadline:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"pip" in argv and b"install" in argv and any(mark in a for a in argv):
                os.kill(int(name), signal.SIGSTOP)
                with open(f"/proc/{name}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
                return int(name), parent
        time.sleep(0.01)
    raise AssertionError(f"no build of job {job_id} seen in {timeout:.0f} s")


def slow_build_job(cluster: Cluster, tmp_path: Path, version: str) -> tuple[Path, Path]:
    """A job on node3 whose environment's one wheel (1 MB) takes its installer a moment,
    and its inventory: a build that a test can catch at work (`hold_build`)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(TINY)
    tiny_wheel(work / "wheels", "orchtiny", version, payload_bytes=1 << 20)
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(
        tmp_path,
        work,
        "tiny.py",
        launcher="python",
        hosts=["node3"],
        environment=[f"orchtiny=={version}"],
        wheels=str(work / "wheels"),
        warm=False,
    )
    return job, inventory


def test_a_build_interrupted_by_ctrl_c_and_killed_halfway_is_never_used_and_the_next_submit_builds_it(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    job, inventory = slow_build_job(cluster, tmp_path, "10.0")
    home = cluster.home(3)
    before = published(home)
    submit = orch.popen("submit", job, "-i", inventory)
    try:
        assert submit.stdout is not None
        job_id = submit.stdout.readline().split()[1]
        # The installer at work in the build's temporary directory: held there.
        pip, agent = hold_build(job_id)
        os.killpg(submit.pid, signal.SIGINT)
        out, err = submit.communicate(timeout=60)
    finally:
        if submit.poll() is None:
            os.killpg(submit.pid, signal.SIGKILL)
            submit.communicate()
    assert submit.returncode == 130, out + err
    assert "environment: the build under way on node3 goes on there" in err
    assert "TINY" not in out
    # The build dies halfway on the host (the host's agent and its installer killed,
    # as an OOM kill or a reboot would): its temporary directory stays, unpublished.
    for pid in (agent, pip):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not os.path.exists(f"/proc/{pip}"), 30, "the build's processes gone")
    assert published(home) == before
    assert leftovers(home), "a half-built environment is left to be ignored"

    again = orch("submit", job, "-i", inventory, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "environment: built on node3" in again.stderr
    ran = re.findall(r"TINY (\S+) (node\d) (\S+)", again.stdout)
    assert [(v, h) for v, h, _ in ran] == [("10.0", "node3")]
    assert "/.build-" not in ran[0][2]
    assert len(published(home)) == len(before) + 1 and leftovers(home) == []
    assert_no_job_left(cluster, [3])


def test_a_full_disk_mid_build_names_the_host_exits_3_and_leaves_no_environment(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.py").write_text(TINY)
    tiny_wheel(work / "wheels", "orchtiny", "11.0", payload_bytes=3 << 20)
    inventory = cluster.write_inventory(tmp_path / "inv.yaml")
    job = write_workdir_job(
        tmp_path,
        work,
        "tiny.py",
        launcher="python",
        hosts=["node1", "node2"],
        environment=["orchtiny==11.0"],
        wheels=str(work / "wheels"),
        warm=False,
    )
    # node2's environments on a filesystem of 1 MB, in its own mount namespace: the
    # venv fits, the wheel's 3 MB do not.
    envs = "/root/.orch/envs"
    assert cluster.exec_on(2, ["mkdir", "-p", envs]).returncode == 0
    mounted = cluster.exec_on(
        2, ["mount", "-t", "tmpfs", "-o", "size=1m,mode=700", "orch-full", envs]
    )
    assert mounted.returncode == 0, mounted.stderr
    try:
        full = orch("submit", job, "-i", inventory, timeout=300)
        assert full.returncode == 3, full.stdout + full.stderr
        assert "error: environment: the build failed on node2" in full.stderr
        assert "No space left on device" in full.stderr
        assert "hint: " in full.stderr and "Traceback" not in full.stderr
        assert "TINY" not in full.stdout
        left = cluster.exec_on(2, ["ls", "-A", envs])
        assert [n for n in left.stdout.split() if not n.endswith(".lock")] == [], left.stdout
        assert_no_job_left(cluster, [1, 2])
    finally:
        cluster.exec_on(2, ["umount", envs])
    # Room again: the next submit builds it there and runs.
    again = orch("submit", job, "-i", inventory, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    ran = re.findall(r"TINY (\S+) (node\d) (\S+)", again.stdout)
    assert sorted((v, h) for v, h, _ in ran) == [("11.0", "node1"), ("11.0", "node2")]


def test_orch_kill_during_a_build_ends_the_submit_as_killed_and_the_build_serves_the_next_job(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    job, inventory = slow_build_job(cluster, tmp_path, "12.0")
    home = cluster.home(3)
    before = published(home)
    submit = orch.popen("submit", job, "-i", inventory)
    try:
        assert submit.stdout is not None
        job_id = submit.stdout.readline().split()[1]
        pip, _agent = hold_build(job_id)
        killed = orch("kill", job_id, timeout=120)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        os.kill(pip, signal.SIGCONT)  # the build goes on, and ends
        out, err = submit.communicate(timeout=120)
    finally:
        if submit.poll() is None:
            os.killpg(submit.pid, signal.SIGKILL)
            submit.communicate()
    assert submit.returncode == 1, out + err
    assert f"error: job {job_id} was killed (orch kill) before it started" in err
    assert "TINY" not in out and "Traceback" not in err
    assert re.search(rf"{job_id}\s+\S+\s+killed", orch("status", timeout=60).stdout)
    # The build was published whole, and the next job runs in it with no build.
    assert len(published(home)) == len(before) + 1 and leftovers(home) == []
    again = orch("submit", job, "-i", inventory, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "environment: built" not in again.stderr
    assert re.findall(r"TINY (\S+) (node\d)", again.stdout) == [("12.0", "node3")]
    assert_no_job_left(cluster, [3])
