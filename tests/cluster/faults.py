"""Faults a ``Cluster`` injects (a host crashed or cut off, this machine's link slow or
down) and what undoes them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tests.cluster.commands import _run
from tests.cluster.hosts import HostsMixin
from tests.cluster.network import BRIDGE


class FaultsMixin(HostsMixin):
    """``crash``, ``partition``, ``cut_controller`` and ``limit_controller`` inject faults;
    ``restart``, ``heal``, ``reconnect_controller`` and ``ensure_healthy`` undo them."""

    controller_cut: bool  # cut_controller: this machine is off the cluster

    def crash(self, i: int) -> None:
        """Kill host ``i``'s PID 1: the kernel kills every process on that host.

        Its address stays up with nothing listening, so connections are refused;
        combine with ``partition`` for a host that goes silent instead.
        """
        self._kill(self.host(i))

    def restart(self, i: int) -> None:
        """Boot host ``i`` again (crashing it first if up): same disk and host key."""
        host = self.host(i)
        self._kill(host)
        self._boot(host)

    def partition(self, i: int) -> None:
        """Cut host ``i`` off the network; its processes keep running."""
        host = self.host(i)
        _run(["ip", "link", "set", host.veth, "down"])
        host.partitioned = True

    def heal(self, i: int) -> None:
        """Reconnect host ``i`` after ``partition``."""
        host = self.host(i)
        _run(["ip", "link", "set", host.veth, "up"])
        host.partitioned = False

    @contextlib.contextmanager
    def limit_controller(self, mbit: int) -> Iterator[None]:
        """This machine's link to the hosts at ``mbit`` Mbit/s, as a laptop's on Wi-Fi:
        a tc token bucket on the bridge shapes what this machine sends to the hosts,
        while hosts still talk to each other at full speed (bridged between their own
        links). Undone on exit; the bridge takes it along if the cluster stops first."""
        shape = ["tc", "qdisc", "replace", "dev", BRIDGE, "root", "tbf", "rate", f"{mbit}mbit"]
        _run([*shape, "burst", "256kb", "latency", "100ms"])
        try:
            yield
        finally:
            _run(["tc", "qdisc", "del", "dev", BRIDGE, "root"], check=False)

    def cut_controller(self) -> None:
        """Take this machine off the cluster, as a laptop's Wi-Fi drops: the bridge's
        side here goes down (new connections: network unreachable; open ones go
        silent). Undo with ``reconnect_controller``."""
        _run(["ip", "link", "set", BRIDGE, "down"])
        self.controller_cut = True

    def reconnect_controller(self) -> None:
        """Bring this machine back onto the cluster after ``cut_controller``."""
        _run(["ip", "link", "set", BRIDGE, "up"])
        self.controller_cut = False

    def ensure_healthy(self) -> None:
        """Undo every fault: start if stopped, reconnect this machine, heal partitions,
        boot crashed hosts."""
        if not self.hosts:
            self.start()
            return
        if self.controller_cut:
            self.reconnect_controller()
        for host in self.hosts:
            if host.partitioned:
                self.heal(host.index)
            if not host.running:
                self._boot(host)
