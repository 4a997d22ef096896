"""What the controller decides about a running job, without a cluster: which hosts
`orch logs` reports as lost, which nodes `orch status` tears down, what the attached
watch does when a node fails. The hosts are local (LocalTransport) and the agent is
the real one, run on job directories these tests lay out as a node would leave them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.host import proc
from orchestrator.agent.host.proc import start_time
from orchestrator.agent.kernel import fileio, layout, replies
from orchestrator.models.errors import HostError, JobFailed
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.records.logmirror import LogMirror
from orchestrator.ssh.logs import drain
from orchestrator.ssh.reconcile import reconcile
from orchestrator.ssh.watch import watch_job
from orchestrator.transport import ConnectOptions
from orchestrator.transport.local import LocalTransport

JOB_ID = "decide-0a1b2c"


class Notes:
    """A Reporter that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.notices: list[str] = []

    def job_started(self, job_id: str) -> None:
        pass

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        self.lines.append(data)

    def notice(self, message: str) -> None:
        self.notices.append(message)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes that stand in for a node's torchrun; killed at the end if still there."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for sleeper in procs:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait()


def local_host(tmp_path: Path, name: str, python: str = sys.executable) -> Host:
    return Host(name=name, address="localhost", python=python, workdir=str(tmp_path / "w"))


def lay_out(host: Host, node_rank: int) -> NodeRecord:
    """A node's job directory with the agent pinned, as a push leaves it."""
    job_dir = layout.job_dir(host.workdir, JOB_ID, host.name)
    os.makedirs(os.path.join(job_dir, layout.LOGS))
    status = agent.run(host, LocalTransport(host.name), ["status", job_dir])  # unpacks the agent
    assert status["exists"] is True
    version_dir = os.path.join(layout.agent_dir(host.workdir), agent.version())
    os.symlink(version_dir, os.path.join(job_dir, layout.AGENT))
    return NodeRecord(host, node_rank, node_rank, 1, job_dir)


def ended(node: NodeRecord, returncode: int) -> None:
    """The node's torchrun exited with `returncode`, and its rank wrote a traceback."""
    with open(os.path.join(node.job_dir, layout.LOGS, f"rank-{node.first_rank}.log"), "w") as f:
        f.write("Traceback (most recent call last):\nValueError: boom\n")
    fileio.write_json(os.path.join(node.job_dir, layout.PIDS), {"pid": 1, "pgid": 1})
    exit_record = {"returncode": returncode, "ended": time.time()}
    fileio.write_json(os.path.join(node.job_dir, layout.EXIT), exit_record)


def running(node: NodeRecord, sleepers: list[subprocess.Popen[bytes]]) -> int:
    """The node runs: a process in its own group stands in for torchrun and supervisor."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    sleepers.append(proc)
    started = {
        "pid": proc.pid,
        "pgid": proc.pid,
        "supervisor": proc.pid,
        "started": time.time(),
        "start_time": start_time(proc.pid),  # as the supervisor records it
    }
    fileio.write_json(os.path.join(node.job_dir, layout.PIDS), started)
    return proc.pid


def recorded(tmp_path: Path, nodes: list[NodeRecord]) -> tuple[JobDB, JobRecord]:
    store = JobDB(tmp_path / "home")
    store.add(JobRecord(JOB_ID, "decide", JobState.PENDING, "127.0.0.1", None, {}, nodes))
    store.update_job(JOB_ID, JobState.RUNNING)
    return store, store.get(JOB_ID)


def connected(nodes: list[NodeRecord]) -> HostGroup:
    group = HostGroup([n.host for n in nodes], ConnectOptions())
    group.connect()
    return group


def test_drain_reports_a_host_whose_stream_goes_silent(tmp_path: Path) -> None:
    silent = tmp_path / "silent-python"
    silent.write_text("#!/bin/sh\nexec sleep 30\n")
    silent.chmod(0o755)
    node = NodeRecord(local_host(tmp_path, "quiet", str(silent)), 0, 0, 1, str(tmp_path))
    store, record = recorded(tmp_path, [node])
    with connected([node]) as group:
        mirror = LogMirror(tmp_path / "logs", JOB_ID)
        failures = drain(record, [node], group, mirror, store, idle_timeout=0.5)
        mirror.close()
    assert [(type(f), f.host) for f in failures] == [(HostError, "quiet")]
    assert "no answer from quiet" in failures[0].message


def test_drain_records_how_an_ended_node_ended(tmp_path: Path) -> None:
    node = lay_out(local_host(tmp_path, "n1"), 0)
    ended(node, 3)
    store, record = recorded(tmp_path, [node])
    with connected([node]) as group:
        mirror = LogMirror(tmp_path / "logs", JOB_ID)
        assert drain(record, [node], group, mirror, store) == []
        mirror.close()
    stored = store.get(JOB_ID).node("n1")
    assert (stored.state, stored.exit_code) == (JobState.FAILED, 3)
    assert b"ValueError: boom" in mirror.read("n1", "0")


def test_status_of_a_detached_job_with_a_failed_node_stops_the_others(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    first, second = lay_out(local_host(tmp_path, "n1"), 0), lay_out(local_host(tmp_path, "n2"), 1)
    ended(first, 1)
    pid = running(second, sleepers)
    store, record = recorded(tmp_path, [first, second])
    notes = Notes()

    settled = reconcile(store, record, notes)

    assert sleepers[0].wait(timeout=10) == -signal.SIGTERM  # the healthy node was stopped
    assert [n.state for n in settled.nodes] == [JobState.FAILED, JobState.KILLED]
    assert settled.state is JobState.FAILED
    assert any("node n1 failed; stopping the others" in n for n in notes.notices), notes.notices
    assert not proc.alive(pid)


def test_attached_watch_stops_the_job_when_a_node_fails_and_names_the_rank(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    first, second = lay_out(local_host(tmp_path, "n1"), 0), lay_out(local_host(tmp_path, "n2"), 1)
    running(first, sleepers)
    ended(second, 7)
    store, record = recorded(tmp_path, [first, second])
    notes = Notes()
    mirror = LogMirror(tmp_path / "logs", JOB_ID)

    # The sleeper plays the supervisor too: once killed, the node's end is "vanished".
    with connected([first, second]) as group, pytest.raises(JobFailed) as failed:
        watch_job(record, group, notes, store, mirror, attached=True)
    mirror.close()

    assert sleepers[0].wait(timeout=10) == -signal.SIGTERM
    assert "node n2 exited with code 7; first failure: rank 1" in failed.value.message
    assert "ValueError: boom" in failed.value.message
    assert store.get(JOB_ID).state is JobState.FAILED
    assert json.loads(json.dumps([n.state.value for n in store.get(JOB_ID).nodes])) == [
        "killed",
        "failed",
    ]


def test_replies_tolerate_a_newer_agents_fields_and_name_the_host_when_one_is_missing(
    tmp_path: Path,
) -> None:
    host = local_host(tmp_path, "n7")
    newer = {"started": True, "running": False, "ended": {"returncode": 0, "gpu_s": 9}, "x": 1}
    status = agent.parse(host, replies.StatusReply, newer)
    assert status.ended == replies.ExitRecord(returncode=0)
    with pytest.raises(HostError) as missing:
        agent.parse(host, replies.Started, {"pid": 4, "pgid": 4, "started": 1.0})
    assert missing.value.host == "n7" and "lacks 'supervisor'" in missing.value.message
