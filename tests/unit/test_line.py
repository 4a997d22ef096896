"""A detached job's wait in line, run by its keeper (agent/kernel/line.py): the
rounds of poll, take, untake and go, driven by fake member answers, and how the
keeper goes on from them."""

from __future__ import annotations

from typing import Any

from orchestrator.agent.keeper.decisions import Keeping
from orchestrator.agent.kernel import line, placement
from orchestrator.agent.kernel.lease_wire import LeaseState
from orchestrator.agent.kernel.line import Line, Outcome
from orchestrator.agent.kernel.messages import parse_message
from tests.unit.keeping_driver import Driven

HOSTS = ["node1", "node2"]
WAITING = {"state": "waiting", "info": {"kind": "slot", "want": 2, "position": 1}}


def hear(
    waiting: Line, host: str, verb: str, reply: dict[str, Any], now: float
) -> tuple[list[tuple[str, str]], Outcome | None]:
    """A host's answer to `verb`, parsed as the controller and the keeper parse it."""
    return waiting.hear(host, verb, parse_message(LeaseState, reply, host), now)


def answer(kept: Line | Driven, verb: str, replies: dict[str, Any], now: float) -> list[Any]:
    """Every host's answer to `verb`; what was sent after the last one."""
    sends: list[Any] = []
    for host, reply in replies.items():
        if isinstance(kept, Line):
            sends = hear(kept, host, verb, reply, now)[0]
        else:
            sends = kept.hear(host, {"k": "lease", "verb": verb, "reply": reply}, now)
    return sends


def verbs(sends: list[Any]) -> list[tuple[str, str]]:
    """(host, verb) of a line's asks, or of a keeper's messages."""
    return [
        (host, sent if isinstance(sent, str) else str(sent.get("verb", sent["k"])))
        for host, sent in sends
    ]


def test_nodes_are_polled_until_none_waits_then_taken_then_told_to_go() -> None:
    waiting = Line(HOSTS)
    assert waiting.tick(0.0, ready=False) == []  # a member not there yet
    assert verbs(waiting.tick(0.0, ready=True)) == [("node1", "poll"), ("node2", "poll")]
    assert waiting.tick(0.1, ready=True) == []  # answers awaited
    sends, outcome = hear(waiting, "node1", "poll", {"state": "ready"}, 0.2)
    assert (sends, outcome) == ([], None)
    sends, outcome = hear(waiting, "node2", "poll", WAITING, 0.2)
    assert (sends, outcome) == ([], None)
    assert {h: w.as_dict() for h, w in waiting.waiting.items()} == {"node2": WAITING["info"]}
    assert waiting.tick(0.3, ready=True) == []  # the next round after POLL_S
    assert len(waiting.tick(0.2 + line.POLL_S, ready=True)) == 2
    ready = {"node1": {"state": "ready"}, "node2": {"state": "ready"}}
    assert verbs(answer(waiting, "poll", ready, 1.0)) == [("node1", "take"), ("node2", "take")]
    taken = {h: {"state": "taken", "units": [0, 1]} for h in HOSTS}
    assert verbs(answer(waiting, "take", taken, 1.1)) == [("node1", "go"), ("node2", "go")]
    hear(waiting, "node1", "go", {"pid": 11}, 1.2)
    _, outcome = hear(waiting, "node2", "go", {"error": "disk full"}, 1.2)
    assert outcome is not None and outcome.started["node2"].as_dict() == {"error": "disk full"}


def test_a_refused_take_gives_back_the_leases_taken_and_waits_on() -> None:
    waiting = Line(HOSTS)
    waiting.tick(0.0, ready=True)
    answer(waiting, "poll", {h: {"state": "ready"} for h in HOSTS}, 0.1)
    refused = {"node1": {"state": "taken", "units": [0]}, "node2": WAITING}
    assert verbs(answer(waiting, "take", refused, 0.2)) == [("node1", "untake")]
    assert hear(waiting, "node1", "untake", {}, 0.3) == ([], None)  # ignored
    assert verbs(waiting.tick(0.2 + line.POLL_S, ready=True))[0] == ("node1", "poll")


def test_a_node_that_left_the_line_ends_the_wait_with_why() -> None:
    waiting = Line(HOSTS)
    waiting.tick(0.0, ready=True)
    gone = {
        "state": "ended",
        "ended": {"returncode": None, "error": "killed while it waited in line"},
    }
    hear(waiting, "node1", "poll", {"state": "ready"}, 0.1)
    _, outcome = hear(waiting, "node2", "poll", gone, 0.1)
    assert outcome is not None and "killed while it waited" in outcome.left["node2"]


def test_a_node_alone_is_only_watched_never_taken_for() -> None:
    waiting = Line(["node1"], alone=True)
    waiting.tick(0.0, ready=True)
    assert hear(waiting, "node1", "poll", {"state": "ready"}, 0.1) == ([], None)
    waiting.tick(1.0, ready=True)
    _, outcome = hear(waiting, "node1", "poll", {"state": "started"}, 1.1)
    assert outcome is not None and outcome.started == {"node1": LeaseState(state="started")}


def test_a_member_that_does_not_answer_is_overdue() -> None:
    waiting = Line(HOSTS)
    waiting.tick(0.0, ready=True)
    hear(waiting, "node1", "poll", WAITING, 0.1)
    assert waiting.overdue(line.REPLY_WAIT_S - 1) == set()
    assert waiting.overdue(line.REPLY_WAIT_S + 1) == {"node2"}


def queued_keeper(restarts: int = 2) -> Driven:
    config = {
        "job_id": "j-1",
        "restarts": restarts,
        "lost_after": 3,
        "rendezvous_port": None,
        "line": "together",
        "place": placement.placement(HOSTS, [1, 1], "10.0.0.1", 29500),
        "candidates": [
            {"host": h, "nproc": 1, "addr": f"10.0.0.{h[-1]}", "workdir": "~/.orch"}
            for h in [*HOSTS, "node3"]
        ],
    }
    kept = Driven(Keeping(config, now=0.0))
    for host in [*HOSTS, "node3"]:
        kept.hear(host, {"k": "hello", "host": host}, 0.0)
    return kept


def test_a_keeper_starts_its_queued_nodes_together_then_runs_the_job() -> None:
    kept = queued_keeper()
    assert kept.record()["state"] == "queued"
    assert [n["state"] for n in kept.record()["current"]["nodes"]] == ["queued", "queued"]
    assert verbs(kept.tick(0.1)) == [("node1", "poll"), ("node2", "poll")]
    answer(kept, "poll", {h: {"state": "ready"} for h in HOSTS}, 0.2)
    answer(kept, "take", {h: {"state": "taken"} for h in HOSTS}, 0.3)
    answer(kept, "go", {h: {"pid": 7} for h in HOSTS}, 0.4)
    assert kept.record()["state"] == "running"
    for t in (1.0, 2.0, 3.0, 4.0):  # heartbeats while it runs
        for host in [*HOSTS, "node3"]:
            kept.hear(host, {"k": "hb"}, t)
        assert kept.tick(t) == []
    sends = kept.hear("node2", {"k": "end", "attempt": 0, "returncode": 1}, 5.0)
    assert verbs(sends) == [("node1", "stop")]  # restarts as any running job


def test_orch_kill_of_a_queued_job_stops_its_nodes_in_line() -> None:
    kept = queued_keeper()
    kept.tick(0.1)
    assert verbs(kept.stop(0.2)) == [("node1", "stop"), ("node2", "stop")]
    kept.hear("node1", {"k": "stopped", "attempt": 0}, 0.3)
    kept.hear("node2", {"k": "stopped", "attempt": 0}, 0.3)
    assert kept.done and kept.record()["state"] == "killed"


def test_a_node_that_left_the_line_stops_the_others_and_nothing_restarts() -> None:
    kept = queued_keeper(restarts=2)
    kept.tick(0.1)
    gone = {"state": "gone", "error": "the node's supervisor vanished while in line"}
    sends = answer(kept, "poll", {"node1": WAITING, "node2": gone}, 0.2)
    assert verbs(sends) == [("node1", "stop")]
    sends = kept.hear("node1", {"k": "stopped", "attempt": 0}, 0.3)
    assert kept.done and kept.record()["state"] == "failed"
    assert "vanished" in kept.nodes["node2"]["error"]
    assert ("node1", "start") not in verbs(sends)


def test_a_member_silent_while_in_line_ends_the_wait() -> None:
    kept = queued_keeper()
    kept.tick(0.1)
    kept.hear("node1", {"k": "hb"}, 3.5)
    kept.hear("node3", {"k": "hb"}, 3.5)
    assert verbs(kept.tick(3.5)) == [("node1", "stop")]  # node2 silent for 3.5 s > 3
    assert kept.nodes["node2"]["state"] == "lost"


def test_a_restart_on_shared_hosts_waits_its_turn_before_it_runs() -> None:
    kept = queued_keeper()
    kept.tick(0.1)
    answer(kept, "poll", {h: {"state": "ready"} for h in HOSTS}, 0.2)
    answer(kept, "take", {h: {"state": "taken"} for h in HOSTS}, 0.3)
    answer(kept, "go", {h: {"pid": 7} for h in HOSTS}, 0.4)
    kept.hear("node2", {"k": "end", "attempt": 0, "returncode": 1}, 1.0)
    kept.hear("node1", {"k": "stopped", "attempt": 0}, 1.1)
    sends = kept.hear("node1", {"k": "port", "port": 40001}, 1.2)
    assert verbs(sends) == [("node1", "start"), ("node3", "start")]  # the spare for node2
    assert sends[0][1]["place"]["ticket"][1] == "j-1"  # one ticket for both hosts' lines
    now = ["node1", "node3"]
    kept.hear("node1", {"k": "started", "attempt": 1, "ok": True, "queued": True}, 1.3)
    sends = kept.hear("node3", {"k": "started", "attempt": 1, "ok": True, "queued": True}, 1.3)
    assert verbs(sends) == [("node1", "poll"), ("node3", "poll")]
    assert kept.record()["state"] == "queued" and kept.record()["current"]["attempt"] == 1
    answer(kept, "poll", {h: {"state": "ready"} for h in now}, 1.4)
    answer(kept, "take", {h: {"state": "taken"} for h in now}, 1.5)
    answer(kept, "go", {h: {"pid": 8} for h in now}, 1.6)
    assert kept.record()["state"] == "running"


def test_a_lease_answer_of_the_wrong_type_is_no_answer_and_the_rounds_go_on() -> None:
    kept = queued_keeper()
    kept.tick(0.1)
    sends = answer(kept, "poll", {"node1": {"state": "ready"}, "node2": {"state": 5}}, 0.2)
    assert sends == [] and kept.record()["state"] == "queued"  # no take: node2 not ready
    assert verbs(kept.tick(0.2 + line.POLL_S)) == [("node1", "poll"), ("node2", "poll")]
