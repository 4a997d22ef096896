"""Other shapes of cluster: hosts that share one home, NFS-style, and hosts added after
the session's. Both are context managers: the session shares one cluster, so a test
borrows a shape and hands the cluster back as it found it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.cluster.commands import ClusterError
from tests.cluster.hosts import Host, HostsMixin, _prepare_home
from tests.cluster.network import MAX_HOSTS


class ShapesMixin(HostsMixin):
    """``shared_home`` and ``extra_hosts``, each undone when its ``with`` block ends."""

    _shared_homes_made: int

    @contextlib.contextmanager
    def shared_home(self, hosts: Sequence[int | str]) -> Iterator[Path]:
        """Have ``hosts`` mount one fresh directory as their ``/root``, as with NFS homes.

        Those hosts reboot (as ``restart``: same address and host key, their processes
        die) into the shared home; on exit they reboot into their private homes and the
        directory is removed. Other hosts are left alone, so one ``with`` per group
        makes a mixed layout::

            with cluster.shared_home([1, 2]) as home:  # node3 keeps its own
                cluster.exec_on(1, ["touch", "/root/x"])
                assert (home / "x").exists() and cluster.home(2) == home

        Meanwhile ``home(i)`` and ``Host.home`` name the shared directory for those
        hosts. Each still has its own mount namespace: binds made inside one stay its
        own. A host partitioned at exit is left down, for ``ensure_healthy`` to boot.

        Args:
            hosts: indices or names of the hosts that share; none may share already.

        Yields:
            The shared directory, as a path on this machine.

        Raises:
            ValueError: no hosts, or one listed twice.
            ClusterError: a host shares a home already, or did not come back up.
        """
        selected = [self.host(i) for i in hosts]
        if not selected or len({host.index for host in selected}) != len(selected):
            raise ValueError(f"shared_home needs distinct hosts, not {list(hosts)}")
        busy = [host.name for host in selected if host.shared_home is not None]
        if busy:
            raise ClusterError(f"{', '.join(busy)} already share a home")
        assert self.workdir is not None
        self._shared_homes_made += 1
        home = self.workdir / "shared-homes" / str(self._shared_homes_made)
        _prepare_home(home)
        try:
            for host in selected:
                host.shared_home = home
                self.restart(host.index)
            yield home
        finally:
            # A stop() inside the block already removed these hosts (and the directory).
            moved = [host for host in selected if host.shared_home == home and self._has(host)]
            try:
                self._reboot_into_private_homes(moved)
            finally:
                shutil.rmtree(home, ignore_errors=True)

    def _reboot_into_private_homes(self, hosts: Sequence[Host]) -> None:
        """Kill ``hosts``, then boot each with its private home (partitioned ones stay down).

        Raises:
            ClusterError: naming every host that did not come up, after trying them all.
        """
        for host in hosts:
            self._kill(host)
            host.shared_home = None
        failures = []
        for host in hosts:
            if host.partitioned:
                continue
            try:
                self._boot(host)
            except ClusterError as exc:
                failures.append(f"{host.name}: {exc}")
        if failures:
            raise ClusterError("hosts did not boot into their own homes: " + "; ".join(failures))

    @contextlib.contextmanager
    def extra_hosts(self, n: int = 1) -> Iterator[list[Host]]:
        """Plug in and boot ``n`` more hosts after the last one, for a test that needs more.

        ``with cluster.extra_hosts(1) as (node4,):`` adds node4 (10.77.NET.14) to ``hosts``,
        built as the others (fresh host key, private home); ``write_inventory`` lists it
        from then on. This cluster's own controller (``ssh``, ``env``) trusts the added
        hosts until exit, but controllers made before do not: make one that does with
        ``new_controller()`` inside the block. On exit the added hosts are killed, their
        veth pairs and namespaces deleted, and ``hosts`` is as before; ``stop`` inside the
        block removes them too.

        Args:
            n: how many hosts to add.

        Yields:
            The added hosts, by index.

        Raises:
            ValueError: ``n`` below 1, or more than ``MAX_HOSTS`` hosts in all.
            ClusterError: the cluster is not started, or a host did not come up.
        """
        if not self.hosts or self.workdir is None or self._controller is None:
            raise ClusterError("cluster not started")
        first = max(host.index for host in self.hosts) + 1
        if n < 1 or first + n - 1 > MAX_HOSTS:
            raise ValueError(f"n must be within 1..{MAX_HOSTS - first + 1}, not {n}")
        added: list[Host] = []
        self._fit_neighbour_table(len(self.hosts) + n)
        try:
            for index in range(first, first + n):
                host = Host(index, self.workdir / f"node{index}")
                self.hosts.append(host)  # from here on, stop() removes it too
                added.append(host)
                self._write_host_files(host)
                self._plug_in(host)
                self._boot(host)
            with self._controller.known_hosts.open("a") as known_hosts:
                known_hosts.writelines(host.known_hosts_line() for host in added)
            yield list(added)
        finally:
            self._remove_hosts([host for host in added if self._has(host)])

    def _remove_hosts(self, hosts: Sequence[Host]) -> None:
        """Kill ``hosts``, delete their links, namespaces and files, and forget them.

        The default controller forgets their keys, as a later host of the same address
        will have another.
        """
        for host in hosts:
            self._kill(host)
        for host in hosts:
            self._unplug(host)
            shutil.rmtree(host.workdir, ignore_errors=True)
        self.hosts = [host for host in self.hosts if not any(host is gone for gone in hosts)]
        if self._controller is not None and self._controller.known_hosts.exists():
            addresses = {host.address for host in hosts}
            lines = self._controller.known_hosts.read_text().splitlines(keepends=True)
            kept = [line for line in lines if line.split(" ", 1)[0] not in addresses]
            self._controller.known_hosts.write_text("".join(kept))

    def _has(self, host: Host) -> bool:
        """Whether ``host`` is this very cluster's (not one a ``stop`` has since removed)."""
        return any(host is mine for mine in self.hosts)
