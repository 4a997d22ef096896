"""A detached job's stall watchdog, the keeper's decisions (agent/keeper/decisions.py)
driven by fake member messages: silence judged from the members' heartbeats on their
hosts' clocks, every node's stacks asked for, kept, then the attempt stopped as failed
(restarts apply) or, `on_stall: warn`, only kept, once per stall."""

from __future__ import annotations

from typing import Any

from orchestrator.agent.keeper.decisions import Keeping
from orchestrator.agent.keeper.stall import STACK_WAIT_S
from orchestrator.agent.kernel import placement
from tests.unit.keeping_driver import Driven

HOSTS = ["node1", "node2"]


def keeping(on_stall: str = "fail", restarts: int = 1) -> Driven:
    config = {
        "job_id": "j-1",
        "restarts": restarts,
        "lost_after": 3,
        "rendezvous_port": None,
        "place": placement.placement(HOSTS, [1, 1], "10.0.0.1", 29500),
        "candidates": [
            {"host": h, "nproc": 1, "addr": f"10.0.0.{h[-1]}", "workdir": "~/.orch"} for h in HOSTS
        ],
        "stall_after": 10,
        "on_stall": on_stall,
        "pyspy": {"x86_64": "ab" * 32},
    }
    kept = Driven(Keeping(config, now=0.0, wall=lambda: 1700000000.0))
    for host in HOSTS:
        kept.hear(host, {"k": "hello", "host": host}, 0.0)
    return kept


def beat(kept: Driven, now: float, **idle: float | None) -> list[tuple[str, Any]]:
    """Every member's heartbeat at `now`, with its node's silence, then a tick."""
    for host in HOSTS:
        kept.hear(host, {"k": "hb", "idle": idle.get(host)}, now)
    return kept.tick(now)


def kinds(sends: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(host, str(message["k"])) for host, message in sends]


def taken(host: str, rank: int) -> dict[str, Any]:
    return {"k": "stacks", "attempt": 0, "reply": {"ranks": [{"rank": rank, "via": "py-spy"}]}}


def test_a_job_silent_everywhere_gets_its_stacks_taken_then_fails_and_restarts() -> None:
    kept = keeping()
    assert beat(kept, 5.0, node1=5.0, node2=4.0) == []
    sends = beat(kept, 10.5, node1=10.5, node2=10.2)
    assert kinds(sends) == [("node1", "stacks"), ("node2", "stacks")]
    wanted = sends[0][1]
    assert wanted["tools_dir"] == "~/.orch/tools" and wanted["pyspy"] == {"x86_64": "ab" * 32}
    assert kept.hear("node1", taken("node1", 0), 11.0) == [], "waits for every node's"
    sends = kept.hear("node2", taken("node2", 1), 11.2)
    assert kinds(sends) == [("node1", "stop"), ("node2", "stop")]
    ((name, dump),) = kept.dumps
    assert dump["reason"] == "stalled: no output for 10 s"
    assert set(dump["replies"]) == {"node1", "node2"} and dump["unanswered"] == []
    assert kept.record()["stalls"] == [
        {"at": 1700000000.0, "attempt": 0, "dump": name, "action": "stopped"}
    ]
    kept.hear("node1", {"k": "stopped", "attempt": 0}, 12.0)
    sends = kept.hear("node2", {"k": "stopped", "attempt": 0}, 12.1)
    assert kinds(sends) == [("node1", "port")], "restarts: apply, on the same hosts"
    ended = kept.record()["current"]
    assert {n["state"] for n in ended["nodes"]} == {"failed"}
    assert {n["error"] for n in ended["nodes"]} == {"stalled: no output for 10 s"}
    assert ended["reason"] == "attempt 1 stalled: no output for 10 s"


def test_one_node_that_prints_keeps_the_job_from_stalling() -> None:
    kept = keeping()
    assert beat(kept, 30.0, node1=30.0, node2=0.5) == []
    assert beat(kept, 31.0, node1=31.0, node2=None) == [], "a node that did not say"
    assert kept.dumps == []


def test_stacks_that_do_not_all_come_are_kept_as_they_are_when_the_wait_ends() -> None:
    kept = keeping(restarts=0)
    beat(kept, 11.0, node1=11.0, node2=11.0)
    kept.hear("node1", taken("node1", 0), 12.0)
    sends = beat(kept, 12.0 + STACK_WAIT_S, node1=40.0, node2=40.0)
    assert kinds(sends) == [("node1", "stop"), ("node2", "stop")]
    assert kept.dumps[0][1]["unanswered"] == ["node2"]
    kept.hear("node1", {"k": "stopped", "attempt": 0}, 50.0)
    kept.hear("node2", {"k": "stopped", "attempt": 0}, 50.1)
    assert kept.record()["state"] == "failed", "no restart left"


def test_on_stall_warn_takes_the_stacks_once_per_stall_and_lets_the_job_run() -> None:
    kept = keeping(on_stall="warn")
    beat(kept, 11.0, node1=11.0, node2=11.0)
    kept.hear("node1", taken("node1", 0), 11.5)
    assert kept.hear("node2", taken("node2", 1), 11.6) == [], "no stop"
    assert beat(kept, 20.0, node1=20.0, node2=20.0) == [], "once per stall"
    assert beat(kept, 21.0, node1=0.2, node2=21.0) == [], "a line: the stall is over"
    sends = beat(kept, 32.0, node1=11.2, node2=32.0)
    assert kinds(sends) == [("node1", "stacks"), ("node2", "stacks")], "a stall of its own"
    assert [s["action"] for s in kept.record()["stalls"]] == ["warned"]
    assert kept.record()["state"] == "running"
