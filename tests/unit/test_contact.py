"""The decision that ends a job when a host goes silent, and never because of the
controller's own silence (reporting/contact.py)."""

from __future__ import annotations

from orchestrator.reporting.contact import LOST_AFTER_S, Contact, StallClock, judge

LIMITS = {"node1": LOST_AFTER_S, "node2": LOST_AFTER_S, "node3": LOST_AFTER_S}


def cluster(now: float) -> dict[str, Contact]:
    return {name: Contact(heard=now - 1) for name in ("node1", "node2", "node3")}


def test_a_silent_host_the_others_outlive_is_lost_once_confirmed_and_timed_out() -> None:
    contacts = cluster(100.0)
    contacts["node2"] = Contact(heard=87.5, following=False)
    # No fresh attempt has failed yet: silence alone never ends a job.
    assert judge(100.0, contacts, LIMITS).lost == {}
    contacts["node2"].attempt_failed(95.0, "no answer from root@10.77.0.12 within 3 s", False)
    verdict = judge(100.0, contacts, LIMITS)
    assert list(verdict.lost) == ["node2"] and not verdict.outage
    assert "no answer for 12 s" in verdict.lost["node2"]


def test_not_before_the_timeout_whatever_the_confirmation() -> None:
    contacts = cluster(100.0)
    contacts["node2"] = Contact(heard=95.0, following=False)
    contacts["node2"].attempt_failed(98.0, "timed out", False)
    assert judge(100.0, contacts, LIMITS).lost == {}
    assert judge(100.0, contacts, {**LIMITS, "node2": 4.0}).lost.keys() == {"node2"}


def test_the_others_must_be_heard_after_the_failed_attempt() -> None:
    contacts = cluster(100.0)  # the others were last heard at 99
    contacts["node2"] = Contact(heard=80.0, following=False)
    contacts["node2"].attempt_failed(99.5, "timed out", False)
    assert judge(100.0, contacts, LIMITS).lost == {}  # the network here may be down too
    contacts["node1"].hear(99.8)
    assert judge(100.0, contacts, LIMITS).lost.keys() == {"node2"}


def test_every_host_silent_is_the_controllers_outage_never_a_loss() -> None:
    contacts = {name: Contact(heard=50.0, following=False) for name in LIMITS}
    assert not judge(100.0, contacts, LIMITS).outage  # not tried yet: maybe a pause here
    for contact in contacts.values():
        contact.attempt_failed(99.0, "Network is unreachable", False)
    verdict = judge(100.0, contacts, LIMITS)
    assert verdict.outage and verdict.lost == {}


def test_a_node_that_just_ended_vouches_for_the_network_here() -> None:
    """A teardown ended node1 (its last word at 99); node2 and node3, cut off since 80,
    are all that is followed: lost, not the controller's outage."""
    silent = {name: Contact(heard=80.0, following=False) for name in ("node2", "node3")}
    for contact in silent.values():
        contact.attempt_failed(98.0, "timed out", False)
    assert judge(100.0, silent, LIMITS).outage  # with nobody to vouch for the network
    verdict = judge(100.0, silent, LIMITS, ended={"node1": Contact(heard=99.0, following=False)})
    assert verdict.lost.keys() == {"node2", "node3"} and not verdict.outage
    long_ago = {"node1": Contact(heard=60.0, following=False)}
    assert judge(100.0, silent, LIMITS, ended=long_ago).outage  # it ended before the cut


def test_a_refused_connection_while_the_others_answer_is_lost_at_once() -> None:
    contacts = cluster(100.0)
    contacts["node3"] = Contact(heard=99.9, following=False)
    contacts["node3"].attempt_failed(100.0, "connection refused by root@10.77.0.13", True)
    assert judge(100.1, contacts, LIMITS).lost == {"node3": "connection refused by root@10.77.0.13"}
    # A one-node job has no others to hear: the refusal is the host's own word.
    alone = {"node3": contacts["node3"]}
    assert judge(100.1, alone, LIMITS).lost.keys() == {"node3"}


def test_a_pause_of_this_process_does_not_count_as_silence() -> None:
    contacts = cluster(100.0)
    contacts["node2"] = Contact(heard=60.0, following=False)
    contacts["node2"].attempt_failed(99.0, "timed out", False)
    contacts["node1"].hear(99.5)
    # This process did not run until 95: node2 has been silent 5 s, not 40.
    assert judge(100.0, contacts, LIMITS, stalled_until=95.0).lost == {}
    assert judge(106.0, contacts, LIMITS, stalled_until=95.0).lost == {}
    assert judge(108.0, contacts, LIMITS, stalled_until=95.0).lost.keys() == {"node2"}


def test_an_attempt_from_before_the_pause_confirms_nothing() -> None:
    contacts = cluster(100.0)
    contacts["node2"] = Contact(heard=60.0, following=False)
    contacts["node2"].attempt_failed(70.0, "timed out", False)
    contacts["node1"].hear(99.5)
    assert judge(100.0, contacts, LIMITS, stalled_until=80.0).lost == {}


def test_a_host_back_is_followed_again() -> None:
    contact = Contact(heard=10.0, following=False)
    contact.attempt_failed(11.0, "x", True)
    contact.back(20.0)
    assert contact.following and contact.failed_at is None and not contact.refused
    assert judge(21.0, {"node1": contact}, LIMITS).lost == {}


def test_stall_clock_sees_a_tick_gap_and_a_wall_clock_jump() -> None:
    clock = StallClock(stall_s=3.0, tick_s=0.25)
    clock.tick(0.3, 0.3, now=10.0)
    assert clock.stalls == 0
    clock.tick(30.25, 30.25, now=40.0)  # kill -STOP for 30 s: both clocks moved
    assert clock.stalls == 1 and clock.stalled_until == 40.0 and clock.stalled_for == 30.0
    clock.tick(0.25, 600.25, now=40.25)  # suspended: the monotonic clock stood still
    assert clock.stalls == 2 and clock.stalled_for == 600.0
