"""`orch stack`'s parts that need no cluster: how a rank's start makes its stack
readable under each Yama ptrace scope (this machine has no Yama: the prctl call and
the choice are tested here, the cluster tests run the ptrace and faulthandler ways
for real), the host's `stack` command on real rank processes started through the
agent's own `rank` entry, the grouping and its text, the kept dumps, and the CLI's
errors."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.host import proc
from orchestrator.agent.kernel.replies import RankStack, StackReply
from orchestrator.agent.kernel.requests import StackRequest
from orchestrator.agent.node import stack as agent_stack
from orchestrator.agent.node import traceable
from orchestrator.records import stacks as kept
from orchestrator.reporting import stacks
from tests.unit.conftest import Orch

REPO = Path(__file__).resolve().parents[2]
PYSPY = Path(sys.executable).parent / "py-spy"

# ---------------------------------------------------------------- the choice per scope


def test_without_yama_or_at_scope_0_ranks_are_read_with_ptrace_and_nothing_is_asked() -> None:
    def never() -> str | None:
        raise AssertionError("no prctl is needed")

    for scope in (None, 0):
        assert traceable.decide(scope, None, never)["way"] == traceable.PTRACE


def test_at_scope_1_the_rank_allows_its_users_tracers_and_keeps_ptrace() -> None:
    asked = []

    def allow() -> str | None:
        asked.append(True)
        return None

    record = traceable.decide(1, None, allow)
    assert asked and record["way"] == traceable.PTRACE and record["scope"] == 1
    assert "PR_SET_PTRACER_ANY" in str(record["why"])


def test_at_scope_1_a_failing_prctl_falls_back_to_faulthandler_saying_why() -> None:
    record = traceable.decide(1, None, lambda: "prctl(PR_SET_PTRACER): Invalid argument")
    assert record["way"] == traceable.FAULTHANDLER
    assert record["why"] == "prctl(PR_SET_PTRACER): Invalid argument"


@pytest.mark.parametrize(("scope", "said"), [(2, "only root"), (3, "no process")])
def test_scopes_2_and_3_leave_only_faulthandler(scope: int, said: str) -> None:
    record = traceable.decide(scope, None, lambda: None)
    assert record["way"] == traceable.FAULTHANDLER
    assert f"ptrace_scope is {scope}" in str(record["why"]) and said in str(record["why"])


def test_the_jobs_env_can_ask_for_faulthandler_whatever_the_scope() -> None:
    record = traceable.decide(0, "faulthandler", lambda: None)
    assert record["way"] == traceable.FAULTHANDLER and "ORCH_STACKS" in str(record["why"])


def test_the_prctl_is_yamas_set_ptracer_any(monkeypatch: pytest.MonkeyPatch) -> None:
    import ctypes

    calls: list[tuple[int, ...]] = []

    class Libc:
        def prctl(self, *args: Any) -> int:
            calls.append(tuple(a.value for a in args))
            return 0

    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: Libc())
    assert traceable.allow_tracing() is None
    assert calls == [(0x59616D61, 2**64 - 1, 0, 0, 0)]  # PR_SET_PTRACER, PR_SET_PTRACER_ANY


def test_the_real_prctl_answers_without_raising() -> None:
    said = traceable.allow_tracing()  # no Yama here: EINVAL; with Yama: done
    assert said is None or said.startswith("prctl")


def test_the_scope_is_read_from_yamas_file(tmp_path: Path) -> None:
    (tmp_path / "scope").write_text("1\n")
    assert traceable.yama_scope(str(tmp_path / "scope")) == 1
    assert traceable.yama_scope(str(tmp_path / "absent")) is None


def test_a_cold_rank_starts_through_boot_only_where_faulthandler_is_the_way() -> None:
    plain = traceable.boot_argv("py", {"way": "ptrace"}, ["train.py", "--lr", "1"])
    assert plain == ["py", "-u", "train.py", "--lr", "1"]
    record = {"way": "faulthandler", "signal": 37, "faults": "/j/logs/rank-0.faults"}
    booted = traceable.boot_argv("py", record, ["-m", "pkg.train", "x"])
    assert booted[:3] == ["py", "-u", "-c"] and booted[3] == traceable.BOOT
    assert booted[4:] == ["/j/logs/rank-0.faults", "37", "module", "pkg.train", "x"]


# ---------------------------------------------------------------- real ranks, read here

TRAIN = """\
import os, sys, threading, time
def load_batch():
    time.sleep(120)
def wait_peers():
    time.sleep(120)
def step():
    if os.environ["RANK"] == "1":
        load_batch()
    else:
        wait_peers()
print("argv", sys.argv[1:], "main", __name__, "path0", os.path.basename(sys.path[0]), flush=True)
threading.Thread(target=time.sleep, args=(120,), name="loader", daemon=True).start()
print("stepping", flush=True); step()
"""


class Node:
    """A node's job directory with ranks started through the agent's `rank` entry, as
    torchrun starts them (each in a session of its own)."""

    def __init__(self, root: Path) -> None:
        self.dir = root
        (root / "code").mkdir(parents=True)
        (root / "code" / "train.py").write_text(TRAIN)
        (root / "node.json").write_text(json.dumps({"argv": ["torchrun"], "env": {}}))
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, rank: int, env: dict[str, str] | None = None) -> int:
        entry = (
            "import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from orchestrator.agent.main import main; sys.exit(main(sys.argv[1:]))"
        )
        argv = [sys.executable, "-c", entry, str(REPO), "rank", "logs", "code", "script"]
        child = subprocess.Popen(
            [*argv, "train.py", "--", "--lr", "0.1"],
            cwd=self.dir,
            env={**os.environ, "RANK": str(rank), **(env or {})},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.procs.append(child)
        log = self.dir / "logs" / f"rank-{rank}.log"
        deadline = time.monotonic() + 20
        # Its thread started and its main thread on the line that steps (one line, so
        # the frames keep their numbers): a machine under load may take its time there.
        while not (log.exists() and b"stepping\n" in log.read_bytes()):
            assert time.monotonic() < deadline, f"rank {rank} never printed"
            time.sleep(0.02)
        return child.pid

    def take(self, tools: Path | None = None, **asked: Any) -> StackReply:
        request = StackRequest(taken="t1", **asked)
        if tools is not None:
            sha = tools.name.rpartition("-")[2]
            request = StackRequest(
                taken="t1", tools_dir=str(tools.parent), pyspy={os.uname().machine: sha}, **asked
            )
        cwd = os.getcwd()
        try:
            return agent_stack.take(str(self.dir), request)
        finally:
            os.chdir(cwd)

    def stop(self) -> None:
        for child in self.procs:
            child.kill()
            child.wait()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    started = Node(tmp_path / "jobs" / "j-1" / "node1")
    yield started
    started.stop()


@pytest.fixture
def carried(tmp_path: Path) -> Path:
    """py-spy as a host keeps it: under its hash, in a directory only the user writes."""
    import hashlib

    if not PYSPY.is_file():
        pytest.skip("no py-spy beside this Python (make setup installs it)")
    sha = hashlib.sha256(PYSPY.read_bytes()).hexdigest()
    folder = tmp_path / "tools"
    folder.mkdir(mode=0o700)
    path = folder / f"py-spy-{sha[:16]}"
    path.write_bytes(PYSPY.read_bytes())
    path.chmod(0o700)
    return folder / f"py-spy-{sha}"  # the name carries the full hash: take() splits it


def frames_of(rank: RankStack) -> list[tuple[str, int]]:
    dump = stacks.rank_dump("node1", rank, None)
    assert dump.main is not None
    return [(f.function, f.line) for f in dump.main.frames]


def test_ranks_are_read_with_py_spy_each_at_its_own_line(node: Node, carried: Path) -> None:
    node.start(0)
    node.start(1)
    reply = node.take(carried)
    by_rank = {r.rank: r for r in reply.ranks}
    assert sorted(by_rank) == [0, 1]
    assert all(r.via == "py-spy" and r.error is None for r in reply.ranks), reply.ranks
    assert frames_of(by_rank[0])[:2] == [("wait_peers", 5), ("step", 10)]
    assert frames_of(by_rank[1])[:2] == [("load_batch", 3), ("step", 8)]
    names = {t["name"] for t in by_rank[1].threads}
    assert "loader" in names, "every thread of the rank, not only its main one"
    record = json.loads((node.dir / "logs" / "rank-0.trace").read_text())
    assert record["way"] == "ptrace"
    saved = node.dir / "stacks" / "t1.json"
    assert json.loads(saved.read_text())["ranks"][0]["via"] == "py-spy"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600


def test_a_host_without_the_carried_py_spy_asks_for_it(node: Node, tmp_path: Path) -> None:
    node.start(0)
    sha = "ab" * 32
    request = StackRequest(
        tools_dir=str(tmp_path / "none"), pyspy={os.uname().machine: sha}, taken="t"
    )
    cwd = os.getcwd()
    try:
        reply = agent_stack.take(str(node.dir), request)
    finally:
        os.chdir(cwd)
    assert reply.need_tool == sha and not reply.ranks


def test_the_faulthandler_way_reads_a_cold_rank_started_through_boot(
    node: Node, carried: Path
) -> None:
    pid = node.start(1, {"ORCH_STACKS": "faulthandler"})
    out = (node.dir / "logs" / "rank-1.log").read_text()
    assert "argv ['--lr', '0.1'] main __main__ path0 code" in out, "as `python train.py`"
    want = [("load_batch", 3), ("step", 8), ("<module>", 13)]
    deadline = time.monotonic() + 10  # from "stepping" to the sleep: a few bytecodes
    while True:
        reply = node.take(carried)  # py-spy is there, but the rank's start chose faulthandler
        (rank,) = reply.ranks
        if frames_of(rank) == want or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rank.via == "faulthandler" and rank.pid == pid, rank
    assert frames_of(rank) == want
    assert len(rank.threads) == 2, "every thread"
    again = node.take()  # and again: only what the second signal wrote is read
    assert frames_of(again.ranks[0]) == frames_of(rank)
    assert proc.alive(pid), "the signal printed the stack and nothing else"


def test_native_frames_through_faulthandler_say_they_need_py_spy(node: Node) -> None:
    node.start(0, {"ORCH_STACKS": "faulthandler"})
    (rank,) = node.take(native=True).ranks
    assert rank.via == "faulthandler" and rank.hint and "native frames need py-spy" in rank.hint


def test_a_rank_without_any_way_says_why_and_the_others_are_read(node: Node, carried: Path) -> None:
    node.start(0)
    node.start(1, {"ORCH_STACKS": "faulthandler"})
    by_rank = {r.rank: r for r in node.take().ranks}  # no py-spy on this "host"
    assert by_rank[0].error and "no py-spy for this host" in by_rank[0].error
    assert by_rank[0].hint and "ORCH_STACKS" in by_rank[0].hint
    assert by_rank[1].via == "faulthandler"


def test_a_rank_that_ended_is_reported_as_ended_not_as_an_error(node: Node, carried: Path) -> None:
    node.start(0)
    node.start(1)
    pid = int((node.dir / "logs" / "rank-1.pid").read_text().split()[0])
    node.procs[1].kill()
    node.procs[1].wait()
    # Gone between the listing and the read: py-spy fails on it, and that is no error.
    tool = str(next(carried.parent.iterdir()))
    gone = agent_stack.read_rank(1, pid, tool, False, 5)
    assert gone.ended and gone.error == "ended", gone
    assert [r.rank for r in node.take(carried).ranks] == [0], "an ended rank is not listed"


def test_a_process_without_the_handler_is_never_sent_the_signal() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.3)
        assert not agent_stack.catches(sleeper.pid, traceable.stack_signal())
        assert agent_stack.catches(sleeper.pid, signal.SIGINT), "Python catches SIGINT"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_tool_is_run_to_its_end_with_both_its_outputs_and_its_status() -> None:
    """What subprocess.run gave the agent: both streams whole (more than a pipe holds,
    written at once), the exit status, a signal's as negative, stdin empty."""
    script = (
        "import os, sys; sys.stdout.write(sys.stdin.read() + 'o' * 200000); "
        "sys.stderr.write('e' * 200000); sys.stdout.flush(); sys.stderr.flush(); "
        "sys.exit(int(sys.argv[1])) if sys.argv[1] != 'kill' else os.kill(os.getpid(), 9)"
    )
    code, out, err = agent_stack.capture([sys.executable, "-c", script, "3"], 20)
    assert (code, out, err) == (3, b"o" * 200000, b"e" * 200000)
    code, _, _ = agent_stack.capture([sys.executable, "-c", script, "kill"], 20)
    assert code == -signal.SIGKILL


def test_a_tool_past_its_time_is_killed_and_one_that_cannot_start_says_why(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    marker = tmp_path / "pid"
    script = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with pytest.raises(agent_stack.TimedOut):
        agent_stack.capture([sys.executable, "-c", script], 1.0)
    assert time.monotonic() - started < 10
    assert not proc.alive(int(marker.read_text())), "killed, and reaped"
    with pytest.raises(FileNotFoundError):
        agent_stack.capture([str(tmp_path / "no-such-tool"), "dump"], 5)


def test_faulthandlers_text_is_read_into_threads() -> None:
    text = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        "\n"
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/code/train.py", line 40 in load_batch\n'
        '  File "/code/train.py", line 42 in step\n'
    )
    first, second = agent_stack.faulthandler_threads(text)
    assert first["frames"] == [
        {"function": "wait", "file": "/usr/lib/python3.11/threading.py", "line": 320}
    ]
    assert second["active"] and [f["line"] for f in second["frames"]] == [40, 42]


# ---------------------------------------------------------------- grouping and text


def rank(host: str, number: int, *frames: tuple[str, str, int], **more: Any) -> RankStack:
    threads = [
        {
            "id": 1,
            "name": "MainThread",
            "active": True,
            "frames": [{"function": f, "file": p, "line": n} for f, p, n in frames],
        }
    ]
    return RankStack(rank=number, pid=100 + number, via="py-spy", threads=threads, **more)


SITE = "/venv/lib/python3.11/site-packages"
WAITING = (
    ("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 2850),
    ("wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
    ("step", "/home/a/.orch/jobs/j/code/train.py", 42),
    ("<module>", "/home/a/.orch/jobs/j/code/train.py", 51),
    ("_run_code", "<frozen runpy>", 88),
    ("<module>", "<string>", 9),
)
SLEEPING = (
    ("sleep", "/usr/lib/python3.11/threading.py", 10),
    ("load_batch", "/home/a/.orch/jobs/j/code/train.py", 40),
    ("<module>", "/home/a/.orch/jobs/j/code/train.py", 51),
)


def sample_view() -> stacks.StackView:
    code = "/home/a/.orch/jobs/j/code"
    replies = {
        "node1": StackReply(
            code=code, ranks=[rank("node1", 0, *WAITING), rank("node1", 1, *WAITING)]
        ),
        "node2": StackReply(
            code=code, ranks=[rank("node2", 2, *WAITING), rank("node2", 3, *WAITING)]
        ),
        "node3": StackReply(
            code=code,
            ranks=[
                rank("node3", 4, *SLEEPING),
                RankStack(rank=5, pid=9, error="tracing not permitted: EPERM", hint="set X"),
            ],
        ),
        "node4": StackReply(
            code=code, ranks=[rank("node4", 6, *WAITING), rank("node4", 7, *WAITING)]
        ),
    }
    return stacks.view("j", 1.0, replies, [("node5", "no answer")], ["node1", "node2", "node3"])


def test_ranks_group_by_identical_stacks_the_largest_first_named_as_the_logs_do() -> None:
    lines = stacks.lines(sample_view())
    assert lines[0] == "6 ranks  node1 r0-r1, node2 r2-r3, node4 r6-r7"
    assert lines[1].split() == ["all_reduce", "torch/distributed/distributed_c10d.py:2850"]
    assert lines[3].split() == ["step", "train.py:42"]
    assert lines[5] == "1 rank   node3 r4"
    assert lines[6].split() == ["sleep", "threading.py:10"], "the innermost frame, stdlib or not"
    assert lines[7].split() == ["load_batch", "train.py:40"]
    assert lines[9] == "1 rank   node3 r5  not read: tracing not permitted: EPERM"
    assert lines[10] == "  hint: set X"
    assert "node5: no stacks: no answer" in lines
    assert lines[-1] == "read: 7 ranks with py-spy"
    assert not any("runpy" in line or "<string>" in line for line in lines), "orch's frames"


def test_verbose_shows_each_rank_apart_with_every_thread() -> None:
    text = "\n".join(stacks.lines(sample_view(), verbose=True))
    assert "node3 r4 (pid 104, py-spy)" in text
    assert '  Thread 1 "MainThread" (active)' in text
    assert "    sleep (threading.py:10)" in text


def test_the_json_names_every_group_and_rank() -> None:
    data = sample_view().to_json()
    assert [len(g["ranks"]) for g in data["groups"]] == [6, 1, 1]
    assert data["groups"][0]["frames"][0] == {
        "function": "all_reduce",
        "file": "torch/distributed/distributed_c10d.py",
        "line": 2850,
        "path": f"{SITE}/torch/distributed/distributed_c10d.py",
    }
    assert data["ranks"][5]["error"].startswith("tracing not permitted")
    assert data["unanswered"] == [{"host": "node5", "error": "no answer"}]
    json.dumps(data)


def test_rank_names_join_runs_per_host() -> None:
    ranks = [("node1", 0), ("node1", 1), ("node1", 3), ("node2", 4), ("node1", 5)]
    assert stacks.rank_names(ranks) == "node1 r0-r1,r3,r5, node2 r4"


def test_files_read_as_the_logs_name_them() -> None:
    code = "/w/jobs/j/code"
    assert stacks.short_file("/w/jobs/j/code/pkg/train.py", code) == "pkg/train.py"
    assert stacks.short_file(f"{SITE}/torch/nn/module.py", code) == "torch/nn/module.py"
    assert stacks.short_file("/usr/lib/python3.12/threading.py", code) == "threading.py"
    assert stacks.short_file("/opt/other.py", code) == "/opt/other.py"


def test_a_long_stack_is_condensed_and_says_how_much_was_left_out() -> None:
    deep = [(f"f{i}", "/code/train.py", i) for i in range(20)]
    view = stacks.view("j", 1.0, {"n": StackReply(code="/code", ranks=[rank("n", 0, *deep)])})
    lines = stacks.lines(view)
    assert len(lines) == 1 + stacks.SHOWN + 1 + 1
    assert lines[-2] == "  ... 12 more frames (-v)"


def test_a_dump_is_kept_owner_only_and_found_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "state"))
    path = kept.save("j-1", 1700000000.25, "text\n", {"job": "j-1"})
    assert path.name == "20231114T221320.250Z.txt" and path.read_text() == "text\n"
    assert json.loads(path.with_suffix(".json").read_text()) == {"job": "j-1"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert kept.saved("j-1") == [path] and kept.saved("other") == []


# ---------------------------------------------------------------- the CLI's errors


def test_an_unknown_job_is_exit_2_without_a_traceback(orch: Orch) -> None:
    run = orch("stack", "nosuch-job")
    assert run.returncode == 2
    assert "error: unknown job id 'nosuch-job'" in run.stderr and "Traceback" not in run.stderr


def test_a_negative_rank_is_refused_before_anything(orch: Orch) -> None:
    run = orch("stack", "some-job", "--rank", "-1")
    assert run.returncode == 2 and "Traceback" not in run.stderr


# ---------------------------------------------------------------- stall_after:


def stall_job(write: Any, value: str) -> Path:
    write("train.py", "")
    return Path(write("job.yaml", f"name: s\nscript: train.py\nnodes: 1\n{value}\n"))


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("stall_after: 5", "stall_after: must be at least 10 s, got 5"),
        ("stall_after: soon", "expected a number of seconds, got 'soon'"),
        ("stall_after: true", "expected a number of seconds, got True"),
        ("on_stall: retry", "unknown on_stall 'retry'"),
    ],
)
def test_a_bad_stall_watchdog_is_refused_at_load_with_exit_2(
    orch: Orch, write: Any, value: str, said: str
) -> None:
    job = stall_job(write, value)
    run = orch("submit", job, "--dry-run")
    assert run.returncode == 2, run
    assert f"error: {job}:4:" in run.stderr and said in run.stderr
    assert "hint: " in run.stderr and "Traceback" not in run.stderr


def test_stall_after_loads_and_the_command_line_overrides_it(write: Any) -> None:
    from orchestrator.models.job import Overrides, load_job, with_overrides

    job = load_job(stall_job(write, "stall_after: 15\non_stall: warn"))
    assert (job.stall_after, job.on_stall) == (15, "warn")
    assert with_overrides(job, Overrides(stall_after=600)).stall_after == 600
    plain = load_job(stall_job(write, ""))
    assert (plain.stall_after, plain.on_stall) == (None, "fail"), "off by default"


def test_stall_after_below_10_on_the_command_line_is_exit_2(orch: Orch, write: Any) -> None:
    run = orch("submit", stall_job(write, ""), "--stall-after", "3", "--dry-run")
    assert run.returncode == 2
    assert "error: --stall-after 3: must be at least 10 s" in run.stderr
    assert "hint: " in run.stderr and "Traceback" not in run.stderr


# ---------------------------------------------------------------- see it coming


def test_top_marks_a_node_silent_for_a_tenth_of_stall_after() -> None:
    from orchestrator.reporting.top import NodeView, RankView, TopView

    def node(host: str, *idle: float) -> NodeView:
        ranks = tuple(
            RankView(host, i, (), None, 0, None, None, s, 100.0, (), 0, True)
            for i, s in enumerate(idle)
        )
        return NodeView(host, 0, "running", ranks)

    talking, quiet = node("node1", 2.0, 40.0), node("node2", 35.0, 31.0)
    view = TopView("j", "j", "running", 0.0, 2.0, (talking, quiet), stall_after=300)
    assert (talking.idle_s, quiet.idle_s) == (2.0, 31.0), "a node's latest line, any rank's"
    assert view.quiet(talking) is None
    assert view.quiet(quiet) == "no line for 31 s (stall_after: 300)"
    data = view.to_json()
    assert data["stall_after"] == 300
    assert [n["quiet"] for n in data["nodes"]] == [None, "no line for 31 s (stall_after: 300)"]
    unwatched = TopView("j", "j", "running", 0.0, 2.0, (talking, quiet))
    assert unwatched.quiet(quiet) is None, "no stall_after: nothing to be near"


def test_a_nodes_silence_counts_from_its_ranks_logs_and_their_start(tmp_path: Path) -> None:
    from orchestrator.agent.node import state

    logs = tmp_path / "logs"
    logs.mkdir()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert state.idle() is None, "no rank started: not watched"
        (logs / "rank-0.pid").write_text("1 1")
        (logs / "rank-0.log").write_text("step 1\n")
        old = time.time() - 50
        os.utime(logs / "rank-0.pid", (old, old))
        os.utime(logs / "rank-0.log", (old, old))
        assert 49 <= (state.idle() or 0) <= 52
        (tmp_path / "torchrun.log").write_text("a launcher line\n")
        idle = state.idle()
        assert idle is not None and idle < 2, "the launcher's output counts"
    finally:
        os.chdir(cwd)


# ---------------------------------------------------------------- NCCL's flight recorder


def test_a_gpu_node_gets_the_flight_recorder_with_its_dumps_in_the_node_dir() -> None:
    from orchestrator.agent.node import spawn

    start = spawn.plan(
        spawn.COLD, ["python", "-m", "x"], {"CUDA_VISIBLE_DEVICES": "0,1"}, "/j/n1", "/j/out"
    )
    assert start.env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert start.env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert start.env["TORCH_FR_DUMP_TEMP_FILE"] == "/j/n1/nccl-trace-rank-"
    deprecated = {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
    assert not deprecated & set(start.env), "torch 2.11 warns of them in every rank's log"


@pytest.mark.parametrize(
    "env",
    [
        {},  # no GPU: no NCCL
        {"CUDA_VISIBLE_DEVICES": ""},
        {"CUDA_VISIBLE_DEVICES": "0", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"},  # the job says no
        {"CUDA_VISIBLE_DEVICES": "0", "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr-"},
    ],
)
def test_the_flight_recorder_is_left_alone_without_gpus_or_where_the_job_sets_it(
    env: dict[str, str],
) -> None:
    from orchestrator.agent.node import spawn

    start = spawn.plan(spawn.COLD, ["python", "-m", "x"], env, "/j/n1", "/j/out")
    added = set(start.env) - set(env) - {"ORCH_OUTPUT_DIR"}
    assert added == set()


def test_stack_lists_the_flight_recorders_dumps_beside_the_stacks(tmp_path: Path) -> None:
    node = tmp_path / "n1"
    (node / "logs").mkdir(parents=True)
    (node / "node.json").write_text(json.dumps({"argv": [], "env": {}}))
    (node / "nccl-trace-rank-3").write_bytes(b"\x80\x04pickle")
    cwd = os.getcwd()
    try:
        reply = agent_stack.take(str(node), StackRequest(taken="t"))
    finally:
        os.chdir(cwd)
    assert reply.flight == {"3": str(node / "nccl-trace-rank-3")}
    view = stacks.view("j", 1.0, {"node1": reply})
    assert f"node1 r3: NCCL flight recorder dump {node / 'nccl-trace-rank-3'}" in stacks.lines(view)


def test_another_users_process_is_never_read_or_signalled(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root, to start a process as another user")
    logs = tmp_path / "logs"
    logs.mkdir()
    theirs = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: os.setuid(65534))  # nobody
    try:
        time.sleep(0.3)
        # A pid file (planted, or a pid reused) that names the other user's process.
        (logs / "rank-0.pid").write_text(f"{theirs.pid} {proc.start_time(theirs.pid)}")
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            assert agent_stack.rank_pids() == {}
        finally:
            os.chdir(cwd)
        assert proc.alive(theirs.pid)
    finally:
        theirs.kill()
        theirs.wait()


def test_a_job_with_no_rank_running_says_so() -> None:
    view = stacks.view("j-1", 1.0, {"node1": StackReply()})
    assert stacks.lines(view) == ["no rank of job j-1 runs on its nodes (yet, or any more)"]


def test_stall_after_on_a_slurm_cluster_is_refused_by_name_with_exit_2(
    orch: Orch, write: Any
) -> None:
    inventory = write("hpc.yaml", "slurm:\n  login: login1.hpc.example.edu\n  partition: gpu\n")
    job = stall_job(write, "stall_after: 600")
    run = orch("submit", job, "-i", inventory, "--dry-run")
    assert run.returncode == 2, run
    assert f"error: {job}:4:14: stall_after: is not for the slurm backend yet" in run.stderr
    assert "hint: drop stall_after:" in run.stderr and "Traceback" not in run.stderr


def test_a_native_frame_shows_its_library_without_a_line() -> None:
    lib = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    assert stacks.short_file(lib, "/code") == "libc.so.6"
    frame = stacks.Frame("clock_nanosleep", lib, 0, stacks.short_file(lib, "/code"))
    assert frame.where == "libc.so.6"
