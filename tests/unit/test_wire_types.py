"""The wire's messages (agent/kernel/messages.py, replies.py): each field's type checked where a
message is parsed, a wrong one an error naming the message, the field and the host;
unknown fields tolerated; every message class built on one side and parsed on the
other."""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

import pytest

from orchestrator.agent.keeper import wire
from orchestrator.agent.kernel import messages, states
from orchestrator.agent.kernel.messages import Message, MessageError, parse_message
from orchestrator.agent.kernel.replies import (
    ExitRecord,
    GcReport,
    KillReport,
    Started,
    StatusReply,
    SyncReply,
    TopSample,
)
from orchestrator.models.errors import HostError
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState, node_state
from orchestrator.nodes import agent
from orchestrator.records.db import SpecView


class Sample(Message):
    count: int
    ratio: float
    name: str | None = None
    flags: Sequence[bool] = ()
    extra: dict[str, Any] | None = None
    ended: ExitRecord | None = None


def test_fields_of_the_right_types_parse() -> None:
    data = {"count": 3, "ratio": 1, "name": "a", "flags": [True], "extra": {"x": [1]}}
    sample = parse_message(Sample, data)
    assert (sample.count, sample.ratio, sample.name, list(sample.flags)) == (3, 1, "a", [True])
    assert sample.extra == {"x": [1]}
    assert sample.ended is None  # the class default


def test_a_wrong_type_names_the_message_field_and_host() -> None:
    with pytest.raises(MessageError, match=r"Sample\.count from node2 is str, not int"):
        parse_message(Sample, {"count": "3", "ratio": 1.0}, host="node2")
    with pytest.raises(MessageError, match=r"Sample\.count is bool"):
        parse_message(Sample, {"count": True, "ratio": 1.0})  # a bool is no count
    with pytest.raises(
        MessageError, match=r"Sample\.flags is a list holding int, not Sequence\[bool\]"
    ):
        parse_message(Sample, {"count": 1, "ratio": 1.0, "flags": [1]})
    with pytest.raises(MessageError, match=r"Sample\.extra is list, not dict"):
        parse_message(Sample, {"count": 1, "ratio": 1.0, "extra": []})


def test_none_only_where_the_annotation_allows_it() -> None:
    assert parse_message(Sample, {"count": 1, "ratio": 2.5, "name": None}).name is None
    with pytest.raises(MessageError, match=r"Sample\.ratio is null, not float"):
        parse_message(Sample, {"count": 1, "ratio": None})


def test_unknown_fields_are_tolerated_and_missing_ones_refused() -> None:
    sample = parse_message(Sample, {"count": 1, "ratio": 0.5, "from_a_newer_agent": [1, 2]})
    assert not hasattr(sample, "from_a_newer_agent")
    with pytest.raises(MessageError, match=r"Sample from node1 lacks 'ratio'"):
        parse_message(Sample, {"count": 1}, host="node1")
    with pytest.raises(MessageError, match="not an object"):
        parse_message(Sample, [1], host="node1")  # type: ignore[arg-type]


def test_a_message_inside_a_message_is_parsed_and_checked() -> None:
    sample = parse_message(Sample, {"count": 1, "ratio": 0.5, "ended": {"returncode": 3}})
    assert sample.ended == ExitRecord(returncode=3)
    with pytest.raises(MessageError, match=r"Sample\.ended from h: ExitRecord\.returncode is str"):
        parse_message(Sample, {"count": 1, "ratio": 0.5, "ended": {"returncode": "3"}}, host="h")


def test_the_controller_reports_a_wrong_type_as_the_hosts_error() -> None:
    host = Host(name="node7", address="10.0.0.7")
    with pytest.raises(HostError) as caught:
        agent.parse(host, StatusReply, {"started": "yes", "running": False})
    assert caught.value.host == "node7"
    assert "StatusReply.started" in caught.value.message


def test_every_annotation_of_the_wire_can_be_checked() -> None:
    """A class whose annotation the checker does not know fails here, not on a host."""
    for cls in messages._MESSAGES.values():
        for annotation in cls.fields().values():
            messages._compile(annotation)


def roundtrip(message: Message) -> Message:
    """Built on one side, sent as JSON, parsed on the other."""
    return parse_message(type(message), json.loads(message.to_json()), host="h")


@pytest.mark.parametrize(
    "message",
    [
        ExitRecord(returncode=None, error="the supervisor vanished", killed=False),
        ExitRecord(returncode=1, ended=1.5),
        StatusReply(started=True, running=False, ended=ExitRecord(returncode=0, ended=2.0)),
        StatusReply(started=False, running=False, ended=None, exists=False),
        Started(pid=10, pgid=10, supervisor=9, started=1.0, start_time=5, host="boot"),
        KillReport(killed=[[1, "python"]], forced=[2], remaining=[], port_free=True),
        SyncReply(stored=2, bytes=10, missing=["ab"], error=None),
        GcReport(objects_removed=1, bytes_freed=5, busy=False),
        TopSample(exists=True, started=True, running=True, clock=1.0, ranks=[{"rank": 0}]),
    ],
)
def test_replies_round_trip(message: Message) -> None:
    assert roundtrip(message).as_dict() == message.as_dict()


def test_the_controllers_states_are_the_agents_words() -> None:
    words = {v for k, v in vars(states).items() if k.isupper() and isinstance(v, str)}
    assert {s.value for s in JobState} <= words
    assert set(states.NODE_ACTIVE) | set(states.KEEPER_ACTING) <= words
    assert node_state(None, killed=False) is JobState.LOST  # a returncode of None: lost
    assert node_state(None, killed=True) is JobState.KILLED
    assert node_state(0, killed=False).value == states.ended_state(0, False) == states.SUCCEEDED


# ---------------------------------------------------------------- keeper and members

KEEPER_TO_MEMBER = [
    wire.Heartbeat(),
    wire.Stop(attempt=1),
    wire.Start(place={"attempt": 1, "hosts": ["a"], "ticket": [1.5, "j"]}),
    wire.PortWanted(),
    wire.LeaseAsked(verb="poll"),
    wire.Bye(),
]
MEMBER_TO_KEEPER = [
    wire.Heartbeat(),
    wire.Hello(host="node2"),
    wire.NodeEnd(attempt=0, returncode=None, error="the supervisor vanished", killed=False),
    wire.NodeStarted(attempt=1, ok=False, error="disk full", queued=False),
    wire.Stopped(attempt=1),
    wire.PortFound(port=29500),
    wire.LeaseAnswered(verb="poll", reply={"state": "ready"}),
]


def channels() -> tuple[wire.Channel, wire.Channel]:
    a, b = socket.socketpair()
    keeper = wire.Channel(a, b"s" * 32, b"n" * 32, keeper=True)
    return keeper, wire.Channel(b, b"s" * 32, b"n" * 32, keeper=False)


@pytest.mark.parametrize("message", KEEPER_TO_MEMBER, ids=lambda m: type(m).__name__)
def test_a_keepers_message_round_trips_to_its_member(message: Message) -> None:
    keeper, member = channels()
    keeper.tell(message)
    heard = member.hear()
    assert type(heard) is type(message) and heard.as_dict() == message.as_dict()
    # what decisions.py sends, as data, is the same message
    assert wire.for_member(wire.record(message)).as_dict() == message.as_dict()


@pytest.mark.parametrize("message", MEMBER_TO_KEEPER, ids=lambda m: type(m).__name__)
def test_a_members_message_round_trips_to_its_keeper(message: Message) -> None:
    keeper, member = channels()
    member.tell(message)
    heard = keeper.hear()
    assert type(heard) is type(message) and heard.as_dict() == message.as_dict()


def test_a_members_message_of_the_wrong_type_names_its_host() -> None:
    keeper, member = channels()
    keeper.host = "node3"
    member.send({"k": "port", "port": "29500"})
    with pytest.raises(MessageError, match=r"PortFound\.port from node3 is str, not int"):
        keeper.hear()


def test_unknown_kinds_and_fields_are_tolerated() -> None:
    keeper, member = channels()
    keeper.send({"k": "from-a-newer-keeper"})
    keeper.send({"k": "stop", "attempt": 2, "why": "newer"})
    assert member.hear() is None
    assert member.hear() == wire.Stop(attempt=2)


def test_every_message_the_keeper_decides_is_one_a_member_takes() -> None:
    with pytest.raises(MessageError, match="no message to a member"):
        wire.for_member({"k": "hello", "host": "x"})


# ---------------------------------------------------------------- the job record's spec


def test_a_records_spec_reads_typed() -> None:
    spec = {
        "args": ["--lr", "1"],
        "outputs": ["ckpt/"],
        "restarts": 2,
        "attempt": 1,
        "attempts": [{"attempt": 0, "nodes": [{"host": "a", "state": "lost"}]}],
        "ssh": {"keeper": {"host": "a", "dir": "~/x", "hosts": {}}},
        "slurm": {"job_id": "7"},  # another backend's field: not this job's
        "from_a_newer_orch": 1,
    }
    view = SpecView.of(spec)
    assert (view.args, view.outputs, view.restarts, view.attempt) == (
        ("--lr", "1"),
        ("ckpt/",),
        2,
        1,
    )
    assert view.attempts[0].attempt == 0 and view.attempts[0].nodes[0]["state"] == "lost"
    assert view.own == spec["ssh"] and view.backend == "ssh"
    assert SpecView.of({**spec, "backend": "slurm"}).own == {"job_id": "7"}
    empty = SpecView.of({})  # a record written before any of these keys
    assert (empty.attempt, empty.restarts, empty.attempts, empty.own) == (0, 0, (), None)


def test_a_detached_jobs_keeper_is_read_from_the_ssh_backends_own_field_and_from_an_older_record() -> (
    None
):
    from orchestrator.models.states import JobState
    from orchestrator.records.db import JobRecord
    from orchestrator.ssh.keep import keeper_of, note

    keeper = {"host": "a", "at": "b", "dir": "~/x", "hosts": {}}
    now = JobRecord("j-1", "j", JobState.RUNNING, "10.77.0.11", None, {"ssh": {"keeper": keeper}})
    older = JobRecord("j-2", "j", JobState.RUNNING, "10.77.0.11", None, {"keeper": keeper})
    plain = JobRecord("j-3", "j", JobState.RUNNING, "10.77.0.11", None, {"restarts": 1})
    assert keeper_of(now) == keeper_of(older) == keeper and keeper_of(plain) is None
    assert (
        note(JobRecord(**{**now.__dict__, "spec": {**now.spec, "restarts": 1}})) == " (kept by b)"
    )
