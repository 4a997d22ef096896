"""A detached job's keeper, the pure parts: the next attempt's commands
rendered on the hosts as the plan renders them, the keeper's decisions driven by fake
member messages, and the wire's authentication."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.keeper import wire
from orchestrator.agent.keeper.decisions import Keeping
from orchestrator.agent.kernel import placement
from orchestrator.models import placeholders
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host
from orchestrator.models.job import LAUNCHERS, JobSpec, load_job
from orchestrator.ssh.plan import build_plan, node_template
from tests.unit.conftest import WriteFile
from tests.unit.keeping_driver import Driven

HOSTS = [Host(name=f"node{i}", address=f"10.77.0.{10 + i}") for i in (1, 2, 3)]


@pytest.fixture
def job(write: WriteFile, tmp_path: Path) -> JobSpec:
    (tmp_path / "train.py").write_text("")
    return load_job(
        write(
            "job.yaml",
            "script: train.py\nnodes: 2\nrestarts: 2\n"
            "args: [--rank, '{node_rank}', --at, '{master_addr}:{master_port}', '{{x}']\n"
            "env: {WORLD: '{world_size}', TOKEN: secret}\n",
        )
    )


# ---------------------------------------------------------------- rendering


def test_a_keeper_renders_the_next_attempt_as_the_plan_does(job: JobSpec) -> None:
    facts = {h.name: HostFacts(iface="eth0", local_addr=h.address) for h in HOSTS}
    expected = build_plan(job, [HOSTS[0], HOSTS[2]], "j-1", "10.77.0.11", 29511, facts, (), 1)
    place = placement.placement(["node1", "node3"], [1, 1], "10.77.0.11", 29511, 1)
    for node in expected.nodes:
        template = node_template(job, node.host, facts[node.host.name], "j-1")
        argv, env, job_dir = placement.render(template, place)
        assert (tuple(argv), env, job_dir) == (node.argv, node.env, node.job_dir)
    assert expected.nodes[1].env["ORCH_ATTEMPT"] == "1"
    assert expected.nodes[1].job_dir.endswith("/jobs/j-1/node3.attempt1")
    assert "--rank" in expected.nodes[1].argv and "1" in expected.nodes[1].argv


def test_a_template_is_json_and_holds_placeholders_unexpanded(job: JobSpec) -> None:
    template = node_template(job, HOSTS[1], HostFacts(), "j-1")
    assert "{node_rank}" in template.args and template.env["WORLD"] == "{world_size}"
    assert template.addr == "10.77.0.12"


@pytest.mark.parametrize(
    "text", ["{node_rank}-{world_size}", "{{node_rank}", "${HOME}/{nproc}", '{"lr": 0.1}', "}{"]
)
def test_the_agents_expansion_agrees_with_the_job_loaders_names(text: str) -> None:
    values = {name: f"<{name}>" for name in placeholders.NAMES}
    assert placement.expand(text, values) == placeholders.expand(text, values)


def test_the_agent_knows_every_launcher() -> None:
    assert {placement.TORCHRUN, placement.PYTHON, placement.LEGACY_LAUNCH} == set(LAUNCHERS)


# ---------------------------------------------------------------- decisions


def keeping(hosts: list[str], candidates: list[str], restarts: int = 1) -> Driven:
    config = {
        "job_id": "j-1",
        "restarts": restarts,
        "lost_after": 3,
        "rendezvous_port": None,
        "place": placement.placement(hosts, [1] * len(hosts), "10.0.0.1", 29500),
        "candidates": [
            {"host": h, "nproc": 1, "addr": f"10.0.0.{h[-1]}", "workdir": "~/.orch"}
            for h in candidates
        ],
    }
    kept = Driven(Keeping(config, now=0.0, wall=lambda: 1700000000.0))
    for host in candidates:
        kept.hear(host, {"k": "hello", "host": host}, 0.0)
    return kept


def kinds(sends: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(host, str(message["k"])) for host, message in sends]


def test_a_failure_before_another_member_said_hello_waits_for_that_member() -> None:
    """node2's rank fails at once and its member says so before node1's member has
    connected (its SSH command still starting): node1 is not taken for lost; it gets
    its stop when it says hello, and the job starts again on both hosts."""
    kept = keeping(["node1", "node2"], ["node1", "node2"])
    kept.gone("node1")
    kept.keeping.greeted.discard("node1")  # as if node1's member never said hello
    sends = kept.hear("node2", {"k": "end", "attempt": 0, "returncode": 3}, 0.5)
    assert sends == [] and kept.nodes["node1"]["state"] == "running"
    assert kinds(kept.tick(5.0)) == []  # past lost_after (3 s): a first hello may take longer
    kept.hear("node2", {"k": "hb"}, 5.5)
    sends = kept.hear("node1", {"k": "hello", "host": "node1"}, 6.0)
    assert kinds(sends) == [("node1", "stop")]
    sends = kept.hear("node1", {"k": "end", "attempt": 0, "returncode": 3}, 6.1)
    assert kinds(sends) == [("node1", "port")]
    assert kept.record()["state"] == "restarting"


def test_a_member_that_never_says_hello_is_lost_once_a_hello_is_overdue() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2"], restarts=0)
    kept.gone("node1")
    kept.keeping.greeted.discard("node1")
    kept.hear("node2", {"k": "end", "attempt": 0, "returncode": 3}, 0.5)
    kept.tick(10.0)
    assert kept.nodes["node1"]["state"] == "running"  # still awaited
    kept.tick(45.0)  # HELLO_WAIT_S (30 s) without a word
    assert kept.nodes["node1"]["state"] == "lost" and kept.record()["state"] == "failed"


def test_a_failed_node_stops_the_others_then_the_job_starts_again_as_the_next_attempt() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2"])
    sends = kept.hear("node2", {"k": "end", "attempt": 0, "returncode": 3}, 1.0)
    assert kinds(sends) == [("node1", "stop")]
    assert kept.record()["state"] == "restarting"
    sends = kept.hear("node1", {"k": "stopped", "attempt": 0}, 2.0)
    assert kinds(sends) == [("node1", "port")]  # the first restart comes at once
    sends = kept.hear("node1", {"k": "port", "port": 40001}, 2.1)
    assert kinds(sends) == [("node1", "start"), ("node2", "start")]
    place = sends[0][1]["place"]
    expected = placement.placement(["node1", "node2"], [1, 1], "10.0.0.1", 40001, 1)
    assert place == {**expected, "ticket": [1700000000.0, "j-1"]}  # its place in line
    assert kept.record()["current"]["attempt"] == 0  # shown once every node started
    kept.hear("node1", {"k": "started", "attempt": 1, "ok": True}, 3.0)
    kept.hear("node2", {"k": "started", "attempt": 1, "ok": True}, 3.0)
    record = kept.record()
    assert record["state"] == "running" and record["current"]["attempt"] == 1
    assert record["current"]["nodes"][1]["job_dir"] == "~/.orch/jobs/j-1/node2.attempt1"
    (earlier,) = record["attempts"]
    assert earlier["reason"] == "attempt 1 failed on node2"
    assert [(n["host"], n["state"], n["exit_code"]) for n in earlier["nodes"]] == [
        ("node1", "killed", None),
        ("node2", "failed", 3),
    ]
    for host in ("node1", "node2"):
        sends = kept.hear(host, {"k": "end", "attempt": 1, "returncode": 0}, 9.0)
    assert kinds(sends) == [("node1", "bye"), ("node2", "bye")]
    assert kept.done and kept.record()["state"] == "succeeded"


def test_a_silent_host_is_lost_and_a_spare_takes_its_place() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2", "node3"])
    for t in (1.0, 2.0, 3.0, 4.0):
        kept.hear("node1", {"k": "hb"}, t)
        kept.hear("node3", {"k": "hb"}, t)
    sends = kept.tick(4.0)  # node2 silent for 4 s > lost_after 3
    assert kinds(sends) == [("node1", "stop")]
    kept.hear("node1", {"k": "stopped", "attempt": 0}, 4.5)
    sends = kept.hear("node1", {"k": "port", "port": 40002}, 4.6)
    assert [h for h, _ in sends] == ["node1", "node3"]
    assert sends[0][1]["place"]["hosts"] == ["node1", "node3"]
    assert kept.history[0]["reason"] == "attempt 1 lost on node2"


def test_a_spare_whose_member_never_came_is_not_chosen() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2"])
    kept.candidates["node3"] = {"host": "node3", "nproc": 1, "addr": "x", "workdir": "~"}
    kept.order.append("node3")
    kept.heard["node3"] = 0.0
    kept.hear("node2", {"k": "end", "attempt": 0, "returncode": 1}, 1.0)
    sends = kept.hear("node1", {"k": "stopped", "attempt": 0}, 1.5)
    kept.hear("node1", {"k": "port", "port": 1}, 1.6)
    assert kept.place["hosts"] == ["node1", "node2"] and kinds(sends) == [("node1", "port")]


def test_orch_kill_stops_every_node_and_nothing_starts_again() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2", "node3"])
    sends = kept.stop(1.0)
    assert kinds(sends) == [("node1", "stop"), ("node2", "stop")]
    kept.hear("node1", {"k": "end", "attempt": 0, "returncode": -15, "killed": True}, 1.2)
    sends = kept.hear("node2", {"k": "stopped", "attempt": 0}, 1.3)
    assert kinds(sends) == [("node1", "bye"), ("node2", "bye"), ("node3", "bye")]
    assert kept.done and kept.record()["state"] == "killed" and not kept.history


def test_a_node_found_killed_by_someone_else_is_taken_as_a_kill() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2"])
    sends = kept.hear("node2", {"k": "end", "attempt": 0, "returncode": -15, "killed": True}, 1)
    assert kinds(sends) == [("node1", "stop")]
    sends = kept.hear("node1", {"k": "stopped", "attempt": 0}, 2.0)
    assert kept.record()["state"] == "killed" and ("node1", "start") not in kinds(sends)


def test_with_no_restart_left_the_job_fails_and_the_members_are_dismissed() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2"], restarts=0)
    kept.hear("node1", {"k": "end", "attempt": 0, "returncode": 1}, 1.0)
    sends = kept.hear("node2", {"k": "stopped", "attempt": 0}, 1.5)
    assert kinds(sends) == [("node1", "bye"), ("node2", "bye")]
    assert kept.record()["state"] == "failed"


def test_a_lost_host_without_spares_ends_the_job() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2"])
    kept.hear("node1", {"k": "hb"}, 3.5)
    kept.tick(3.5)
    kept.hear("node1", {"k": "stopped", "attempt": 0}, 3.6)
    record = kept.record()
    assert record["state"] == "failed"
    assert "too few hosts" in str(kept.reason)


def test_a_node_that_cannot_start_fails_the_attempt() -> None:
    kept = keeping(["node1", "node2"], ["node1", "node2"], restarts=2)
    kept.hear("node2", {"k": "end", "attempt": 0, "returncode": 1}, 1.0)
    kept.hear("node1", {"k": "stopped", "attempt": 0}, 1.1)
    kept.hear("node1", {"k": "port", "port": 5}, 1.2)
    kept.hear("node1", {"k": "started", "attempt": 1, "ok": True}, 1.3)
    sends = kept.hear("node2", {"k": "started", "attempt": 1, "ok": False, "error": "disk"}, 1.4)
    assert kinds(sends) == [("node1", "stop")]
    assert kept.nodes["node2"]["error"] == "disk"


# ---------------------------------------------------------------- wire


def test_messages_are_authenticated_both_ways_and_a_tampered_one_is_refused() -> None:
    a, b = socket.socketpair()
    keeper_side = wire.Channel(a, b"s" * 32, b"n" * 32, keeper=True)
    member_side = wire.Channel(b, b"s" * 32, b"n" * 32, keeper=False)
    keeper_side.send({"k": "stop", "attempt": 0})
    assert member_side.receive() == {"k": "stop", "attempt": 0}
    member_side.send({"k": "hb"})
    assert keeper_side.receive() == {"k": "hb"}
    keeper_side.send({"k": "bye"})
    forged = wire.Channel(a, b"t" * 32, b"n" * 32, keeper=True)
    forged.sent = keeper_side.sent
    forged.send({"k": "start"})
    member_side.receive()
    with pytest.raises(ValueError, match="authentication"):
        member_side.receive()
    keeper_side.close()
    member_side.close()


def test_a_member_without_the_secret_gets_no_channel() -> None:
    a, b = socket.socketpair()
    b.sendall(b"x" * 32)
    assert wire.greet(a, b"s" * 32) is None
    b.close()


def test_a_member_gets_longer_to_say_hello_than_to_keep_talking() -> None:
    config = {
        "job_id": "j-1",
        "restarts": 1,
        "lost_after": 3,
        "rendezvous_port": None,
        "place": placement.placement(["node1", "node2"], [1, 1], "10.0.0.1", 29500),
        "candidates": [
            {"host": h, "nproc": 1, "addr": "x", "workdir": "~"} for h in ("node1", "node2")
        ],
    }
    kept = Driven(Keeping(config, now=0.0))
    kept.hear("node1", {"k": "hello", "host": "node1"}, 0.5)
    for t in range(1, 30, 2):
        kept.hear("node1", {"k": "hb"}, float(t))
        assert kept.tick(float(t)) == []
    assert kinds(kept.tick(31.0)) == [("node1", "stop")]
    assert kept.nodes["node2"]["state"] == "lost"
