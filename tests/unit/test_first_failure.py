"""Which failure is named as the cause: the first in time on the hosts' clocks, as far
as their measured offsets can tell, else the first to arrive (reporting/failure.py)."""

from __future__ import annotations

from orchestrator.agent.kernel.host_wire import ProbeFacts
from orchestrator.agent.kernel.replies import ExitRecord
from orchestrator.models.clocks import HostClock, clocks_from_json
from orchestrator.nodes.probe import facts_from_probe
from orchestrator.reporting.failure import first_in_time
from orchestrator.reporting.follow import NodeExit
from orchestrator.ssh.watch import first_failure

IN_STEP = HostClock(-0.2, 0.2)  # a host whose clock agrees with this one's, give or take 0.2 s


def exit_at(host: str, host_time: float | None, code: int = 1, killed: bool = False) -> NodeExit:
    ended = (
        None if host_time is None else ExitRecord(returncode=code, ended=host_time, killed=killed)
    )
    return NodeExit(host, 0, ended, error="lost" if ended is None else None)


def test_a_secondary_failure_that_arrives_first_is_not_the_cause() -> None:
    arrived = [("node3", 1007.0), ("node2", 1004.0)]
    assert first_in_time(arrived, {"node2": IN_STEP, "node3": IN_STEP}) == 1


def test_a_host_clock_far_ahead_is_corrected_by_its_measured_offset() -> None:
    ahead = HostClock(29.9, 30.1)  # node2's clock runs 30 s ahead of this machine's
    # node2 failed at 1004 here (1034 on its clock), node3 at 1006: node2 was first ...
    arrived = [("node3", 1006.0), ("node2", 1034.0)]
    assert first_in_time(arrived, {"node2": ahead, "node3": IN_STEP}) == 1
    # ... and compared raw, its clock would have put it 28 s late.
    arrived = [("node2", 1034.0), ("node3", 1033.0)]
    assert first_in_time(arrived, {"node2": ahead, "node3": IN_STEP}) == 0


def test_failures_closer_than_the_clocks_are_known_keep_their_arrival_order() -> None:
    arrived = [("node3", 1000.3), ("node2", 1000.0)]  # 0.3 s apart, windows of 0.4 s
    assert first_in_time(arrived, {"node2": IN_STEP, "node3": IN_STEP}) == 0
    sure = {"node2": HostClock(0.0, 0.1), "node3": HostClock(0.0, 0.1)}
    assert first_in_time(arrived, sure) == 1  # measured tighter: told apart


def test_a_host_whose_clock_was_not_measured_keeps_the_arrival_order() -> None:
    arrived = [("node3", 1007.0), ("node2", 900.0)]
    assert first_in_time(arrived, {"node3": IN_STEP}) == 0
    assert first_in_time(arrived, {}) == 0


def test_a_lost_node_has_no_time_and_neither_takes_nor_loses_the_first_place() -> None:
    clocks = {"node2": IN_STEP, "node3": IN_STEP}
    assert first_in_time([("node4", None), ("node2", 1004.0)], clocks) == 0
    assert first_in_time([("node2", 1004.0), ("node4", None)], clocks) == 0


def test_the_earliest_of_many_wins_whatever_the_order_they_came_in() -> None:
    clocks = {f"node{i}": IN_STEP for i in range(1, 6)}
    arrived = [("node5", 1009.0), ("node1", 1005.0), ("node4", 1001.0), ("node2", 1003.0)]
    assert first_in_time(arrived, clocks) == 2


def test_a_node_orch_killed_is_never_named_before_the_one_that_failed() -> None:
    clocks = {"node1": HostClock(5.0, 5.2), "node3": IN_STEP}  # node1's clock 5 s ahead
    # node1 was killed by the teardown at 1008 here; its skewed stamp reads 1013,
    # and even a stamp that reads earlier than node3's failure is not compared.
    failures = [exit_at("node3", 1007.0, code=7), exit_at("node1", 1001.0, -15, killed=True)]
    assert first_failure(failures, clocks).host == "node3"


def test_first_failure_names_the_failed_node_not_the_secondary_that_came_first() -> None:
    clocks = {"node2": IN_STEP, "node3": IN_STEP, "node4": IN_STEP}
    failures = [exit_at("node3", 1007.0, code=7), exit_at("node4", None), exit_at("node2", 1004.0)]
    cause = first_failure(failures, clocks)
    assert (cause.host, cause.returncode) == ("node2", 1)


def test_the_probe_measures_a_window_between_sending_and_receiving() -> None:
    facts = facts_from_probe(ProbeFacts(time=2000.0), received_at=1970.5, sent_at=1970.0)
    assert facts.clock == HostClock(29.5, 30.0)
    assert facts.clock.here(2010.0) == (1980.0, 1980.5)
    assert facts_from_probe(ProbeFacts(time=2000.0), received_at=1970.4).clock is None


def test_stored_clocks_that_are_malformed_are_left_out() -> None:
    stored = {"node1": [0.1, 0.2], "node2": [0.3, 0.1], "node3": "x", "node4": [True, 1]}
    assert clocks_from_json(stored) == {"node1": HostClock(0.1, 0.2)}
    assert clocks_from_json(None) == {} and clocks_from_json([1, 2]) == {}
    assert clocks_from_json({"n": HostClock(1.0, 2.0).to_json()}) == {"n": HostClock(1.0, 2.0)}
