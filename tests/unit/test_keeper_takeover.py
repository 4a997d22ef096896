"""A member takes over a detached job's keeper when the keeper's host is lost: who
does (the order every member follows), one epoch later, and how the new keeper goes
on from the old one's snapshot; a keeper that reaches too few members starts nothing."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.agent.keeper.decisions import GATHER_S, Keeping, successors
from orchestrator.agent.kernel import placement
from orchestrator.ssh.keep import current_keeper
from tests.unit.keeping_driver import Driven

LOST_AFTER = 3.0


def keeping(hosts: list[str], candidates: list[str], restarts: int = 1) -> Driven:
    config = {
        "job_id": "j-1",
        "restarts": restarts,
        "lost_after": LOST_AFTER,
        "rendezvous_port": None,
        "host": hosts[0],
        "place": placement.placement(hosts, [1] * len(hosts), "10.0.0.1", 29500),
        "candidates": [
            {"host": h, "nproc": 1, "addr": f"10.0.0.{h[-1]}", "workdir": "~/.orch"}
            for h in candidates
        ],
    }
    kept = Driven(Keeping(config, now=0.0, wall=lambda: 1700000000.0))
    for port, host in enumerate(candidates, 40100):
        kept.hear(host, {"k": "hello", "host": host, "port": port}, 0.0)
    return kept


def shared(kept: Driven) -> dict[str, Any]:
    """The snapshot as a member holds it: it crossed the wire as JSON."""
    snapshot: dict[str, Any] = json.loads(json.dumps(kept.snapshot()))
    return snapshot


def kinds(sends: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(host, str(message["k"])) for host, message in sends]


def test_the_members_take_over_in_node_rank_order_then_spares_the_lost_keeper_left_out() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2", "node3"])
    assert successors(shared(kept)) == ["node2", "node3"]


def test_a_member_that_cannot_keep_or_no_longer_talks_to_the_keeper_is_passed_over() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2", "node3", "node4"])
    kept.hear("node2", {"k": "hello", "host": "node2", "port": None}, 0.5)  # no standby port
    kept.gone("node3")
    assert successors(shared(kept)) == ["node4"]


def test_the_new_keeper_is_one_epoch_later_and_says_where_it_keeps() -> None:
    old = keeping(["node1", "node2"], ["node1", "node2", "node3"])
    new = Driven(Keeping.take_over(shared(old), "node2", now=10.0))
    assert (old.record()["epoch"], old.record()["keeper"]) == (0, "node1")
    assert (new.record()["epoch"], new.record()["keeper"]) == (1, "node2")
    assert new.record()["state"] == "running"  # the nodes run on while it takes over
    again = Driven(Keeping.take_over(shared(new), "node3", now=20.0))
    assert again.epoch == 2 and successors(shared(new)) == []  # none talked to it yet


def test_the_new_keeper_restarts_the_job_on_the_surviving_hosts_after_the_master_is_lost() -> None:
    old = keeping(["node1", "node2"], ["node1", "node2", "node3"])
    new = Driven(Keeping.take_over(shared(old), "node2", now=10.0))
    new.hear("node2", {"k": "hello", "host": "node2", "port": 40101}, 10.1)
    assert new.tick(10.2) == []  # node3 may still be on its way
    new.hear("node3", {"k": "hello", "host": "node3", "port": 40102}, 10.5)
    sends = new.tick(10.6)
    assert kinds(sends) == [("node2", "stop")]  # node1, the old master, is lost
    assert new.nodes["node1"]["state"] == "lost"
    sends = new.hear("node2", {"k": "stopped", "attempt": 0}, 11.0)
    assert kinds(sends) == [("node3", "port")]  # the spare takes node1's place, rank 0
    sends = new.hear("node3", {"k": "port", "port": 40500}, 11.1)
    assert kinds(sends) == [("node3", "start"), ("node2", "start")]
    place = sends[0][1]["place"]
    assert place["hosts"] == ["node3", "node2"] and place["master_addr"] == "10.0.0.3"
    for host in ("node2", "node3"):
        new.hear(host, {"k": "started", "attempt": 1, "ok": True}, 12.0)
    record = new.record()
    assert record["state"] == "running" and record["current"]["attempt"] == 1
    assert record["attempts"][0]["reason"] == "attempt 1 lost on node1"


def test_a_member_that_never_comes_to_the_new_keeper_is_lost_once_the_gathering_ends() -> None:
    old = keeping(["node1", "node2"], ["node1", "node2", "node3", "node4", "node5"])
    new = Driven(Keeping.take_over(shared(old), "node3", now=10.0))
    for host in ("node3", "node4", "node5"):
        new.hear(host, {"k": "hello", "host": host, "port": 1}, 10.1)
    end = 10.0 + LOST_AFTER + GATHER_S
    for host in ("node3", "node4", "node5"):
        new.hear(host, {"k": "hb"}, end - 1.0)
    assert new.tick(end - 0.5) == []
    sends = new.tick(end + 0.1)  # neither node's member came back: nothing to stop
    assert kinds(sends) == [("node3", "port")]
    assert new.history == [] and new.chosen == ["node3", "node4"]
    assert {h: n["state"] for h, n in new.nodes.items()} == {"node1": "lost", "node2": "lost"}


def test_a_keeper_that_reaches_too_few_members_starts_nothing_and_dismisses_them() -> None:
    old = keeping(["node1", "node2"], ["node1", "node2", "node3"])
    new = Driven(Keeping.take_over(shared(old), "node2", now=10.0))
    new.hear("node2", {"k": "hello", "host": "node2", "port": 40101}, 10.1)
    sends = new.tick(10.0 + LOST_AFTER + GATHER_S + 0.1)
    assert kinds(sends) == [("node2", "bye")]
    assert new.done and new.record()["state"] == "failed" and new.record()["gave_way"]
    assert "its keeper on node2 reached only 1 of 3 members" in str(new.reason)
    assert new.nodes["node2"]["state"] == "running"  # left for the keeper that has them


def test_an_old_keeper_cut_off_from_the_other_members_never_starts_an_attempt() -> None:
    old = keeping(["node1"], ["node1", "node2", "node3"], restarts=2)
    for t in (1.0, 2.0, 3.0, 4.0):
        old.hear("node1", {"k": "hb"}, t)
    old.hear("node1", {"k": "end", "attempt": 0, "returncode": 1}, 4.0)
    sends = old.tick(4.1)
    assert all(kind not in ("port", "start") for _, kind in kinds(sends)), sends
    assert old.done and old.record()["state"] == "failed" and old.record()["gave_way"]
    assert "reached only" in str(old.reason)


def test_a_new_keeper_finishes_a_kill_its_lost_keeper_began_and_starts_nothing() -> None:
    old = keeping(["node1", "node2"], ["node1", "node2", "node3"])
    old.stop(1.0)
    new = Driven(Keeping.take_over(shared(old), "node2", now=10.0))
    for host in ("node2", "node3"):
        new.hear(host, {"k": "hello", "host": host, "port": 1}, 10.1)
    assert kinds(new.tick(10.2)) == [("node2", "stop")]
    sends = new.hear("node2", {"k": "stopped", "attempt": 0}, 10.5)
    assert kinds(sends) == [("node2", "bye"), ("node3", "bye")]
    assert new.record()["state"] == "killed"


def test_the_controller_follows_the_latest_keeper_that_did_not_give_way() -> None:
    def reply(epoch: int, alive: bool, gave_way: bool = False) -> dict[str, Any]:
        return {"record": {"epoch": epoch, "gave_way": gave_way, "current": {}}, "alive": alive}

    moved = {"node1": reply(0, False), "node2": reply(1, True)}
    assert current_keeper(moved, at="node1") == "node2"
    cut_off = {"node1": reply(0, True), "node2": reply(1, False, gave_way=True)}
    assert current_keeper(cut_off, at="node1") == "node1"
    assert current_keeper({"node1": reply(0, False), "node3": reply(0, True)}, "node1") == "node3"
