"""Other shapes of cluster: hosts that share one home, NFS-style, and hosts added after
the session's. Both are context managers: the session shares one cluster, so a test
borrows a shape and hands the cluster back as it found it."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.commands import ClusterError, _run, stat_fields
from tests.cluster.hosts import (
    ROOT_HOME,
    Host,
    HostsMixin,
    _prepare_home,
    hidden_binds,
    home_mount_lines,
)
from tests.cluster.network import MAX_HOSTS


class ShapesMixin(HostsMixin):
    """``shared_home`` and ``extra_hosts``, each undone when its ``with`` block ends."""

    _shared_homes_made: int

    @contextlib.contextmanager
    def shared_home(self, hosts: Sequence[int | str]) -> Iterator[Path]:
        """Have ``hosts`` mount one fresh directory as their ``/root``, as with NFS homes.

        Those hosts mount it over their ``/root`` in place, without a reboot: new logins
        and processes see the shared home. On exit every process born inside the block
        is killed (as a reboot would), the shared home is unmounted, so the private one
        shows again with what ran there before (its warm interpreters: a reboot cost
        each host's next job a cold start), and the directory is removed. A host that
        rebooted inside the block (``restart``, ``crash``) reboots into its private home
        instead. Other hosts are left alone, so one ``with`` per group makes a mixed
        layout::

            with cluster.shared_home([1, 2]) as home:  # node3 keeps its own
                cluster.exec_on(1, ["touch", "/root/x"])
                assert (home / "x").exists() and cluster.home(2) == home

        Meanwhile ``home(i)`` and ``Host.home`` name the shared directory for those
        hosts. Each still has its own mount namespace: binds made inside one stay its
        own. A host partitioned at exit stays partitioned, for ``ensure_healthy`` to heal;
        one that rebooted inside the block and is partitioned is left down.

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
        entered: dict[int, _Entered] = {}
        try:
            for host in selected:
                host.shared_home = home
                if host.running and host.init_pid is not None:
                    entered[host.index] = _Entered(host.init_pid, _born_in(host.init_pid))
                    _mount_home(host, home)
                else:
                    self.restart(host.index)
            yield home
        finally:
            # A stop() inside the block already removed these hosts (and the directory).
            moved = [host for host in selected if host.shared_home == home and self._has(host)]
            try:
                rebooted = []
                for host in moved:
                    before = entered.get(host.index)
                    if before is not None and host.running and host.init_pid == before.init_pid:
                        _leave_home(host, home, before.pids)
                        host.shared_home = None
                    else:
                        rebooted.append(host)
                self._reboot_into_private_homes(rebooted)
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


@dataclass(frozen=True)
class _Entered:
    """A host as it entered a shared home: its PID 1, and every process then running."""

    init_pid: int
    pids: frozenset[tuple[int, int]]


def _born_in(init_pid: int) -> frozenset[tuple[int, int]]:
    """Every live process in the pid namespace of ``init_pid``, as (pid here, start time):
    the start time tells a process from a later one that got the same pid."""
    namespace = os.readlink(f"/proc/{init_pid}/ns/pid")
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") != namespace:
                continue
        except OSError:  # ended while we looked
            continue
        fields = stat_fields(int(name))
        if fields and fields[0] != "Z":  # a zombie is gone already, its parent reaps it
            found.add((int(name), int(fields[19])))
    return frozenset(found)


def _in_host_mounts(host: Host, script: str) -> None:
    """Run ``script`` (sh) in the mount namespace of ``host``'s PID 1, and its pid
    namespace: umount reads its own /proc/self/mountinfo, from the host's /proc."""
    assert host.init_pid is not None
    _run(["nsenter", "-t", str(host.init_pid), "-m", "-p", "--", "sh", "-c", script])


def _mount_home(host: Host, home: Path) -> None:
    """Mount ``home`` over the running ``host``'s ``/root``, as its boot would have."""
    _in_host_mounts(host, "\n".join(["set -e", *home_mount_lines(home)]))


def _leave_home(host: Host, home: Path, before: frozenset[tuple[int, int]]) -> None:
    """Kill every process of ``host`` that is not in ``before``, then unmount ``home``
    from its ``/root``, so that the private home below shows again.

    Raises:
        ClusterError: a process outlived 10 s of SIGKILLs, or an unmount failed.
    """
    assert host.init_pid is not None
    deadline = time.monotonic() + 10
    while born := _born_in(host.init_pid) - before:
        if time.monotonic() > deadline:
            raise ClusterError(f"{host.name}: processes outlived the shared home: {sorted(born)}")
        for pid, started in born:
            _kill_if_same(pid, started)
        time.sleep(0.01)
    q = shlex.quote
    lines = [f"umount -l {q(str(ROOT_HOME))}"]  # the top of the stack: the shared home
    lines += [f"umount -l {q(str(dst))}" for _, dst in hidden_binds(home)]
    _in_host_mounts(host, "\n".join(["set -e", *lines]))


def _kill_if_same(pid: int, started: int) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``started``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        fields = stat_fields(pid)
        if fields and int(fields[19]) == started:
            with contextlib.suppress(ProcessLookupError):  # ended since
                signal.pidfd_send_signal(fd, signal.SIGKILL)
    finally:
        os.close(fd)
