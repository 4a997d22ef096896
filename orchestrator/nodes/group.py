"""A group of connected hosts, and running one operation on all of them at once.

One result per host; when some hosts fail, the error carries every failure and the
names of the hosts that succeeded (fabric's GroupResult / GroupException), so one
host's exception never hides another's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, TypeVar

from orchestrator.models.errors import HostError, MultiHostError, OrchError
from orchestrator.models.inventory import Host
from orchestrator.transport import ConnectOptions, Transport, open_transport

log = logging.getLogger(__name__)
T = TypeVar("T")
FRESH_TIMEOUT_S = 3.0  # a fresh connection to a host that answered a moment ago


class HostGroup:
    """Connected transports for a set of hosts, one connection per host."""

    def __init__(self, hosts: Sequence[Host], options: ConnectOptions) -> None:
        self.hosts = list(hosts)
        self.options = options
        self.transports: dict[str, Transport] = {}
        self._in_flight: list[Future[Any]] = []  # left running by a Ctrl-C (settle)

    def __enter__(self) -> HostGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, tolerate: bool = False) -> list[OrchError]:
        """Connect to every host in parallel.

        Args:
            tolerate: keep going without the hosts that fail (status, logs and kill
                work with whatever hosts answer); their errors are returned.

        Raises:
            HostError / MultiHostError: naming each host that could not be reached,
                unless `tolerate`.
        """
        self.transports = {h.name: open_transport(h, self.options) for h in self.hosts}
        connected, failures = self.try_each(lambda _host, t: t.connect())
        if failures and not tolerate:
            self.close()
            raise _combined(failures, list(connected))
        for failure in failures:
            if isinstance(failure, HostError):
                self.transports.pop(failure.host, None)
        return failures

    def each(
        self, operation: Callable[[Host, Transport], T], only: Iterable[str] | None = None
    ) -> dict[str, T]:
        """Run `operation` on every connected host (or the named ones) in parallel.

        Returns:
            Each host's result by host name, in host order.

        Raises:
            OrchError: the one host's error, or MultiHostError when several failed.
        """
        results, failures = self.try_each(operation, only)
        if failures:
            raise _combined(failures, list(results))
        return results

    def try_each(
        self, operation: Callable[[Host, Transport], T], only: Iterable[str] | None = None
    ) -> tuple[dict[str, T], list[OrchError]]:
        """Like `each`, but returns the failures beside the results instead of raising."""
        names = set(only) if only is not None else None
        targets = [
            h
            for h in self.hosts
            if h.name in self.transports and (names is None or h.name in names)
        ]
        results: dict[str, T] = {}
        failures: list[OrchError] = []
        if not targets:
            return results, failures
        pool = ThreadPoolExecutor(max_workers=len(targets))
        futures = {h.name: pool.submit(operation, h, self.transports[h.name]) for h in targets}
        try:
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except OrchError as exc:
                    failures.append(exc)
                except Exception as exc:  # keep every host's failure, never only the first
                    log.debug("unexpected failure on %s", name, exc_info=True)
                    failures.append(HostError(name, f"unexpected error: {exc!r}"))
        except KeyboardInterrupt:
            # Ctrl-C goes back to the caller at once, to stop the job beside the calls
            # still under way (a node's start waits while its warm interpreter imports);
            # `settle` waits for them. They end once stopped, or their connection closes.
            self._in_flight = [f for f in futures.values() if not f.done()]
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return results, failures

    def settle(self) -> bool:
        """Wait for the calls that a Ctrl-C left under way in `each` or `try_each`.

        Returns:
            Whether there were any: what they started may need stopping again.
        """
        pending, self._in_flight = self._in_flight, []
        wait(pending)
        return bool(pending)

    def abandon(self) -> None:
        """The calls a Ctrl-C left under way start nothing that needs stopping (an
        environment's build): `settle` does not wait for them. Their threads end when
        the group's connections close."""
        self._in_flight = []

    def fresh(self, host: Host) -> Transport:
        """A new connection to `host`, tried once, quickly; it replaces the host's
        connection in `transports` (the old one is closed) and is returned.

        Raises:
            HostError: it failed (`Refused` when the host's address refused it); the
                old connection stays.
        """
        options = replace(self.options, connect_timeout=FRESH_TIMEOUT_S)
        transport = open_transport(host, options)
        transport.connect()
        old, self.transports[host.name] = self.transports.get(host.name), transport
        if old is not None:
            old.close()
        return transport

    def close(self) -> None:
        for transport in list(self.transports.values()):
            transport.close()


def _combined(failures: list[OrchError], succeeded: list[str]) -> OrchError:
    return failures[0] if len(failures) == 1 else MultiHostError(failures, succeeded=succeeded)


def connect_reachable(
    hosts: Sequence[Host], notice: Callable[[str], None], connect_timeout: float | None = None
) -> tuple[HostGroup, list[OrchError]]:
    """A group of whichever of `hosts` answer (within `connect_timeout`, else the
    transport's default), and the errors of those that do not."""
    options = ConnectOptions(notice=notice)
    if connect_timeout is not None:
        options = replace(options, connect_timeout=connect_timeout)
    group = HostGroup(hosts, options)
    return group, group.connect(tolerate=True)
