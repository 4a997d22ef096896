"""Job records (SQLite), job states, and reading torchrun's failure report."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from orchestrator.models.errors import InfraError, InputError
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState, job_state, node_state
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.reporting.failure import root_cause

S, F, K, L, R, P = (
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.KILLED,
    JobState.LOST,
    JobState.RUNNING,
    JobState.PENDING,
)


def record(job_id: str, hosts: int = 2) -> JobRecord:
    nodes = [
        NodeRecord(
            Host(name=f"node{i + 1}", address=f"10.77.0.{11 + i}", gpus=(0, 1), labels=("a",)),
            i,
            i * 2,
            2,
            f"~/.orch/jobs/{job_id}/node{i + 1}",
        )
        for i in range(hosts)
    ]
    return JobRecord(job_id, "train", P, "10.77.0.11", 29500, {"entry": "train.py"}, nodes)


def test_a_record_round_trips_with_its_hosts(tmp_path: Path) -> None:
    store = JobDB(tmp_path)
    store.add(record("train-abc123"))
    got = store.get("train-abc123")
    assert got.nodes[1].host == Host(name="node2", address="10.77.0.12", gpus=(0, 1), labels=("a",))
    assert [list(n.ranks) for n in got.nodes] == [[0, 1], [2, 3]]
    assert got.state is P and got.master_port == 29500


def test_hosts_warmed_ahead_are_kept_once_each_until_forgotten(tmp_path: Path) -> None:
    store = JobDB(tmp_path)
    one = Host(name="node1", address="10.0.0.1", gpus=(0, 1), labels=("a",))
    store.add_warm_hosts([one, Host(name="node2", address="10.0.0.2")])
    store.add_warm_hosts([one])
    assert [h.name for h in store.warm_hosts()] == ["node1", "node2"]
    assert store.warm_hosts()[0] == one
    store.forget_warm_hosts(["node1"])
    assert [h.name for h in JobDB(tmp_path).warm_hosts()] == ["node2"]
    assert store.jobs() == []


def test_states_stamp_start_and_end_once(tmp_path: Path) -> None:
    store = JobDB(tmp_path)
    store.add(record("j-1"))
    store.update_job("j-1", R)
    started = store.get("j-1").started
    store.update_job("j-1", S, 0, ended=started + 5 if started else None)
    store.update_job("j-1", S, 0)
    job = store.get("j-1")
    assert job.started == started and job.duration == pytest.approx(5)
    assert job.exit_code == 0


def test_several_nodes_change_in_one_write_and_the_others_stay(tmp_path: Path) -> None:
    store = JobDB(tmp_path)
    store.add(record("train-1", hosts=3))
    store.update_nodes("train-1", {"node1": (K, None, None), "node3": (L, 1, "gone")})
    nodes = {n.host.name: (n.state, n.exit_code, n.error) for n in store.get("train-1").nodes}
    assert nodes == {"node1": (K, None, None), "node2": (P, None, None), "node3": (L, 1, "gone")}


def test_unknown_id_suggests_the_nearest_and_prefixes_work(tmp_path: Path) -> None:
    store = JobDB(tmp_path)
    for job_id in ("digits-3fa9c2", "digits-3fa9d7", "other-000001"):
        store.add(record(job_id))
    assert store.get("other").id == "other-000001"
    with pytest.raises(InputError, match="ambiguous"):
        store.get("digits-3fa9")
    with pytest.raises(InputError) as err:
        store.get("digits-3fa9c3")
    assert err.value.exit_code == 2 and "digits-3fa9c2" in err.value.hint


def test_a_corrupt_store_says_how_to_move_it_away(tmp_path: Path) -> None:
    (tmp_path / "jobs.db").write_bytes(b"garbage" * 1000)
    with pytest.raises(InfraError) as err:
        JobDB(tmp_path).jobs()
    assert "unreadable" in err.value.message and "mv " in err.value.hint


def _writer(home: str, worker: int) -> None:
    store = JobDB(Path(home))
    for i in range(15):
        job_id = f"w{worker}-{i:06d}"
        store.add(record(job_id))
        store.update_job(job_id, R)
        store.update_node(job_id, "node1", S, 0)


def test_concurrent_writers_lose_no_record(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_writer, args=(str(tmp_path), w)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    jobs = JobDB(tmp_path).jobs()
    assert len(jobs) == 90 and all(j.state is R and j.nodes[0].state is S for j in jobs)
    with sqlite3.connect(tmp_path / "jobs.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _first_open(home: str, start: Any, errors: Any) -> None:
    start.wait(30)
    try:
        JobDB(Path(home)).jobs()
    except InfraError as exc:
        errors.put(exc.message)


def test_first_commands_at_once_on_a_new_store_all_open_it(tmp_path: Path) -> None:
    """Two first `orch submit`s at once: switching a new store to WAL is a lock SQLite
    does not wait for, and one of them failed ('database is locked', with a hint to move
    the store away); started at one barrier, within the first few new stores."""
    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    for trial in range(20):
        start = context.Barrier(4)
        home = tmp_path / str(trial)
        procs = [
            context.Process(target=_first_open, args=(str(home), start, errors)) for _ in range(4)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    assert errors.empty(), errors.get()


def test_a_store_held_by_another_command_says_so_and_not_to_move_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JobDB(tmp_path)
    store.add(record("held-000001"))
    monkeypatch.setattr("orchestrator.records.db.BUSY_S", 0.2)
    other = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another orch command in its write
    try:
        with pytest.raises(InfraError) as err:
            store.add(record("next-000002"))
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert "stayed locked" in err.value.message and "mv " not in err.value.hint
    store.add(record("next-000002"))
    assert {j.id for j in store.jobs()} == {"held-000001", "next-000002"}


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([P, P], P),
        ([R, P], R),
        ([S, R], R),
        ([S, S], S),
        ([S, F], F),
        ([F, K, K], F),  # a node failed and orch stopped the rest
        ([L, K], F),  # a host vanished and orch stopped the rest
        ([L, S], L),
        ([K, K], K),  # the user killed it
    ],
)
def test_job_state_from_its_nodes(nodes: list[JobState], expected: JobState) -> None:
    assert job_state(nodes) is expected


def test_node_state_from_its_end() -> None:
    assert node_state(0, False) is S
    assert node_state(1, False) is F and node_state(-9, False) is F
    assert node_state(None, False) is L
    assert node_state(-15, True) is K


def test_root_cause_reads_torchrun_report() -> None:
    report = b"""torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
workload.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_02:11:38
  host      : node2
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 1234)
  error_file: <N/A>
============================================================""".splitlines()
    assert root_cause(report) == (3, -9)
    assert root_cause([b"nothing useful"]) == (None, None)


def test_a_bad_row_shows_as_unknown_and_the_others_as_usual(tmp_path: Path) -> None:
    store = JobDB(tmp_path)
    for job_id in ("a-1", "b-2", "c-3"):
        store.add(record(job_id))
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE jobs SET state='paused-by-orch-9' WHERE id='a-1'")
        # A newer orch's host record, with a field this one does not know.
        db.execute(
            "UPDATE nodes SET host_spec=json_set(host_spec, '$.future', 1) WHERE job_id='b-2'"
        )
        db.execute("UPDATE nodes SET host_spec='{not json' WHERE job_id='c-3' AND node_rank=1")
    jobs = {j.id: j for j in store.jobs()}
    assert jobs["a-1"].state is JobState.UNKNOWN and len(jobs["a-1"].nodes) == 2
    assert jobs["b-2"].state is P and jobs["b-2"].nodes[0].host.name == "node1"
    assert jobs["c-3"].state is JobState.UNKNOWN and jobs["c-3"].name == "train"
    assert store.get("c-3").state is JobState.UNKNOWN
    assert job_state([S, JobState.UNKNOWN]) is JobState.UNKNOWN
