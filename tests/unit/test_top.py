"""`orch top`: nvidia-smi's output read, a node's real processes and logs sampled by the
agent, rates between two samples, who falls behind, and the JSON shape scripts rely on.

The agent tests run `agent.top.sample()` in a real job directory with real rank
processes (each in a session of its own, as torchrun starts them) and, for the GPU
path, a stand-in `nvidia-smi` script on the node's PATH that prints the CSV shapes
the real one does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.host import nvidia, proc
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.kernel.replies import TopSample, WarmRow
from orchestrator.agent.node import top as agent_top
from orchestrator.models.inventory import Host
from orchestrator.records.db import NodeRecord
from orchestrator.reporting import top_rates
from orchestrator.reporting.top import GpuView, NodeView, RankView, TopView

# What `nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,memory.total
# --format=csv,noheader,nounits` prints: ", " between cells, no units; a MIG-enabled
# GPU reports its utilization as [N/A]; some boards have no memory figures.
SMI_GPUS = """\
0, GPU-8f6b1c2d-4e3a-5b7c-9d0e-1f2a3b4c5d6e, 97, 40536, 81559
1, GPU-1a2b3c4d-5e6f-7a8b-9c0d-e1f2a3b4c5d6, 0, 4, 81559
2, GPU-99aa88bb-77cc-66dd-55ee-44ff33aa22bb, [N/A], 30112, 81559
3, GPU-0badc0de-0000-1111-2222-333344445555, [Not Supported], [N/A], [N/A]
"""
# `--query-compute-apps=pid,gpu_uuid,used_memory`: one row per process and GPU.
SMI_APPS = """\
81234, GPU-8f6b1c2d-4e3a-5b7c-9d0e-1f2a3b4c5d6e, 40530
81240, GPU-99aa88bb-77cc-66dd-55ee-44ff33aa22bb, 30106
81240, GPU-8f6b1c2d-4e3a-5b7c-9d0e-1f2a3b4c5d6e, [N/A]
"""


# ---------------------------------------------------------------- nvidia-smi


def test_gpu_rows_are_read_with_unavailable_values_as_none() -> None:
    gpus = agent_top.parse_gpus(SMI_GPUS)
    assert [(g["index"], g["utilization_percent"], g["memory_used_mib"]) for g in gpus] == [
        (0, 97, 40536),
        (1, 0, 4),
        (2, None, 30112),
        (3, None, None),
    ]
    assert gpus[0]["uuid"] == "GPU-8f6b1c2d-4e3a-5b7c-9d0e-1f2a3b4c5d6e"
    assert gpus[3]["memory_total_mib"] is None


def test_lines_that_are_not_gpu_rows_are_skipped() -> None:
    text = "WARNING: infoROM is corrupted at gpu 0000:00:04.0\n" + SMI_GPUS + "\n"
    assert len(agent_top.parse_gpus(text)) == 4
    assert agent_top.parse_gpus("No devices were found\n") == []


def test_compute_apps_rows_and_no_processes_at_all() -> None:
    apps = nvidia.processes(SMI_APPS)
    assert [(a["pid"], a["used_memory_mib"]) for a in apps] == [
        (81234, 40530),
        (81240, 30106),
        (81240, None),
    ]
    assert nvidia.processes("") == []


# ---------------------------------------------------------------- the agent, on real processes

RANK_SCRIPT = """
import os, sys, time
log = open(sys.argv[1], "ab", buffering=0)
junk = bytearray(32 << 20)  # resident: every page touched
for i in range(0, len(junk), 4096):
    junk[i] = 1
while time.process_time() < 0.4:  # CPU time, however busy the machine
    pass
log.write(b"ready\\n")
sys.stdin.read()  # until the test closes it
"""


class Node:
    """A job directory as a node's looks, with rank processes started in it."""

    def __init__(self, root: Path, job_id: str) -> None:
        self.dir = root
        self.job_id = job_id
        self.logs = root / "logs"
        self.logs.mkdir(parents=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.write_spec({})

    def write_spec(self, env: dict[str, str], argv: list[str] | None = None) -> None:
        spec = {"argv": argv or ["torchrun"], "env": {"ORCH_JOB_ID": self.job_id, **env}}
        (self.dir / "node.json").write_text(json.dumps(spec))

    def start_rank(self, rank: int, env: dict[str, str] | None = None) -> int:
        """A rank in a session of its own that records `rank-N.pid` as agent/rank.py
        does, touches 32 MB, burns 0.4 s of CPU, writes one line, then waits."""
        pid_file = self.logs / f"rank-{rank}.pid"
        child = subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, str(self.logs / f"rank-{rank}.log")],
            stdin=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        self.procs.append(child)
        # The pid file holds "PID START_TIME", as the rank entry writes it.
        deadline = time.monotonic() + 10
        while proc.start_time(child.pid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        pid_file.write_text(f"{child.pid} {proc.start_time(child.pid)}")
        return child.pid

    def wait_for_lines(self, rank: int, n: int = 1) -> None:
        log = self.logs / f"rank-{rank}.log"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if log.exists() and log.read_bytes().count(b"\n") >= n:
                return
            time.sleep(0.02)
        raise AssertionError(f"rank {rank} wrote no line")

    def sample(self, offsets: dict[str, int] | None = None) -> dict[str, Any]:
        cwd = os.getcwd()
        os.chdir(self.dir)
        try:
            return agent_top.sample(self.job_id, offsets or {}).as_dict()
        finally:
            os.chdir(cwd)

    def stop(self) -> None:
        for child in self.procs:
            child.kill()
            child.wait()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    started = Node(tmp_path / "job" / "node1", "job-top-1")
    yield started
    started.stop()


def rank_entry(sample: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(r for r in sample["ranks"] if r["rank"] == rank)


def test_a_rank_is_its_process_group_with_its_cpu_and_memory(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid = node.start_rank(0)
    node.wait_for_lines(0)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi to be found
    sample = node.sample()
    entry = rank_entry(sample, 0)
    assert entry["pids"] == [pid]
    assert entry["cpu_s"] >= 0.35, "0.4 s of CPU burnt (counted in 10 ms ticks)"
    assert entry["rss_bytes"] >= 32 << 20
    assert entry["age_s"] is not None and 0 <= entry["age_s"] < 60
    assert (sample["gpus"], sample["gpu_error"]) == (None, None), "no nvidia-smi: null"


def test_a_process_that_left_the_group_counts_by_its_tag_and_rank(node: Node) -> None:
    node.start_rank(0)
    # Started by hand in a session of its own, with the job's tag and RANK=0.
    stray = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "ORCH_JOB_ID": node.job_id, "RANK": "0"},
    )
    other = subprocess.Popen(  # another job's: never counted
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "ORCH_JOB_ID": "someone-else", "RANK": "0"},
    )
    node.procs += [stray, other]
    deadline = time.monotonic() + 10
    while stray.pid not in rank_entry(node.sample(), 0)["pids"] and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = rank_entry(node.sample(), 0)["pids"]
    assert stray.pid in pids and other.pid not in pids


def test_lines_are_counted_from_the_last_offset_only(node: Node) -> None:
    log = node.logs / "rank-3.log"
    log.write_bytes(b"old\n" * 1000)
    first = rank_entry(node.sample(), 3)
    assert first["log"]["lines"] is None, "the first look reads nothing: counting starts"
    assert first["log"]["offset"] == 4000
    with log.open("ab") as f:
        f.write(b"new line\n" * 7 + b"half a li")
    second = rank_entry(node.sample({"3": first["log"]["offset"]}), 3)
    assert second["log"]["lines"] == 7
    assert second["log"]["offset"] == 4000 + 9 * 7 + 9
    assert 0 <= second["log"]["idle_s"] < 30


def test_a_log_shorter_than_its_offset_was_replaced_and_counts_whole(node: Node) -> None:
    (node.logs / "rank-0.log").write_bytes(b"a\nb\n")
    assert rank_entry(node.sample({"0": 10_000}), 0)["log"]["lines"] == 2


def test_a_huge_growth_is_read_in_part_and_extrapolated(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_top, "MAX_COUNT", 1000)
    monkeypatch.setattr(agent_top, "CHUNK", 100)
    (node.logs / "rank-0.log").write_bytes(b"123456789\n" * 10_000)
    growth = rank_entry(node.sample({"0": 0}), 0)["log"]
    assert growth["estimated"] is True
    assert growth["lines"] == 10_000
    assert growth["offset"] == 100_000


def test_gpus_come_from_the_nvidia_smi_on_the_nodes_path(node: Node, tmp_path: Path) -> None:
    pid = node.start_rank(1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    uuid = "GPU-8f6b1c2d-4e3a-5b7c-9d0e-1f2a3b4c5d6e"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-gpu=*) printf '{SMI_GPUS}' ;;\n"
        f"  --query-compute-apps=*) printf '{pid}, {uuid}, 1234\\n81234, {uuid}, 99\\n' ;;\n"
        "esac\n"
    )
    smi.chmod(0o700)
    node.write_spec({"PATH": str(bin_dir)})
    sample = node.sample()
    assert sample["gpu_error"] is None
    assert [g["index"] for g in sample["gpus"]] == [0, 1, 2, 3]
    first = sample["gpus"][0]
    assert first["used"] is True and first["ranks"] == [1]
    assert not any(g["used"] for g in sample["gpus"][1:])
    entry = rank_entry(sample, 1)
    assert entry["gpus"] == [0] and entry["gpu_memory_mib"] == 1234


def test_a_failing_nvidia_smi_says_why_and_the_rest_still_comes(node: Node, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the "
        'NVIDIA driver."\nexit 9\n'
    )
    smi.chmod(0o700)
    node.write_spec({"PATH": str(bin_dir)})
    (node.logs / "rank-0.log").write_bytes(b"x\n")
    sample = node.sample()
    assert sample["gpus"] is None
    assert sample["gpu_error"].startswith("NVIDIA-SMI has failed")
    assert rank_entry(sample, 0)["log"]["offset"] == 2


def test_launcher_python_makes_the_node_itself_the_one_rank(node: Node) -> None:
    node.write_spec({}, argv=["python", "agent/run.py", "rank", "-", "code", "script", "t.py"])
    (node.dir / "torchrun.log").write_bytes(b"epoch 1\n")
    sample = node.sample()
    assert [(r["rank"], r["stream"]) for r in sample["ranks"]] == [(None, "node")]
    assert sample["ranks"][0]["log"]["offset"] == 8


def test_a_missing_job_directory_answers_that_it_does_not_exist(tmp_path: Path) -> None:
    request = json.dumps({"job_id": "x", "offsets": {}})
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from orchestrator.agent.node import top; sys.exit(top.main(sys.argv[1:]))",
            str(tmp_path / "nowhere"),
        ],
        input=request.encode(),
        capture_output=True,
        check=True,
    )
    reply = parse_message(TopSample, json.loads(done.stdout))
    assert reply.exists is False and reply.running is False


def test_the_sample_lists_the_users_warm_interpreters_with_their_memory(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.agent.node.warm import interpreters as warm

    folder = tmp_path / "warm"
    folder.mkdir()
    monkeypatch.setattr(warm, "warm_dir", lambda: str(folder))
    me = os.getpid()
    record = {
        "key": "k1",
        "pid": me,
        "start_time": proc.start_time(me),
        "state": "ready",
        "preload": ["torch"],
        "used": time.time() - 30,
        "idle": 600,
    }
    (folder / "k1.json").write_text(json.dumps(record))
    # Its pid reused by another process: not a warm interpreter any more.
    (folder / "k2.json").write_text(json.dumps({**record, "key": "k2", "start_time": 1}))
    sample = parse_message(TopSample, node.sample())
    (shown,) = sample.warm
    assert (shown.pid, shown.state, list(shown.preload)) == (me, "ready", ["torch"])
    assert shown.pss_kb is not None and shown.pss_kb > 0
    assert shown.idle_s is not None and 29 <= shown.idle_s < 120
    assert not (folder / "k2.json").exists()


# ---------------------------------------------------------------- rates


NODE = NodeRecord(Host(name="node1", address="10.77.0.11"), 0, 0, 2, "~/.orch/jobs/j/node1")


def top_sample(clock: float, ranks: list[dict[str, Any]], **extra: Any) -> TopSample:
    data = {"exists": True, "started": True, "running": True, "clock": clock, "ranks": ranks}
    return parse_message(TopSample, {**data, **extra})


def rank(
    n: int, cpu_s: float, lines: int | None, idle: float = 0.1, age: float = 5.0
) -> dict[str, Any]:
    return {
        "rank": n,
        "stream": str(n),
        "pids": [100 + n],
        "cpu_s": cpu_s,
        "rss_bytes": 1 << 20,
        "age_s": age,
        "log": {"offset": 0, "lines": lines, "estimated": False, "idle_s": idle},
        "gpus": [],
        "gpu_memory_mib": 0,
    }


def test_rates_come_from_two_samples_on_the_hosts_clock() -> None:
    before = top_sample(100.0, [rank(0, 10.0, None), rank(1, 3.0, None)])
    now = top_sample(102.0, [rank(0, 11.5, 400), rank(1, 3.0, 0, idle=12.0)])
    talked: set[tuple[str, str]] = set()
    view = top_rates.node_view(NODE, now, before, talked)
    r0, r1 = view.ranks
    assert view.window_s == 2.0
    assert (r0.cpu_percent, r0.lines_per_s) == (75.0, 200.0)
    assert (r1.cpu_percent, r1.lines_per_s, r1.idle_s) == (0.0, 0.0, 12.0)
    assert talked == {("node1", "0")}, "printing in the window makes a talker"
    assert r0.talks and not r1.talks


WARM_ROW = {"pid": 4242, "key": "k", "state": "ready", "preload": ["torch"], "pss_kb": 307200}


def test_the_view_of_a_node_carries_the_hosts_warm_interpreters() -> None:
    now = top_sample(5.0, [rank(0, 1.0, None)], warm=[{**WARM_ROW, "idle_s": 40.0}])
    (shown,) = top_rates.node_view(NODE, now, None, set()).warm
    assert (shown.pid, shown.pss_kb, shown.idle_s) == (4242, 307200, 40.0)


def test_the_first_sample_has_no_rates_yet() -> None:
    view = top_rates.node_view(NODE, top_sample(5.0, [rank(0, 1.0, None)]), None, set())
    assert view.ranks[0].cpu_percent is None and view.ranks[0].lines_per_s is None


def test_cpu_of_processes_that_ended_never_makes_a_negative_rate() -> None:
    before = top_sample(0.0, [rank(0, 10.0, None)])
    assert (
        top_rates.node_view(NODE, top_sample(1.0, [rank(0, 4.0, 0)]), before, set())
        .ranks[0]
        .cpu_percent
        == 0.0
    )


# ---------------------------------------------------------------- who falls behind


def view_of(
    host: str, n: int, rate: float | None, idle: float | None, talks: bool = True
) -> RankView:
    return RankView(
        host=host,
        rank=n,
        pids=(n,),
        cpu_percent=50.0,
        rss_bytes=1,
        lines=None,
        lines_per_s=rate,
        idle_s=idle,
        age_s=100.0,
        gpus=(),
        gpu_memory_mib=0,
        talks=talks,
    )


def test_a_talker_silent_while_the_others_print_is_behind() -> None:
    ranks = [view_of("node1", 0, 50.0, 0.1), view_of("node2", 1, 0.0, 14.0)]
    assert list(top_rates.laggards(ranks)) == [("node2", 1)]
    assert "silent for 14 s" in top_rates.laggards(ranks)["node2", 1]


def test_a_talker_far_slower_than_the_others_is_behind() -> None:
    ranks = [view_of("a", 0, 200.0, 0.0), view_of("a", 1, 180.0, 0.0), view_of("b", 2, 2.0, 0.4)]
    assert top_rates.laggards(ranks) == {("b", 2): "2 lines/s (others: 190)"}


def test_ranks_that_print_alike_leave_nobody_behind() -> None:
    ranks = [view_of("a", 0, 100.0, 0.0), view_of("b", 1, 80.0, 0.1), view_of("c", 2, 120.0, 0.0)]
    assert top_rates.laggards(ranks) == {}


def test_ranks_that_never_talked_are_never_judged() -> None:
    """Rank 0 alone logs (the common script): the others' silence is their habit."""
    ranks = [view_of("a", 0, 30.0, 0.0)] + [
        view_of("b", n, 0.0, 600.0, talks=False) for n in (1, 2, 3)
    ]
    assert top_rates.laggards(ranks) == {}


def test_all_quiet_together_is_no_laggard() -> None:
    """Every rank silent for a while (an evaluation pass): none is behind the others."""
    ranks = [view_of("a", 0, 0.0, 40.0), view_of("b", 1, 0.0, 42.0)]
    assert top_rates.laggards(ranks) == {}


def test_slow_rates_under_one_line_a_second_are_noise() -> None:
    ranks = [view_of("a", 0, 0.5, 0.5), view_of("b", 1, 0.0, 1.5)]
    assert top_rates.laggards(ranks) == {}


def test_a_node_is_behind_when_one_of_its_ranks_is() -> None:
    nodes = [
        NodeView("node1", 0, "running", (view_of("node1", 0, 50.0, 0.1),)),
        NodeView(
            "node2", 1, "running", (view_of("node2", 1, 40.0, 0.1), view_of("node2", 2, 0.0, 30.0))
        ),
    ]
    judged = top_rates.judged(nodes)
    assert judged[0].behind is None
    assert judged[1].behind is not None and judged[1].behind.startswith("r2 silent")


# ---------------------------------------------------------------- the JSON shape


def test_the_json_shape_is_the_documented_one() -> None:
    gpu = GpuView(0, "GPU-1", 97, 100, 81559, True, (1,))
    nodes = (
        NodeView(
            "node2",
            1,
            "running",
            (view_of("node2", 1, 2.0, 0.1),),
            2.0,
            1.0,
            5,
            (gpu,),
            None,
            warm=(parse_message(WarmRow, {**WARM_ROW, "idle_s": 3.5}),),
        ),
        NodeView("node3", 2, "unreachable", error="connection refused"),
    )
    data = json.loads(json.dumps(TopView("j1", "demo", "running", 1.0, 2.0, nodes).to_json()))
    assert set(data) == {
        "job",
        "name",
        "state",
        "time",
        "interval_s",
        "behind",
        "stall_after",
        "nodes",
    }
    first, second = data["nodes"]
    assert set(first) == {
        "host",
        "node_rank",
        "state",
        "error",
        "behind",
        "idle_s",
        "quiet",
        "window_s",
        "launcher",
        "gpus",
        "gpu_error",
        "warm",
        "ranks",
    }
    assert set(first["ranks"][0]) == {
        "rank",
        "pids",
        "cpu_percent",
        "rss_bytes",
        "lines",
        "lines_per_s",
        "idle_s",
        "age_s",
        "gpus",
        "gpu_memory_mib",
        "talks",
        "behind",
    }
    assert set(first["gpus"][0]) == {
        "index",
        "uuid",
        "utilization_percent",
        "memory_used_mib",
        "memory_total_mib",
        "used",
        "ranks",
    }
    assert first["launcher"] == {"cpu_percent": 1.0, "rss_bytes": 5}
    assert first["warm"] == [
        {"pid": 4242, "state": "ready", "preload": ["torch"], "pss_kb": 307200, "idle_s": 3.5}
    ]
    assert second == {**second, "state": "unreachable", "error": "connection refused", "gpus": None}


# ---------------------------------------------------------------- the live table


def test_the_table_shows_every_rank_gpus_and_who_falls_behind_in_80_columns() -> None:
    from rich.console import Console

    from orchestrator.cli.cmd_top import render

    gpu = GpuView(0, "GPU-1", 55, 20480, 81559, True, (1,))
    nodes = top_rates.judged(
        [
            NodeView(
                "node1",
                0,
                "running",
                (view_of("node1", 0, 97.5, 0.0),),
                2.0,
                0.0,
                1 << 28,
                warm=(parse_message(WarmRow, {**WARM_ROW, "idle_s": 75.0}),),
            ),
            NodeView(
                "node2",
                1,
                "running",
                (replace(view_of("node2", 1, 0.0, 12.0), gpus=(0,)),),
                2.0,
                0.0,
                1 << 28,
                (gpu,),
            ),
            NodeView("node3", 2, "unreachable", error="connection refused"),
        ]
    )
    console = Console(record=True, width=80)
    console.print(render(TopView("j1", "demo", "running", 0.0, 2.0, nodes)))
    text = console.export_text()
    assert "behind: node2 r1 silent for 12 s (others: 0 s)" in text
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith(" node2"))
    assert "0:55% 0/80G" in row and "◀ behind" in row and "12.0s" in row
    assert "node3: connection refused" in [line.rstrip() for line in lines]
    warm_row = next(line for line in lines if " warm " in line)
    assert "300M" in warm_row and "1m15s" in warm_row and "pid 4242" in warm_row
    assert all(len(line) <= 80 for line in lines)
