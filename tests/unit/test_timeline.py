"""A job's attempts on a time line (api.attempts, reporting/timeline.py), from a real
record: a job of two nodes whose node2 was lost, restarted on node1 and the spare
node3, read from the records and the log copy's arrival times as `orch ui` draws it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from orchestrator.api import attempts
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.records.logmirror import LogMirror

T0 = 1_800_000_000.0
JOB = "train-5ea7c1"


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobDB:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "state"))
    return JobDB()


def node(name: str, node_rank: int, state: JobState = JobState.RUNNING) -> NodeRecord:
    return NodeRecord(Host(name, f"10.0.0.{node_rank + 1}"), node_rank, node_rank, 1, "d", state)


def printed(store: JobDB, attempt: int, host: str, stream: str, *at: float) -> None:
    """A stream of the log copy whose pieces came at `at` (the copy's own times file,
    its 16-byte records rewritten with these times)."""
    mirror = LogMirror(store.home / "logs", JOB, attempt)
    for i, _ in enumerate(at):
        mirror.write(host, stream, i * 5, b"line\n")
    mirror.close()
    times = mirror.dir / host / f"{stream}.times"
    times.write_bytes(b"".join(struct.pack("<Qd", (i + 1) * 5, t) for i, t in enumerate(at)))


def restarted_job(store: JobDB) -> None:
    """Attempt 1 on node1 and node2 from T0; node2 lost at T0+40, node1 stopped; attempt
    2 on node1 and the spare node3 (node rank 1: node2's place), still running."""
    record = JobRecord(JOB, "train", JobState.PENDING, "10.0.0.1", 29500, {"restarts": 2})
    record.nodes = [node("node1", 0), node("node2", 1)]
    record.created = record.started = T0
    store.add(record)
    store.update_job(JOB, JobState.RUNNING)
    printed(store, 0, "node1", "0", T0 + 2, T0 + 20, T0 + 45)
    printed(store, 0, "node2", "1", T0 + 3, T0 + 40)
    store.update_node(JOB, "node2", JobState.LOST, None, "node2 stopped answering")
    store.update_node(JOB, "node1", JobState.KILLED, -15)
    store.restart(
        JobRecord(
            JOB,
            "train",
            JobState.PENDING,
            "10.0.0.1",
            29501,
            {"attempt": 1},
            [node("node1", 0), node("node3", 1)],
        )
    )
    store.update_job(JOB, JobState.RUNNING)
    printed(store, 1, "node3", "1", T0 + 61, T0 + 90)
    printed(store, 1, "node1", "node", T0 + 60, T0 + 95)


def test_each_attempt_is_a_span_per_node_and_the_spare_says_whose_place_it_took(
    store: JobDB,
) -> None:
    restarted_job(store)
    line = attempts.timeline(JOB[:8])
    assert (line.job_id, line.attempts, line.started) == (JOB, 2, T0)
    spans = [
        (s.attempt, s.host, s.node_rank, s.state, s.start, s.end, s.took_place_of)
        for s in line.spans
    ]
    assert spans == [
        # the first attempt's nodes start with the job; each ends where its logs stop
        (0, "node1", 0, JobState.KILLED, T0, T0 + 45, None),
        (0, "node2", 1, JobState.LOST, T0, T0 + 40, None),
        # the second starts when its first piece of logs came, and runs on: no end yet
        (1, "node1", 0, JobState.RUNNING, T0 + 60, None, None),
        (1, "node3", 1, JobState.RUNNING, T0 + 60, None, "node2"),
    ]
    assert line.spans[1].error == "node2 stopped answering"
    assert line.spans[0].exit_code == -15
    shown = line.as_json()
    assert shown["spans"][3]["took_place_of"] == "node2"
    assert shown["spans"][1]["state"] == "lost"


def test_a_node_that_printed_nothing_ends_with_its_attempt_and_the_job(store: JobDB) -> None:
    restarted_job(store)
    store.update_node(JOB, "node1", JobState.SUCCEEDED, 0)
    store.update_node(JOB, "node3", JobState.FAILED, 1)
    store.update_job(JOB, JobState.FAILED, 1, ended=T0 + 100)
    line = attempts.timeline(JOB)
    last = {s.host: s for s in line.spans if s.attempt == 1}
    assert (last["node1"].end, last["node3"].end) == (T0 + 95, T0 + 90)
    assert last["node3"].state is JobState.FAILED
    # no arrival times at all (a copy older than them): the first attempt spans the
    # job's start to the next one's start (then unknown: the same), the last to its end
    for folder in (store.home / "logs").iterdir():
        for times in folder.glob("*/*.times"):
            times.unlink()
    bare = attempts.timeline(JOB)
    assert [(s.start, s.end) for s in bare.spans] == [(T0, T0)] * 2 + [(T0, T0 + 100)] * 2


def test_no_such_job_is_an_input_error(store: JobDB) -> None:
    from orchestrator.api.errors import InputError

    with pytest.raises(InputError):
        attempts.timeline("nope")
