"""The Python API's pure parts: typed lines cut from output chunks, the snapshots built
from job records and kill outcomes, the line queue between threads, handles on a local
job store, the dry-run plan, and `import orchestrator` staying cheap."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api.lines import Abandoned, LineQueue, LineReporter
from orchestrator.models.errors import HostError, InputError
from orchestrator.models.inventory import Host
from orchestrator.models.states import STILL_RUNNING, JobState
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.reporting.outcomes import KillOutcome
from tests.unit.conftest import WriteFile

LineKind, LogLine = api.LineKind, api.LogLine


def collect() -> tuple[LineReporter, list[LogLine]]:
    lines: list[LogLine] = []
    return LineReporter(lines.append, lambda _message: None), lines


def test_lines_cut_from_chunks_split_anywhere_keep_each_stream_whole() -> None:
    reporter, lines = collect()
    reporter.output("node1", 0, b"epoch 1 lo")
    reporter.output("node2", 1, b"other\n")
    reporter.output("node1", 0, b"ss 0.5\nepoch 2\n")
    assert lines == [
        LogLine("node1", 0, LineKind.RANK, "epoch 1 lo"),  # a chunk ending mid-line: its last
        LogLine("node2", 1, LineKind.RANK, "other"),
        LogLine("node1", 0, LineKind.RANK, "ss 0.5"),
        LogLine("node1", 0, LineKind.RANK, "epoch 2"),
    ]


def test_a_progress_bar_is_one_line_in_its_last_state_without_colours() -> None:
    reporter, lines = collect()
    reporter.output("node1", 0, b"\x1b[32mstart\x1b[0m\n 10%|#\r 50%|##")
    reporter.output("node1", 0, b"   \r100%|###\n")
    reporter.output("node1", 0, b"eval\r 30%")  # still drawn when the stream stops
    assert [line.text for line in lines] == ["start", "100%|###"]
    reporter.close()
    assert [line.text for line in lines] == ["start", "100%|###", " 30%"]


def test_node_and_setup_output_are_told_apart_from_ranks() -> None:
    reporter, lines = collect()
    reporter.output("node1", None, b"torchrun says\n")
    reporter.output("node2 setup", None, b"pip install\n\xff\n")
    assert lines == [
        LogLine("node1", None, LineKind.NODE, "torchrun says"),
        LogLine("node2", None, LineKind.SETUP, "pip install"),
        LogLine("node2", None, LineKind.SETUP, "\ufffd"),  # bytes that are no UTF-8
    ]
    assert [str(line) for line in lines] == [
        "[node1] torchrun says",
        "[node2 setup] pip install",
        "[node2 setup] \ufffd",
    ]
    assert str(LogLine("node2", 3, LineKind.RANK, "x")) == "[node2 r3] x"


def test_notices_go_to_logging_not_to_the_terminal(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level("INFO", logger="orchestrator")
    api.QuietReporter().notice("pushing code")
    LineReporter(lambda _line: None).notice("setup: cached")
    assert [r.getMessage() for r in caplog.records] == ["pushing code", "setup: cached"]
    assert capfd.readouterr() == ("", "")


def test_the_line_queue_hands_lines_over_then_the_workers_error() -> None:
    queue = LineQueue(size=2)

    def work() -> None:
        for i in range(5):
            queue.reporter.output("node1", 0, f"{i}\n".encode())
        queue.finish(HostError("node2", "lost while reading logs"))

    threading.Thread(target=work, daemon=True).start()
    seen = []
    with pytest.raises(HostError, match="lost while reading logs"):
        for line in queue:
            seen.append(line.text)
    assert seen == ["0", "1", "2", "3", "4"]


def test_a_line_queue_left_by_its_reader_stops_its_worker() -> None:
    queue = LineQueue(size=1)
    stopped = threading.Event()

    def work() -> None:
        try:
            while True:
                queue.reporter.output("node1", 0, b"more\n")
        except Abandoned:
            stopped.set()

    threading.Thread(target=work, daemon=True).start()
    assert next(iter(queue)).text == "more"
    queue.close()
    assert stopped.wait(5), "the worker went on after its reader left"


def restarted_record() -> JobRecord:
    hosts = [Host(name=f"node{i}", address=f"10.77.0.{10 + i}") for i in (1, 2, 3)]
    nodes = [
        NodeRecord(hosts[0], 0, 0, 2, "d1", JobState.SUCCEEDED, 0),
        NodeRecord(hosts[2], 1, 2, 1, "d3", JobState.LOST, None, STILL_RUNNING),
    ]
    spec = {
        "restarts": 2,
        "attempt": 1,
        "attempts": [
            {
                "attempt": 0,
                "nodes": [
                    {"host": "node1", "state": "killed"},
                    {"host": "node2", "state": "lost"},
                ],
            }
        ],
    }
    return JobRecord(
        "train-ab12cd",
        "train",
        JobState.LOST,
        "10.77.0.11",
        29500,
        spec,
        nodes,
        created=100.0,
        started=110.0,
        ended=150.0,
        exit_code=1,
    )


def test_a_status_says_what_orch_status_shows() -> None:
    status = api.JobStatus.of(restarted_record())
    assert (status.id, status.state, status.exit_code, status.duration) == (
        "train-ab12cd",
        JobState.LOST,
        1,
        40.0,
    )
    assert (status.attempt, status.restarts) == (1, 2)
    assert status.earlier == (
        api.EarlierAttempt(0, {"node1": JobState.KILLED, "node2": JobState.LOST}),
    )
    first, second = status.nodes
    assert (first.host, first.address, first.ranks, first.state) == (
        "node1",
        "10.77.0.11",
        range(0, 2),
        JobState.SUCCEEDED,
    )
    assert second.ranks == range(2, 3) and second.still_running and not first.still_running
    assert not status.ok


def test_a_status_is_a_snapshot_the_record_does_not_change() -> None:
    record = restarted_record()
    status = api.JobStatus.of(record)
    record.spec["attempt"] = 2
    record.nodes[0].state = JobState.FAILED
    assert status.attempt == 1 and status.nodes[0].state is JobState.SUCCEEDED
    with pytest.raises(AttributeError):
        status.state = JobState.FAILED  # type: ignore[misc]


@pytest.mark.parametrize(
    ("code", "name"),
    [(-9, "SIGKILL"), (-15, "SIGTERM"), (-99, "signal 99"), (1, None), (None, None)],
)
def test_a_node_killed_by_a_signal_names_it(code: int | None, name: str | None) -> None:
    node = api.NodeStatus("node1", "10.77.0.11", 0, range(1), JobState.FAILED, code)
    assert node.signal == name


def test_a_kill_result_lists_each_hosts_processes() -> None:
    outcome = KillOutcome("train-ab12cd")
    outcome.killed = {"node1": [(22, "python -m torch.distributed.run"), (29, "python train.py")]}
    outcome.port_free = True
    outcome.unreachable = [HostError("node2", "no route")]
    result = api.KillResult.of(outcome)
    assert result.killed == {
        "node1": (
            api.KilledProcess(22, "python -m torch.distributed.run"),
            api.KilledProcess(29, "python train.py"),
        )
    }
    assert [(pid, cmd.split()[-1]) for pid, cmd in result.killed["node1"]] == [
        (22, "torch.distributed.run"),
        (29, "train.py"),
    ]
    assert result.port_free is True and result.already is None
    assert [e.host for e in result.unreachable] == ["node2"]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobDB:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "state"))
    return JobDB()


def test_handles_find_recorded_jobs_by_prefix_and_wait_on_ended_ones(store: JobDB) -> None:
    record = restarted_record()
    record.state, record.exit_code = JobState.SUCCEEDED, 0
    for node in record.nodes:
        node.state, node.error = JobState.SUCCEEDED, None
    store.add(record)
    store.update_job(record.id, JobState.SUCCEEDED, 0)
    handle = api.job("train-ab")
    assert handle.id == "train-ab12cd" and repr(handle) == "Job('train-ab12cd')"
    assert [j.id for j in api.jobs()] == ["train-ab12cd"]
    final = handle.wait(timeout=0)  # ended: no host is asked, no time needed
    assert final.ok and final.exit_code == 0
    with pytest.raises(InputError, match="no-such"):
        api.job("no-such")
    with pytest.raises(InputError, match="has no node 'node9'"):
        handle.logs(node="node9")  # at once, before any line is read


def test_the_plan_of_a_job_with_overrides_touches_no_host(write: WriteFile) -> None:
    write("code/train.py", "print('hi')\n")
    job = write(
        "job.yaml",
        """
        name: train
        workdir: code
        script: train.py
        args: [--epochs, "3"]
        env: {LR: "0.1"}
        """,
    )
    over = api.Overrides(name="lr-0.01", env={"LR": "0.01"}, args=("--lr", "0.01"))
    plan = api.plan(job, overrides=over)  # the built-in localhost inventory
    assert plan.job_id.startswith("lr-0.01-")
    assert plan.job.env == {"LR": "0.01"}
    assert plan.job.args == ("--epochs", "3", "--lr", "0.01")
    assert [n.host.name for n in plan.nodes] == ["localhost"]


def test_the_api_keeps_its_files_private_and_gives_the_umask_back(
    store: JobDB, write: WriteFile
) -> None:
    old = os.umask(0o022)
    try:
        with pytest.raises(InputError):
            api.submit(write("job.yaml", "name: x\n"))  # no script: nothing started
        assert api.statuses() == []
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(old)
    assert (store.home / "jobs.db").stat().st_mode & 0o077 == 0


def test_import_orchestrator_stays_cheap_and_loads_the_api_on_first_use() -> None:
    code = (
        "import sys, orchestrator\n"
        "assert 'orchestrator.api' not in sys.modules and 'paramiko' not in sys.modules\n"
        "assert orchestrator.submit is __import__('orchestrator.api').api.submit\n"
        "try:\n    orchestrator.nothing\nexcept AttributeError as e:\n    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout == "module 'orchestrator' has no attribute 'nothing'\n"


class Said:
    """A Reporter that keeps what a verb said."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, int | None, bytes]] = []
        self.notices: list[str] = []

    def job_started(self, job_id: str) -> None:
        raise AssertionError(f"no job here: {job_id}")

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        self.chunks.append((host, rank, data))

    def notice(self, message: str) -> None:
        self.notices.append(message)


def test_a_notebook_checks_the_hosts_and_runs_a_command_with_the_clis_own_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.api import cluster
    from orchestrator.api.errors import ExecFailed

    monkeypatch.delenv("ORCH_INVENTORY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "state"))
    found = cluster.check()  # the built-in localhost inventory, as `orch check`
    assert not found.failed and found.errors == ()
    row = found.tables[0].rows[0]
    assert [cell.text for cell in row[:2]] == ["localhost (master)", "local"]
    assert row[3].text == sys.version.split()[0] and all(cell.mark is None for cell in row)
    assert (str(found.lines[-1]), found.lines[-1].mark) == (
        "1 host: all checks passed",
        cluster.Mark.PASSED,
    )
    said = Said()
    runs = cluster.exec_command(["echo", "one two"], reporter=said)
    assert [(r.host, r.exit_code, r.ok) for r in runs] == [("localhost", 0, True)]
    assert said.chunks == [("localhost", None, b"one two\n")]
    with pytest.raises(ExecFailed) as failed:
        cluster.exec_command(["exit 4"], reporter=Said())
    assert failed.value.exit_code == 4
