"""Restarts, the pure part: which hosts the next attempt takes, and how long
it waits."""

from __future__ import annotations

from orchestrator.models.inventory import Host
from orchestrator.ssh.submit import next_hosts, restart_delay

HOSTS = [Host(name=f"node{i}", address=f"10.77.0.{10 + i}") for i in range(1, 6)]
N1, N2, N3, N4, N5 = HOSTS


def names(hosts: list[Host] | None) -> list[str] | None:
    return None if hosts is None else [h.name for h in hosts]


def test_a_lost_host_is_replaced_by_the_first_spare_in_its_place() -> None:
    assert names(next_hosts([N1, N2, N3], HOSTS, {"node2"}, {"node2"})) == [
        "node1",
        "node4",
        "node3",
    ]


def test_without_spares_a_failed_host_is_taken_again_and_a_lost_one_never() -> None:
    assert names(next_hosts([N1, N2], [N1, N2], {"node2"}, set())) == ["node1", "node2"]
    assert next_hosts([N1, N2], [N1, N2], {"node2"}, {"node2"}) is None


def test_spares_that_failed_are_not_taken() -> None:
    chosen = next_hosts([N1, N2], [N1, N2, N3, N4], {"node2", "node3"}, {"node2"})
    assert names(chosen) == ["node1", "node4"]


def test_the_first_restart_comes_at_once_then_the_wait_doubles_up_to_a_minute() -> None:
    assert [restart_delay(k) for k in (1, 2, 3, 4, 9)] == [0.0, 1.0, 2.0, 4.0, 60.0]
