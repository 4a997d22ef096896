"""How the hosts are wired: the bridge, each host's namespace and veth pair, the ARP
table fitted to their number, and what ``orch check`` tests add: a second cable between
two hosts and firewall rules. Each addition is undone by its own method; all of it
also dies with the host's namespaces."""

from __future__ import annotations

import json
import logging
import shutil
import sys

from tests.cluster.commands import ClusterError, _run
from tests.cluster.hosts import Host, HostsMixin
from tests.cluster.network import (
    BRIDGE,
    BRIDGE_ADDRESS,
    NEIGH_LIMITS,
    NEIGH_SAVED,
    NEIGH_SYSCTLS,
    PEER_PREFIX,
    SUBNET,
    VETH_PREFIX,
    _mac_for,
    _neighbour_limits,
)

log = logging.getLogger(__name__)

_CHECK_REACHABLE = r"""
import socket, sys
for address in sys.argv[1:]:
    with socket.create_connection((address, 22), timeout=3) as conn:
        assert conn.recv(64).startswith(b"SSH-"), address
        conn.sendall(b"SSH-2.0-orch-test-probe\r\n")
"""


class LinksMixin(HostsMixin):
    """The network of a ``Cluster``: plugging hosts in and out, extra links, firewalls."""

    _neigh_saved: dict[str, str]  # ARP table limits as they were (NEIGH_SAVED)

    def _fit_neighbour_table(self, n_hosts: int) -> None:
        """Raise the kernel's ARP table limits where ``n_hosts`` hosts could overflow them;
        ``stop`` puts the values back. Where they cannot be raised, jobs whose ranks all
        talk to each other may not work past 31 hosts: a warning says so."""
        try:
            current = {name: int((NEIGH_SYSCTLS / name).read_text()) for name in NEIGH_LIMITS}
            wanted = _neighbour_limits(n_hosts, current)
            if wanted == current:
                return
            if not self._neigh_saved:  # a run killed before stop: remove_leftovers restores
                NEIGH_SAVED.write_text(json.dumps(current))
                self._neigh_saved = {name: str(value) for name, value in current.items()}
            for name, value in wanted.items():
                (NEIGH_SYSCTLS / name).write_text(str(value))
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the ARP table limits for %d hosts: %s", n_hosts, exc)

    def _create_network(self) -> None:
        """Bridge on the machine, and per host a namespace plugged in by a veth pair."""
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        # Else the bridge takes the lowest MAC of its ports, which changes as extra hosts
        # come and go and leaves the hosts' ARP entries for it pointing nowhere.
        _run(["ip", "link", "set", BRIDGE, "address", _mac_for(BRIDGE_ADDRESS)])
        _run(["ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        for host in self.hosts:
            self._plug_in(host)

    def _plug_in(self, host: Host) -> None:
        """The host's network namespace, joined to the bridge by the veth pair ``orchv{i}``.

        The host gets no default route: it can reach the bridge subnet and nothing else.
        """
        peer = f"{PEER_PREFIX}{host.index}"
        _run(["ip", "netns", "add", host.netns])
        _run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", host.veth, "master", BRIDGE, "up"])
        _run(["ip", "link", "set", peer, "netns", host.netns])
        inside = ["ip", "-n", host.netns]
        _run([*inside, "link", "set", peer, "name", "eth0"])
        # A random MAC would make a host plugged in again at this index (extra_hosts)
        # unreachable for a while: the machine's and the hosts' ARP caches keep the old one.
        _run([*inside, "link", "set", "eth0", "address", host.mac])
        _run([*inside, "addr", "add", f"{host.address}/24", "dev", "eth0"])
        _run([*inside, "link", "set", "eth0", "up"])
        _run([*inside, "link", "set", "lo", "up"])

    @staticmethod
    def _unplug(host: Host) -> None:
        """Remove the host's veth pair and network namespace, whichever of them exists."""
        _run(["ip", "link", "del", host.veth], check=False)
        _run(["ip", "netns", "del", host.netns], check=False)

    def _check_hosts_reach_each_other(self) -> None:
        """Fail early, and clearly, if the bridge drops traffic between hosts.

        With br_netfilter loaded, an iptables FORWARD policy of DROP (Docker sets one)
        filters bridged packets: hosts would reach the machine but not each other.
        """
        others = [host.address for host in self.hosts[1:]]
        if not others:
            return
        result = self.exec_on(1, [sys.executable, "-I", "-S", "-c", _CHECK_REACHABLE, *others])
        if result.returncode != 0:
            raise ClusterError(
                f"node1 cannot reach the other hosts on {BRIDGE}: {result.stderr.strip()[-500:]}; "
                "check iptables FORWARD policy and net.bridge.bridge-nf-call-iptables"
            )

    def add_link(self, a: int, b: int, subnet: int = 240) -> tuple[str, str]:
        """A second interface, ``eth1``, on hosts ``a`` and ``b``: a direct cable between them.

        The two ends get 10.77.NET.{subnet+1} and {subnet+2} in a /30, a more specific
        route than the bridge's /24, so only traffic for those two addresses takes it.

        Returns:
            The addresses of host ``a``'s and host ``b``'s ends.
        """
        if subnet % 4 or not 16 <= subnet <= 252:
            raise ValueError(f"subnet must be a /30 boundary of {SUBNET}.x above the hosts")
        ends = [(self.host(a), f"{SUBNET}.{subnet + 1}"), (self.host(b), f"{SUBNET}.{subnet + 2}")]
        first, second = (f"{VETH_PREFIX}l{h.index}" for h, _ in ends)
        _run(["ip", "link", "add", first, "type", "veth", "peer", "name", second])
        for (host, address), name in zip(ends, (first, second), strict=True):
            _run(["ip", "link", "set", name, "netns", host.netns])
            inside = ["ip", "-n", host.netns]
            _run([*inside, "link", "set", name, "name", "eth1"])
            _run([*inside, "addr", "add", f"{address}/30", "dev", "eth1"])
            _run([*inside, "link", "set", "eth1", "up"])
        return ends[0][1], ends[1][1]

    def route_via_link(self, i: int, target: int | str, source: str) -> None:
        """Make host ``i`` reach host ``target``'s bridge address over its ``eth1``."""
        host, address = self.host(i), self.host(target).address
        _run(
            ["ip", "-n", host.netns, "route", "add", f"{address}/32", "dev", "eth1", "src", source]
        )

    def remove_link(self, i: int) -> None:
        """Remove host ``i``'s ``eth1`` (both ends of the cable, and routes over it)."""
        _run(["ip", "-n", self.host(i).netns, "link", "del", "eth1"], check=False)

    def _firewall_rule(self, i: int, port: int, source: int | str | None) -> list[str]:
        rule = ["INPUT", "-p", "tcp", "--dport", str(port)]
        if source is not None:
            rule += ["-s", self.host(source).address]
        return [*rule, "-m", "comment", "--comment", "orch-test", "-j", "DROP"]

    def block_port(self, i: int, port: int, source: int | str | None = None) -> None:
        """Drop TCP packets to ``port`` on host ``i`` (from host ``source``, else from anyone).

        Raises:
            ClusterError: iptables is missing or refuses (callers may skip).
        """
        if shutil.which("iptables") is None:
            raise ClusterError("iptables is not installed")
        argv = ["ip", "netns", "exec", self.host(i).netns, "iptables", "-A"]
        _run([*argv, *self._firewall_rule(i, port, source)])

    def unblock_port(self, i: int, port: int, source: int | str | None = None) -> None:
        argv = ["ip", "netns", "exec", self.host(i).netns, "iptables", "-D"]
        _run([*argv, *self._firewall_rule(i, port, source)], check=False)
