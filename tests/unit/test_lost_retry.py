"""Stopping a job on lost nodes: every node tried at once, each on its own schedule,
none after the deadline (jobs/retry.py)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from orchestrator.models.errors import HostError
from orchestrator.ssh.retry import retry_each

CONNECT_TIMEOUT_S = 0.3  # stands for the 3 s a fresh connection waits behind a partition


class Hosts:
    """Hosts whose every try takes a connect timeout, and fails until `reachable_after`
    tries (None: never); records when each try started."""

    def __init__(self, reachable_after: dict[str, int | None]) -> None:
        self.reachable_after = reachable_after
        self.started: dict[str, list[float]] = defaultdict(list)
        self.ended: dict[str, list[float]] = defaultdict(list)
        self.origin = time.monotonic()
        self._lock = threading.Lock()

    def attempt(self, name: str) -> None:
        with self._lock:
            self.started[name].append(time.monotonic() - self.origin)
            tries = len(self.started[name])
        time.sleep(CONNECT_TIMEOUT_S)
        with self._lock:
            self.ended[name].append(time.monotonic() - self.origin)
        needed = self.reachable_after[name]
        if needed is None or tries < needed:
            raise HostError(name, f"no answer from {name} within {CONNECT_TIMEOUT_S} s")


def test_three_unreachable_hosts_are_each_tried_at_once_and_again_until_the_deadline() -> None:
    hosts = Hosts({"node2": None, "node3": None, "node4": None})
    ended = list(retry_each(hosts.reachable_after, hosts.attempt, within_s=1.0, pause_s=0.1))
    assert sorted(t.name for t in ended) == ["node2", "node3", "node4"]
    assert all(not t.ok and "no answer from" in str(t.error) for t in ended)
    # At once: every first try starts before any first try ends. One after another,
    # node4's would start only when node3's had timed out.
    first_ends = min(hosts.ended[name][0] for name in hosts.reachable_after)
    for name in ("node2", "node3", "node4"):
        assert hosts.started[name][0] < first_ends, (name, hosts.started, hosts.ended)
        assert len(hosts.started[name]) >= 2, (name, hosts.started[name])
        assert max(hosts.started[name]) < 1.0  # no try starts after the deadline


def test_hosts_that_become_reachable_are_reported_as_they_succeed_and_not_tried_again() -> None:
    hosts = Hosts({"node2": 2, "node3": 1, "node4": None})
    ended = list(retry_each(hosts.reachable_after, hosts.attempt, within_s=1.5, pause_s=0.1))
    assert [t.name for t in ended if t.ok] == ["node3", "node2"]  # in the order they succeeded
    assert len(hosts.started["node3"]) == 1 and len(hosts.started["node2"]) == 2
    assert [t.name for t in ended if not t.ok] == ["node4"]


def test_closing_the_tries_stops_every_host_from_being_tried_again() -> None:
    hosts = Hosts({"node2": None, "node3": 1})
    tries = retry_each(hosts.reachable_after, hosts.attempt, within_s=5.0, pause_s=0.1)
    assert next(tries).name == "node3"
    tries.close()  # Ctrl-C in the caller does the same
    seen = len(hosts.started["node2"])
    time.sleep(3 * (CONNECT_TIMEOUT_S + 0.1))
    assert len(hosts.started["node2"]) <= seen + 1  # at most the try already running ends
