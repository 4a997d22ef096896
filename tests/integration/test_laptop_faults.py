"""The laptop's own faults never end a job (issue 18): the controller paused, or cut
off the cluster, comes back and follows on, every line exactly once; a host that
really went away is still found out."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import (
    assert_no_job_left,
    job_processes,
    start_attached,
    status_json,
    wait_for,
    write_job,
)

pytestmark = pytest.mark.cluster

LINE = re.compile(r"^\[node\d r(\d+)\] r(\d+) (\d+)$", re.M)


def start_numbered(
    orch: OrchRunner, tmp_path: Path, inventory: Path, lines: int
) -> subprocess.Popen[str]:
    """An attached submit of 3 nodes whose ranks print a numbered line every 0.5 s."""
    job = write_job(
        tmp_path,
        "workload",
        "workload.py",
        nodes=3,
        args=["--lines", str(lines), "--interval", "0.5"],
    )
    return start_attached(orch, job, inventory)


def wait_running(cluster: Cluster) -> None:
    wait_for(
        lambda: all(
            any("workload.py" in c for _, c in job_processes(cluster, i)) for i in (1, 2, 3)
        ),
        90,
        "every node's ranks to run",
    )
    time.sleep(3)  # a few lines out


def assert_every_line_once(out: str, lines: int) -> None:
    seen = Counter((int(m[2]), int(m[3])) for m in LINE.finditer(out))
    expected = Counter({(rank, i): 1 for rank in range(3) for i in range(lines)})
    assert seen == expected, (
        f"missing {sorted(expected - seen)[:10]}, doubled {sorted(seen - expected)[:10]}"
    )


def test_paused_controller_resumes_and_the_job_succeeds(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    proc = start_numbered(orch, tmp_path, inventory, 76)
    wait_running(cluster)
    os.kill(proc.pid, signal.SIGSTOP)  # a closed lid, Ctrl-Z
    try:
        time.sleep(30)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "lost node" not in err and "failed" not in err
    assert "did not run for 3" in err  # said once, so the user knows what happened
    assert_every_line_once(out, 76)
    assert_no_job_left(cluster, [1, 2, 3])


@pytest.mark.parametrize("outage_s, lines", [(20, 56), (60, 136)])
def test_network_here_down_then_back_and_the_job_succeeds(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path, outage_s: int, lines: int
) -> None:
    proc = start_numbered(orch, tmp_path, inventory, lines)
    wait_running(cluster)
    cluster.cut_controller()
    try:
        time.sleep(outage_s)
    finally:
        cluster.reconnect_controller()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert err.count("lost contact with every host (the network here?)") == 1, err
    assert "in contact with every host again" in err
    assert "lost node" not in err
    assert_every_line_once(out, lines)
    assert_no_job_left(cluster, [1, 2, 3])


def test_closing_the_terminal_leaves_the_job_running(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    proc = start_numbered(orch, tmp_path, inventory, 600)
    assert proc.stdout is not None
    job_id = proc.stdout.readline().split()[1]
    wait_running(cluster)
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGHUP
    status = status_json(orch, job_id)
    assert status["state"] == "running", status
    assert all(any("workload.py" in c for _, c in job_processes(cluster, i)) for i in (1, 2, 3))
    assert orch("kill", job_id, timeout=60).returncode == 0
    assert_no_job_left(cluster, [1, 2, 3])


def test_a_follow_stream_fed_garbage_ends_in_a_lost_node_never_a_hang(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    """A shell rc file that prints is harmless; a record the controller cannot read
    makes the node lost, with the reason, at once."""
    bashrc = cluster.home(2) / ".bashrc"
    job = write_job(tmp_path, "workload", "workload.py", nodes=3, args=["--lines", "3"])
    try:
        bashrc.write_text("echo '[1, 2]'\necho 'hello from .bashrc'\n")
        chatty = orch("submit", job, "-i", inventory, timeout=120)
        assert chatty.returncode == 0, chatty.stderr
        assert "[node2 r1] r1 2" in chatty.stdout
        # A data record whose bytes are no zlib stream, before every command's output.
        bashrc.write_text(  # only before the follow stream: other commands must work
            'case "$BASH_EXECUTION_STRING" in *" follow "*)\n'
            """  printf '%s\\n' '{"k": "data", "s": "rank-1", "o": 0, "n": 4, "z": 2}'; printf zz;;\n"""
            "esac\n"
        )
        started = time.monotonic()
        broken = orch("submit", job, "-i", inventory, timeout=120)
        assert broken.returncode == 1, broken.stderr
        assert "lost node node2 (following node2 failed: " in broken.stderr, broken.stderr
        assert time.monotonic() - started < 60
    finally:
        bashrc.unlink(missing_ok=True)
    assert_no_job_left(cluster, [1, 2, 3])
