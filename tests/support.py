"""Helpers the integration tests share: job files, what runs on a host, job ids, waiting.

Test modules import shared helpers from here and never from each other; a helper only
one module uses stays in that module. The cluster itself is ``tests/cluster/``.
tests/integration/conftest.py has pytest rewrite the asserts here, so a failing check
shows its values as it would inside a test.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from tests.cluster import (
    REPO_ROOT,
    Cluster,
    ClusterError,
    Host,
    OrchRunner,
    SlurmCluster,
    orch_command,
    skip_or_fail,
)

JOBS = REPO_ROOT / "tests" / "integration" / "jobs"


def write_job(tmp_path: Path, job_dir: str, script: str, **keys: Any) -> Path:
    """A job file in tmp_path whose workdir is one of tests/integration/jobs/.

    Args:
        tmp_path: where the file goes, as ``<job_dir>.yaml``.
        job_dir: a directory of ``JOBS``; its name, with ``-`` for ``_``, names the job.
        script: the script in it to run.
        **keys: any other job keys (``nodes``, ``args``, ``env``, ``rendezvous`` ...).

    Returns:
        The job file's path.
    """
    spec = {
        "name": job_dir.replace("_", "-"),
        "workdir": str(JOBS / job_dir),
        "script": script,
        **keys,
    }
    path = tmp_path / f"{job_dir}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def write_workdir_job(
    tmp_path: Path, workdir: Path, script: str, name: str = "work", **keys: Any
) -> Path:
    """A job file in tmp_path, with a fresh name, whose workdir is ``workdir``."""
    spec = {"name": name, "workdir": str(workdir), "script": script, **keys}
    path = tmp_path / f"job-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def outputs_job(tmp_path: Path, *args: str, paths: list[str] | None = None) -> Path:
    """The outputs job (jobs/outputs/write_outputs.py, launcher python, two nodes): each
    node writes ``expected_data`` of its host, a log and a ``latest`` link to its output
    directory, and the job keeps ``paths`` of them (every file by default)."""
    return write_job(
        tmp_path,
        "outputs",
        "write_outputs.py",
        launcher="python",
        nodes=2,
        args=list(args),
        outputs={"from": "all", "paths": paths or ["*"]},
    )


SPAWN_ARGS = ["-n", "{num_nodes}", "-g", "{nprocs_list}", "-i", "{node_rank}"]


def spawn_job(tmp_path: Path, *extra: str, **keys: Any) -> Path:
    """The self-spawning job (jobs/launchers/spawn.py, launcher python, two nodes): the
    script starts its own processes from its -n/-g/-i arguments, then ``extra`` ones."""
    return write_job(
        tmp_path,
        "launchers",
        "spawn.py",
        launcher="python",
        nodes=2,
        args=[*SPAWN_ARGS, *extra],
        **keys,
    )


def expected_data(host: str) -> bytes:
    """What the outputs job writes on ``host``: 1 MiB, different on every host."""
    return hashlib.sha256(host.encode()).digest() * (1 << 15)


def pushed_files(stderr: str) -> dict[str, int]:
    """Files sent per host, from the ``-v`` log line of the push."""
    line = next(line for line in stderr.splitlines() if "orchestrator.ssh.submit: pushed " in line)
    return {h: int(n) for n, h in re.findall(r"(\d+) files \(\d+ kB\) to (\S+?)(?:,|$)", line)}


def start_attached(orch: OrchRunner, job: Path, inventory: Path) -> subprocess.Popen[str]:
    """An attached ``orch submit``, its stdout and stderr read as they come (text)."""
    return subprocess.Popen(
        [*orch_command(), "submit", str(job), "-i", str(inventory)],
        env=orch.controller.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class Lines:
    """The lines of a text stream (a process's stderr, say), read in a thread as they
    come, so that a test can wait for one while the process runs."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float) -> float:
        """The monotonic time by which a line holding `text` had come."""
        wait_for(lambda: any(text in line for line in self.lines), timeout, repr(text), poll=0.05)
        return time.monotonic()

    def text(self, timeout: float = 30) -> str:
        """Everything, once the stream ended."""
        self._thread.join(timeout)
        return "".join(self.lines)


WARM_SERVE = " warm serve "  # a warm interpreter's command line (agent/node/warm/serve.py)


def job_processes(cluster: Cluster, host: int) -> list[tuple[int, str]]:
    """Every process on a host but its sshd (PID 1), transient sshd session children
    (`[sshd]` while one ends, its command line gone) and the warm interpreters orch
    leaves for the next submit (no job's: the ranks forked from one show their own
    command line)."""
    return [
        (pid, cmd)
        for pid, cmd in cluster.host_pids(host)
        if pid != 1 and not cmd.lstrip("[").startswith("sshd") and WARM_SERVE not in f" {cmd} "
    ]


def warm_processes(cluster: Cluster, host: int) -> list[tuple[int, str]]:
    """The warm interpreters on a host."""
    return [(pid, cmd) for pid, cmd in cluster.host_pids(host) if WARM_SERVE in f" {cmd} "]


ZOMBIE_GRACE_S = 5.0  # for a parent to reap a child that ended as the command returned


def ending(cmd: str) -> bool:
    """A zombie, or a process whose command line is gone: it is exiting."""
    return cmd.endswith("<defunct>") or (cmd.startswith("[") and cmd.endswith("]"))


def assert_no_job_left(cluster: Cluster, hosts: range | list[int]) -> None:
    """No job process on any of these hosts (read from each host's own process table).

    Only processes that are ending get a moment: a zombie (one that ended just as the
    command returned, an agent command's, whose sshd reaps it once the connection
    closes) and one whose command line is gone (`[python]`: it is exiting, its memory
    already released, as a warm interpreter that is told to stop or an agent command
    that just answered). Each runs nothing more; one still there after ZOMBIE_GRACE_S
    is a leak like any other.
    """
    for i in hosts:
        left = job_processes(cluster, i)
        deadline = time.monotonic() + ZOMBIE_GRACE_S
        while left and all(ending(c) for _, c in left) and time.monotonic() < deadline:
            time.sleep(0.1)
            left = job_processes(cluster, i)
        assert left == [], f"processes left on node{i}"


def assert_nothing_started(cluster: Cluster, hosts: list[int]) -> None:
    """No job directory and no job process on any of these hosts."""
    for i in hosts:
        jobs = cluster.home(i) / ".orch" / "jobs"
        started = (
            [p.name for p in jobs.iterdir() if p.name.startswith("allreduce-")]
            if jobs.exists()
            else []
        )
        assert started == [], f"job files created on node{i}"
    assert_no_job_left(cluster, hosts)


def clear_jobs(cluster: Cluster) -> None:
    """Remove every job directory on node1..node3.

    Then ``assert_nothing_started`` sees only what the calling test made.
    """
    for i in (1, 2, 3):
        jobs = cluster.home(i) / ".orch" / "jobs"
        if jobs.exists():
            subprocess.run(["rm", "-rf", str(jobs)], check=True)


def job_id_of(stdout: str) -> str:
    """The job id from ``orch submit``'s first line of output, ``job <id>``."""
    first = stdout.splitlines()[0]
    assert first.startswith("job "), first
    return first.split()[1]


def status_json(orch: OrchRunner, job_id: str) -> dict[str, Any]:
    """The job's record as ``orch status <id> --json`` prints it (which must succeed)."""
    result = orch("status", job_id, "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    data: list[dict[str, Any]] = json.loads(result.stdout)
    return data[0]


def wait_for(
    condition: Callable[[], object],
    timeout: float = 5,
    what: str = "the condition",
    *,
    poll: float = 0.1,
) -> None:
    """Poll ``condition`` until it is true; it is always asked at least once.

    Args:
        condition: what to wait for; called again every ``poll`` seconds.
        timeout: seconds to wait before giving up.
        what: what is awaited, for the failure message ("every rank to be ready").
        poll: seconds between two calls.

    Raises:
        AssertionError: ``condition`` still false after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def controller_processes(orch: OrchRunner) -> list[int]:
    """Processes on this machine that run as this test's controller (its ORCH_HOME)."""
    tag = f"ORCH_HOME={orch.controller.state_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if tag in environ:
                found.append(int(entry))
    return found


def release(cluster: Cluster, hosts: Sequence[int], name: str) -> None:
    """Let a workload run with `--until ~/NAME` on these hosts go on to its end."""
    for i in hosts:
        (cluster.home(i) / name).touch()


def slurm_job_root(slurm: SlurmCluster, job_id: str) -> Path:
    """The job's directory in the Slurm cluster's shared home, as this machine sees it."""
    assert slurm.home is not None, "slurm cluster not started"
    return slurm.home / ".orch" / "jobs" / job_id


def assert_slurm_clean(slurm: SlurmCluster) -> None:
    """No allocation, pending or running, of any attempt, and on no compute node any
    process but sshd and slurmd (slurmd takes a moment to reap a step's slurmstepd, and
    slurmctld to let an allocation go, after the job ended)."""
    slurm.wait_for(lambda: slurm.active_jobs() == [], "no allocation left", 60)
    for host in slurm.compute:
        left: list[tuple[int, str]] = []

        def clean(host: Host = host, left: list[tuple[int, str]] = left) -> bool:
            left[:] = slurm.job_processes(host)
            return not left

        try:
            slurm.wait_for(clean, f"{host.name} clean", 30)
        except ClusterError:
            raise AssertionError(f"left on {host.name}: {left}") from None


def stop_warm(cluster: Cluster, hosts: Sequence[int]) -> None:
    """End the warm interpreters on these hosts, by pid, and forget them."""
    for i in hosts:
        for pid, _ in warm_processes(cluster, i):
            cluster.exec_on(i, ["kill", "-KILL", str(pid)])
        wait_for(lambda i=i: not warm_processes(cluster, i), 10, f"node{i}'s warm interpreters")
        subprocess.run(["rm", "-rf", str(cluster.home(i) / ".orch" / "warm")], check=True)


def two_and_one_inventory(cluster: Cluster, tmp_path: Path) -> Path:
    """An inventory of node1 with 2 slots and node2 with 1 (`test_warm`, `test_stack`)."""
    return cluster.write_inventory(tmp_path / "two_and_one.yaml", [1, 2], node1={"slots": 2})


# ---------------------------------------------------------------- orch ui in a browser


def chromium() -> str:
    """Debian's Chromium, for Playwright to drive (it downloads no browser of its own)."""
    if importlib.util.find_spec("playwright") is None:
        skip_or_fail("no playwright (make setup installs it: the dev extra)")
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        skip_or_fail("no chromium (Debian's package: make test-deps installs it)")
    assert found is not None
    return found


class UiProcess:
    """`orch ui` started as a controller would, in a session of its own: `url` is the
    address it prints (token included), `base` without the token."""

    def __init__(self, orch: OrchRunner, inventory: Path) -> None:
        self.proc = subprocess.Popen(
            [*orch_command(), "ui", "--no-browser", "-i", inventory.name],
            cwd=inventory.parent,
            env=orch.controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        assert self.url.startswith("http://127.0.0.1:"), self.proc.stderr
        self.base, _, query = self.url.partition("/?")
        self.token = query.removeprefix("token=")

    def stop(self) -> tuple[int, str]:
        """Ctrl-C, as the user stops it: its exit code and stderr."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError("orch ui did not stop on Ctrl-C") from None
        return self.proc.returncode, err
