"""``Cluster``: the rooms of this package in one class, and its life (``start``, ``stop``,
``with``)."""

from __future__ import annotations

import atexit
import shutil
import socket
import tempfile
from pathlib import Path
from types import TracebackType

from tests.cluster.commands import ClusterError, _run
from tests.cluster.controller import Controller
from tests.cluster.controller_side import ControllerSideMixin
from tests.cluster.faults import FaultsMixin
from tests.cluster.hosts import Host, HostsMixin
from tests.cluster.inside import InsideMixin
from tests.cluster.links import LinksMixin
from tests.cluster.network import (
    BRIDGE,
    MAX_HOSTS,
    TMP_PREFIX,
    _acquire_machine_lock,
    _restore_neighbour_limits,
    remove_leftovers,
)
from tests.cluster.shapes import ShapesMixin
from tests.cluster.users import UsersMixin


class Cluster(
    LinksMixin,
    InsideMixin,
    FaultsMixin,
    ShapesMixin,
    UsersMixin,
    ControllerSideMixin,
    HostsMixin,
):
    """Real SSH hosts ``node1..nodeN`` at 10.77.NET.11.. on this machine (needs root).

    Hosts are numbered from 1. ``crash``, ``partition`` and ``heal`` inject faults;
    ``restart`` and ``ensure_healthy`` undo them. ``stop`` removes everything created.
    Its methods come from the rooms of this package: ``hosts``, ``links``, ``inside``,
    ``faults``, ``shapes``, ``users`` and ``controller_side``.
    """

    def __init__(self, n_hosts: int = 3) -> None:
        self.n_hosts = n_hosts
        self.hosts: list[Host] = []
        self.workdir: Path | None = None
        self.client_key: Path | None = None
        self.host_ca: Path | None = None
        self._controller: Controller | None = None
        self._controllers_made = 0
        self._shared_homes_made = 0
        self._lock: socket.socket | None = None
        self._neigh_saved: dict[str, str] = {}  # ARP table limits as they were (NEIGH_SAVED)
        self.controller_cut = False  # cut_controller: this machine is off the cluster

    def start(self, n_hosts: int | None = None, lock_timeout: float = 900) -> Cluster:
        """Build the network and boot every host; return once each sshd answers.

        Args:
            n_hosts: how many hosts (default: the constructor's).
            lock_timeout: seconds to wait for another session's cluster to go away.

        Raises:
            ClusterError: a setup command failed or a host did not come up.
        """
        if self.hosts:
            raise ClusterError("cluster already started")
        self.n_hosts = n_hosts or self.n_hosts
        if not 1 <= self.n_hosts <= MAX_HOSTS:
            raise ValueError(f"n_hosts must be within 1..{MAX_HOSTS}, not {self.n_hosts}")
        self._lock = _acquire_machine_lock(lock_timeout)
        atexit.register(self.stop)
        try:
            remove_leftovers()
            self.workdir = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
            self.hosts = [Host(i, self.workdir / f"node{i}") for i in range(1, self.n_hosts + 1)]
            self._write_keys_and_configs()
            self._fit_neighbour_table(self.n_hosts)
            self._create_network()
            for host in self.hosts:
                self._boot(host)
            self._check_hosts_reach_each_other()
            self._controller = self.new_controller()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill the hosts' processes and remove the links, namespaces and files made.

        Idempotent, and safe after a partial ``start``.
        """
        for host in self.hosts:
            self._kill(host)
        for host in self.hosts:
            self._unplug(host)
        if self.hosts:
            _run(["ip", "link", "del", BRIDGE], check=False)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            shutil.rmtree(self.hosts_tmp, ignore_errors=True)
        if self._neigh_saved:
            _restore_neighbour_limits()
            self._neigh_saved = {}
        self.hosts, self.workdir, self._controller = [], None, None
        self.client_key = self.host_ca = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        atexit.unregister(self.stop)

    def __enter__(self) -> Cluster:
        return self if self.hosts else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
