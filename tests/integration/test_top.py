"""`orch top` on the test cluster: a 2-node job whose rank 0 prints
fast and rank 1 slowly, watched with `--once --json`, then live in a terminal while
rank 1 falls silent; then the errors for a job that ended and one that never was."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner, orch_command
from tests.support import assert_no_job_left, job_id_of, wait_for, write_workdir_job

pytestmark = pytest.mark.cluster

# No torch import: a rank is up in a moment. Rank 0 prints ~100 lines/s, rank 1 two a
# second until the file named by its second argument exists, then nothing; each burns a
# little CPU per line, so that both show some.
RANKS = """\
import os, sys, time
rank = int(os.environ["RANK"])
end = time.monotonic() + float(sys.argv[1])
i = 0
while time.monotonic() < end:
    if rank == 0 or not os.path.exists(sys.argv[2]):
        print(f"r{rank} {i}", flush=True)
    i += 1
    spin = time.perf_counter() + (0.002 if rank == 0 else 0.02)
    while time.perf_counter() < spin:
        pass
    time.sleep(0.008 if rank == 0 else 0.5)
"""
# A stand-in nvidia-smi, on node2's PATH only (the inventory's env for it): one GPU at
# 55%, and every rank of the node on it, as the agent (which runs it in the node's job
# directory) reads them from logs/rank-N.pid.
FAKE_SMI = """\
#!/bin/sh
case "$1" in
  --query-gpu=*) echo "0, GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0, 55, 20480, 81559" ;;
  --query-compute-apps=*)
    for f in logs/rank-*.pid; do
      read -r pid rest < "$f"
      echo "$pid, GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0, 20470"
    done ;;
esac
"""
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_top_shows_every_rank_and_marks_the_slow_node_behind(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "ranks.py").write_text(RANKS)
    fake_bin = tmp_path / "bin"  # the hosts see this machine's /tmp: only /root is theirs
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text(FAKE_SMI)
    (fake_bin / "nvidia-smi").chmod(0o755)
    inventory = cluster.write_inventory(
        tmp_path / "inv.yaml", hosts=[1, 2], node2={"env": {"PATH": f"{fake_bin}:{HOST_PATH}"}}
    )
    hush = tmp_path / "hush"
    job = write_workdir_job(tmp_path, work, "ranks.py", name="top", nodes=2, args=["60", str(hush)])
    submitted = orch("submit", "-d", job, "-i", inventory, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = job_id_of(submitted.stdout)
    try:
        logs = [cluster.home(i) / ".orch" / "jobs" / job_id / f"node{i}" / "logs" for i in (1, 2)]
        wait_for(
            lambda: all((d / f"rank-{r}.log").exists() for r, d in enumerate(logs)),
            20,
            "both ranks' first lines",
        )
        watched = orch("top", job_id, "--once", "--json", "--interval", "2", timeout=60)
        assert watched.returncode == 0, watched.stderr
        view = json.loads(watched.stdout)
        assert view["job"] == job_id and view["state"] == "running"
        assert [n["host"] for n in view["nodes"]] == ["node1", "node2"]
        ranks = {r["rank"]: (n["host"], r) for n in view["nodes"] for r in n["ranks"]}
        assert sorted(ranks) == [0, 1]
        for host, r in ranks.values():
            assert r["cpu_percent"] > 0 and r["rss_bytes"] > 0, (host, r)
            assert r["lines_per_s"] is not None and r["idle_s"] is not None, (host, r)
            assert r["idle_s"] < 5, "both still print"
            assert r["pids"], "the rank's own processes, found on its host"
        fast, slow = ranks[0][1], ranks[1][1]
        assert fast["lines_per_s"] > 20 > slow["lines_per_s"] > 0
        assert view["behind"] == ["node2"], view["behind"]
        assert "lines/s" in view["nodes"][1]["behind"]
        assert view["nodes"][0]["behind"] is None
        assert view["nodes"][0]["gpus"] is None, "no nvidia-smi on node1: null"
        (gpu,) = view["nodes"][1]["gpus"]
        assert (gpu["index"], gpu["utilization_percent"], gpu["ranks"]) == (0, 55, [1])
        assert (slow["gpus"], slow["gpu_memory_mib"]) == ([0], 20470)
        assert (fast["gpus"], fast["gpu_memory_mib"]) == ([], 0)
        if shutil.which("tmux"):
            assert_live_view_in_a_terminal(orch, job_id, tmp_path, hush)
    finally:
        killed = orch("kill", job_id, timeout=60)
    assert killed.returncode == 0, killed.stderr
    assert_no_job_left(cluster, [1, 2])
    ended = orch("top", job_id, "--once", "--json", timeout=30)
    assert ended.returncode == 2, ended.stderr
    assert f"error: job {job_id} has ended (killed)" in ended.stderr
    assert f"hint: what it printed: orch logs {job_id}" in ended.stderr
    assert ended.stdout == ""
    unknown = orch("top", "nosuch-job", timeout=30)
    assert unknown.returncode == 2
    assert "error: unknown job id 'nosuch-job'" in unknown.stderr
    assert "Traceback" not in ended.stderr + unknown.stderr


def assert_live_view_in_a_terminal(
    orch: OrchRunner, job_id: str, tmp_path: Path, hush: Path
) -> None:
    """`orch top` in a tmux pane: the table refreshes in place; once rank 1, seen
    printing, falls silent, node2 is marked behind for its silence."""
    socket = tmp_path / "tmux.sock"
    env = orch.controller.env()
    command = shlex.join([*orch_command(), "top", job_id, "--interval", "1", "--silent-after", "3"])
    wanted = ("HOME", "ORCH_HOME", "ORCH_KNOWN_HOSTS", "PATH")
    exports = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items() if k in wanted)
    tmux = ["tmux", "-S", str(socket)]
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", "150", "-y", "20", f"env {exports} {command}"],
        check=True,
        timeout=10,
    )
    try:
        screen = ""

        def shows(text: str) -> bool:
            nonlocal screen
            done = subprocess.run(
                [*tmux, "capture-pane", "-p"], capture_output=True, text=True, timeout=10
            )
            screen = done.stdout
            return text in screen

        try:
            wait_for(lambda: shows("behind: node2"), 15, "node2 behind, slower", poll=0.3)
            for cell in ("node1", "node2", "r0", "r1", "lines/s", "(others:", "0:55%"):
                assert cell in screen
            hush.touch()
            wait_for(lambda: shows("r1 silent for"), 15, "rank 1 marked silent", poll=0.3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the terminal shows:\n{screen}") from None
        assert screen.count(f"job {job_id}") == 1, "redrawn in place, not printed again"
    finally:
        subprocess.run([*tmux, "kill-server"], timeout=10, check=False)
