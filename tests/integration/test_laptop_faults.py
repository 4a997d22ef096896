"""The laptop's own faults never end a job: the controller paused, or cut
off the cluster, comes back and follows on, every line exactly once; a host that
really went away is still found out."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner
from tests.support import (
    Lines,
    assert_no_job_left,
    job_processes,
    start_attached,
    status_json,
    write_job,
)

pytestmark = pytest.mark.cluster

LINE = re.compile(r"^\[node\d r(\d+)\] r(\d+) (\d+)$", re.M)


class Numbered:
    """An attached submit of 3 nodes whose ranks print a numbered line every 0.5 s,
    its stdout and stderr read as they come."""

    def __init__(self, orch: OrchRunner, tmp_path: Path, inventory: Path, lines: int) -> None:
        self.lines = lines
        job = write_job(
            tmp_path,
            "workload",
            "workload.py",
            nodes=3,
            args=["--plain", "--lines", str(lines), "--interval", "0.5"],
        )
        self.proc = start_attached(orch, job, inventory)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.out, self.err = Lines(self.proc.stdout), Lines(self.proc.stderr)

    def wait_flowing(self) -> None:
        """Until every rank's lines come: the job is past its rendezvous (which this
        machine's outage would hold up too: the bridge carries the hosts' traffic)."""
        for rank in range(3):
            self.out.wait_for(f"] r{rank} 1\n", 90)

    def finish(self) -> tuple[str, str]:
        """Its exit 0, and every line once; stdout and stderr."""
        assert self.proc.wait(timeout=180) == 0, self.err.text()
        out = self.out.text()
        seen = Counter((int(m[2]), int(m[3])) for m in LINE.finditer(out))
        expected = Counter({(rank, i): 1 for rank in range(3) for i in range(self.lines)})
        assert seen == expected, (
            f"missing {sorted(expected - seen)[:10]}, doubled {sorted(seen - expected)[:10]}"
        )
        return out, self.err.text()


def test_paused_controller_resumes_and_the_job_succeeds(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = Numbered(orch, tmp_path, inventory, 70)
    job.wait_flowing()
    os.kill(job.proc.pid, signal.SIGSTOP)  # a closed lid, Ctrl-Z
    try:
        time.sleep(30)
    finally:
        os.kill(job.proc.pid, signal.SIGCONT)
    _, err = job.finish()
    assert "lost node" not in err and "failed" not in err
    assert "did not run for 3" in err  # said once, so the user knows what happened
    assert_no_job_left(cluster, [1, 2, 3])


def test_network_here_down_20_s_then_60_s_and_the_job_succeeds(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    """Two outages of this machine's network in one job (one job start is 15 s of the
    suite's time): 20 s, back for 8 s, then 60 s."""
    job = Numbered(orch, tmp_path, inventory, 190)
    job.wait_flowing()
    for outage_s in (20, 60):
        cluster.cut_controller()
        try:
            time.sleep(outage_s)
        finally:
            cluster.reconnect_controller()
        back = time.monotonic()
        assert job.err.wait_for("in contact with every host again", 30) - back < 10
        assert job.err.text(0).count("lost contact with every host (the network here?)") == 1
        job.err.lines.clear()
        time.sleep(4)
    _, err = job.finish()
    assert "lost node" not in err
    assert_no_job_left(cluster, [1, 2, 3])


def test_closing_the_terminal_leaves_the_job_running(
    cluster: Cluster, orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    job = Numbered(orch, tmp_path, inventory, 600)
    job.wait_flowing()
    job.proc.send_signal(signal.SIGHUP)
    assert job.proc.wait(timeout=30) == -signal.SIGHUP
    job_id = job.out.lines[0].split()[1]
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
    job = write_job(tmp_path, "workload", "workload.py", nodes=3, args=["--plain", "--lines", "3"])
    try:
        # Chatter before every command's output (probe, push, start, follow: each
        # reads past it), then, before the follow stream only, a data record whose
        # bytes are no zlib stream.
        bashrc.write_text(
            "echo '[1, 2]'\necho 'hello from .bashrc'\n"
            'case "$BASH_EXECUTION_STRING" in *" follow "*)\n'
            """  printf '%s\\n' '{"k": "data", "s": "rank-1", "o": 0, "n": 4, "z": 2}'; printf zz;;\n"""
            "esac\n"
        )
        started = time.monotonic()
        broken = orch("submit", job, "-i", inventory, timeout=120)
        assert broken.returncode == 1, broken.stderr
        assert "lost node node2 (following node2 failed: zlib error" in broken.stderr, broken.stderr
        assert time.monotonic() - started < 60
    finally:
        bashrc.unlink(missing_ok=True)
    assert_no_job_left(cluster, [1, 2, 3])
