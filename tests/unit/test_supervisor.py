"""The node supervisor's log framing: `send_new()` turns growing log files into framed
chunks of complete lines at their byte offsets, so that a follower can mirror the
files and stop and resume anywhere without losing or doubling a line."""

from __future__ import annotations

import fcntl
import io
import json
import os
import sys
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.host import proc
from orchestrator.agent.kernel import fileio, framing, layout
from orchestrator.agent.main import main as agent_main
from orchestrator.agent.node import follow
from orchestrator.records.logmirror import LogMirror

F_GETPIPE_SZ = 1032  # Linux


class Log:
    """One rank's log file and one follower's offsets into it."""

    def __init__(self, path: Path, stream: str = "0") -> None:
        self.path = path
        self.stream = stream
        self.offsets: dict[str, int] = {}
        path.touch()

    def append(self, data: bytes) -> None:
        with self.path.open("ab") as f:
            f.write(data)

    def send(self, final: bool = False) -> list[tuple[dict[str, object], bytes]]:
        """The chunks one send_new() call writes, parsed back."""
        out = io.BytesIO()
        follow.send_new(out, self.stream, str(self.path), self.offsets, final)
        return parse(out.getvalue())


def parse(raw: bytes) -> list[tuple[dict[str, object], bytes]]:
    chunks = []
    stream = io.BytesIO(raw)
    while header := stream.readline():
        record = json.loads(header)
        data = b""
        if record["k"] == "data":
            data = stream.read(int(record.get("z") or record["n"]))
            if "z" in record:
                data = zlib.decompress(data)
                del record["z"]
            assert len(data) == record["n"]
        chunks.append((record, data))
    return chunks


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(tmp_path / "rank-0.log")


def test_complete_lines_go_in_one_chunk_at_their_offset(log: Log) -> None:
    log.append(b"epoch 1\nloss 0.41\n")
    assert log.send() == [({"k": "data", "s": "0", "o": 0, "n": 18}, b"epoch 1\nloss 0.41\n")]
    assert log.offsets == {"0": 18}


def test_nothing_new_sends_nothing(log: Log) -> None:
    log.append(b"a\n")
    log.send()
    assert log.send() == []


def test_missing_file_sends_nothing(tmp_path: Path) -> None:
    out = io.BytesIO()
    assert follow.send_new(out, "3", str(tmp_path / "nope.log"), {}, final=False) == (False, False)
    assert out.getvalue() == b""


def test_partial_line_waits_for_its_newline(log: Log) -> None:
    log.append(b"done\nstep 1 of")
    assert log.send() == [({"k": "data", "s": "0", "o": 0, "n": 5}, b"done\n")]
    assert log.send() == []
    log.append(b" 9\n")
    assert log.send() == [({"k": "data", "s": "0", "o": 5, "n": 12}, b"step 1 of 9\n")]


def test_a_progress_bar_goes_before_its_newline(log: Log) -> None:
    """A line redrawn with \\r (tqdm) may go an hour without a newline: each redraw
    goes as it comes, and the rest of the line follows on from its offset."""
    log.append(b"epoch 1\n\r 10%|#")
    assert log.send() == [({"k": "data", "s": "0", "o": 0, "n": 15}, b"epoch 1\n\r 10%|#")]
    log.append(b"\r 20%|##")
    assert log.send() == [({"k": "data", "s": "0", "o": 15, "n": 8}, b"\r 20%|##")]
    log.append(b"\nstep 1 of")  # a plain partial line still waits
    assert log.send() == [({"k": "data", "s": "0", "o": 23, "n": 1}, b"\n")]


def test_final_send_includes_the_unterminated_last_line(log: Log) -> None:
    log.append(b"a\nno newline")
    assert [data for _, data in log.send(final=True)] == [b"a\nno newline"]


def test_binary_junk_stays_inside_its_own_line(log: Log) -> None:
    junk = b"\xff\xfe\x00\x1b[2J\r"
    log.append(b"before\n" + junk + b"\nafter\n")
    ((header, data),) = log.send()
    assert data.split(b"\n") == [b"before", junk, b"after", b""]
    assert header["n"] == len(data)


def test_long_line_below_max_line_is_kept_whole(log: Log) -> None:
    line = b"x" * (1 << 20) + b"\n"
    log.append(line)
    assert [data for _, data in log.send()] == [line]


def test_unterminated_line_reaching_max_line_goes_in_pieces(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(follow, "MAX_LINE", 16)
    log.append(b"y" * 40)
    pieces = [data for _ in range(3) for _, data in log.send()]
    assert pieces == [b"y" * 16, b"y" * 16]  # the last 8 bytes wait for a newline
    log.append(b"\n")
    assert [data for _, data in log.send()] == [b"y" * 8 + b"\n"]


def test_resuming_from_a_mirror_sends_no_line_twice(log: Log, tmp_path: Path) -> None:
    mirror = LogMirror(tmp_path / "mirror", "job-1")
    log.append(b"one\ntwo\n")
    for header, data in log.send():
        mirror.write("node1", "0", int(str(header["o"])), data)
    log.append(b"three\n")
    resumed = Log(log.path)
    resumed.offsets = mirror.offsets("node1")
    for header, data in resumed.send():
        mirror.write("node1", "0", int(str(header["o"])), data)
    # A second follower writing the same chunk again changes nothing.
    mirror.write("node1", "0", 4, b"two\n")
    mirror.close()
    assert mirror.read("node1", "0") == b"one\ntwo\nthree\n"


@given(
    lines=st.lists(st.binary(max_size=6).map(lambda b: b.replace(b"\n", b"")), max_size=8),
    partial=st.booleans(),
    tail=st.integers(min_value=0, max_value=10),
)
@settings(max_examples=300, deadline=None)
def test_mirror_tail_is_the_last_lines(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], partial: bool, tail: int
) -> None:
    mirror = LogMirror(tmp_path_factory.mktemp("logs"), "job")
    data = b"".join(line + b"\n" for line in lines) + (b"no newline yet" if partial else b"")
    mirror.write("node1", "0", 0, data)
    mirror.close()
    every = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        every.pop()
    expected = every[-tail:] if tail else []
    got = mirror.read("node1", "0", tail)
    assert got.split(b"\n")[: len(expected)] == expected
    assert data.endswith(got) and got.count(b"\n") <= tail
    assert mirror.read("node1", "0") == data


def test_log_files_are_torchrun_log_then_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    for name in ("rank-10.log", "rank-2.log", "rank-2.pid", "other.txt"):
        (tmp_path / "logs" / name).write_text("")
    assert follow.log_files() == [
        ("node", "torchrun.log"),
        ("10", "logs/rank-10.log"),
        ("2", "logs/rank-2.log"),
    ]


def test_follow_once_sends_everything_then_the_node_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-0.log").write_bytes(b"hello\n")
    (tmp_path / "node.json").write_text("{}")
    (tmp_path / "exit.json").write_text(json.dumps({"returncode": 3}))
    assert follow.main([str(tmp_path), json.dumps({}), "--once"]) == 0
    chunks = parse(capsysbinary.readouterr().out)
    assert chunks[0] == ({"k": "data", "s": "0", "o": 0, "n": 6}, b"hello\n")
    assert chunks[-1][0] == {"k": "exit", "returncode": 3, "killed": False}


def test_port_listening_reads_the_kernel_table() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert proc.port_listening(port) is False
        s.listen()
        assert proc.port_listening(port) is True


def test_unknown_command_prints_usage_and_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert agent_main(["nonsense"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_big_chunks_travel_compressed_and_small_ones_do_not(log: Log) -> None:
    log.append(b"a\n")
    out = io.BytesIO()
    follow.send_new(out, "0", str(log.path), log.offsets, final=False)
    assert b'"z"' not in out.getvalue()  # a small chunk goes at once, as it is
    lines = b"".join(b"step %06d loss 0.1234\n" % i for i in range(5000))
    log.append(lines)
    out = io.BytesIO()
    assert follow.send_new(out, "0", str(log.path), log.offsets, final=False) == (True, False)
    raw = out.getvalue()
    assert len(raw) < len(lines) / 5
    assert parse(raw) == [({"k": "data", "s": "0", "o": 2, "n": len(lines)}, lines)]


def test_widen_pipe_grows_a_pipe_and_leaves_other_files_alone(tmp_path: Path) -> None:
    read, write = os.pipe()
    try:
        framing.widen_pipe(read)
        assert fcntl.fcntl(read, F_GETPIPE_SZ) >= 1 << 20
    finally:
        os.close(read)
        os.close(write)
    with open(tmp_path / "file", "wb") as f:
        framing.widen_pipe(f.fileno())  # not a pipe: no error


def test_job_files_keep_the_users_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        fileio.write_json(str(tmp_path / "node.json"), {"env": {"HF_TOKEN": "x"}})
    finally:
        os.umask(old)
    assert (tmp_path / "node.json").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["node.json"]  # no temporary left


@pytest.mark.parametrize("reused", [True, False])
def test_kill_signals_a_recorded_group_only_while_its_leader_is_the_same_process(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    reused: bool,
) -> None:
    """An ended job's recorded pgid may name another user's process by now (pids are
    reused): kill proves a group is the job's by its leader's start time."""
    import subprocess

    from orchestrator.agent.node import kill

    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)  # untagged
    try:
        started = proc.start_time(stranger.pid)
        assert started is not None
        recorded = started + 1 if reused else started
        job = tmp_path / "job"
        (job / "logs").mkdir(parents=True)
        (job / "pid.json").write_text(
            json.dumps({"pid": 1 << 22, "pgid": stranger.pid, "start_time": recorded})
        )
        (job / "logs" / "rank-0.pid").write_text(f"{stranger.pid} {recorded}")
        (job / "exit.json").write_text("{}")  # the job ended long ago
        monkeypatch.chdir(tmp_path)
        kill.main([str(job), "0.2", "j-ended"])
        capsys.readouterr()
        if reused:
            assert stranger.poll() is None, "a process that only reused the pid was signalled"
        else:
            assert stranger.wait(timeout=10) != 0
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize("ended_first", [True, False])
def test_kill_marks_a_node_killed_only_when_it_had_not_ended_by_itself(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ended_first: bool,
) -> None:
    """A node whose rank failed before the teardown's kill reached it (behind a
    partition) keeps its failure: its end is not reported as killed, and its time
    still counts for the first failure."""
    from orchestrator.agent.node import kill, state

    job = tmp_path / "job"
    job.mkdir()
    if ended_first:
        (job / "exit.json").write_text(json.dumps({"returncode": 1, "ended": 1700000000.0}))
    monkeypatch.chdir(tmp_path)
    kill.main([str(job), "0.1", "j-1"])
    capsys.readouterr()
    assert (job / layout.KILLED).exists() is not ended_first
    if ended_first:
        monkeypatch.chdir(job)
        ended = state.exit_record()
        assert ended is not None and ended.returncode == 1 and not ended.killed


def test_the_loader_refuses_to_run_code_from_a_directory_others_can_write(
    tmp_path: Path,
) -> None:
    """A workdir in a shared place (/tmp/orch): another user who can write there could
    plant the agent's next version, or a module it imports, and run it as you."""
    import subprocess

    from orchestrator.models.inventory import Host
    from orchestrator.nodes import agent

    def probe(workdir: Path) -> subprocess.CompletedProcess[bytes]:
        host = Host(name="local", address="localhost", python=sys.executable, workdir=str(workdir))
        command = agent.command(host, "status", str(tmp_path / "no-job"))
        return subprocess.run(["/bin/sh", "-c", command], input=agent.packed(), capture_output=True)

    fine = tmp_path / "mine"
    assert probe(fine).returncode == 0
    assert (fine / "agent").stat().st_mode & 0o777 == 0o700  # umask 077
    shared = tmp_path / "shared"
    (shared / "agent").mkdir(parents=True)
    (shared / "agent").chmod(0o777)  # as /tmp/orch/agent made by someone else might be
    result = probe(shared)
    assert result.returncode == 3
    assert b"refusing to run code from " in result.stderr and b"mode 777" in result.stderr
    assert not any((shared / "agent").iterdir())  # nothing was unpacked there either


def test_the_supervisor_hears_of_its_childs_exit_at_once_and_of_nothing_else() -> None:
    """`wait_child` returns None when the timeout passes with the child alive, and its
    exit code as soon as it ends: a kill waits for the exit record written then."""
    import subprocess
    import time

    from orchestrator.agent.node.start import wait_child

    child = subprocess.Popen(["sleep", "0.3"])
    began = time.monotonic()
    assert wait_child(child, 0.05) is None
    assert wait_child(child, 30) == 0
    assert time.monotonic() - began < 5
    failing = subprocess.Popen(["sh", "-c", "exit 7"])
    assert wait_child(failing, 30) == 7


def test_kill_finds_a_tagged_stray_that_left_the_job_s_groups_and_nothing_untagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process that moved out of the job's groups (setsid) is found by its tag, even
    when it appears after the kill began looking; an untagged one is never touched."""
    import subprocess

    from orchestrator.agent.node import kill

    env = {**os.environ, "ORCH_JOB_ID": "j-stray"}
    stray = subprocess.Popen(["sleep", "60"], start_new_session=True, env=env)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        job = tmp_path / "job"
        job.mkdir()
        monkeypatch.chdir(tmp_path)
        kill.main([str(job), "0.2", "j-stray"])
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert [pid for pid, _ in report["killed"]] == [stray.pid]
        assert stray.wait(timeout=10) != 0
        assert stranger.poll() is None
    finally:
        for p in (stray, stranger):
            p.kill()
            p.wait()
