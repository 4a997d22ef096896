"""Network tests between the job's hosts, run by their agents (agent/nettest.py).

- `reachability`: a temporary listener on the master's rendezvous port, and a TCP
  connection to it from every other node. Not a guess from routes: a firewall that
  drops the port shows up as what it is.
- `bandwidth`: TCP throughput from each node to the master and back, one node at a
  time so that they do not share the master's link (iperf-like, nothing to install).
- `relay_reach`: the code relay a push starts on the master (agent/relay.py), on the
  port it picks, and a connection to it from every other node: those that cannot
  reach it get their code straight from the controller.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.agent.kernel import layout
from orchestrator.agent.kernel.host_wire import Bandwidth, NetReady, Reached
from orchestrator.agent.kernel.requests import RelayConfig
from orchestrator.models.errors import HostError, OrchError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.transport import RemoteProcess, Transport

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 3.0
# The listener's own deadline: it must be gone before torchrun binds the port, even
# when a node never connects and nobody is left to stop it.
LISTEN_S = CONNECT_TIMEOUT_S + 2.0
BANDWIDTH_S = 1.0


@dataclass(frozen=True)
class Throughput:
    """One node's link to the master, in Gbit/s each way; `error` when unmeasured."""

    up_gbps: float | None = None  # node -> master
    down_gbps: float | None = None  # master -> node
    error: str | None = None


def reachability(
    group: HostGroup, master: Host, master_addr: str, port: int, nodes: Sequence[Host]
) -> dict[str, str]:
    """Which nodes cannot open a TCP connection to `master_addr:port`, and why.

    Returns:
        {node name: reason} for each node that failed; empty when all got through.

    Raises:
        HostError: the test listener could not start on the master, or a host's
            agent answered a record of the wrong shape (naming the host).
    """
    if not nodes:
        return {}
    token = secrets.token_hex(8)
    transport = group.transports[master.name]
    command = _nettest(master, "listen", port, len(nodes), LISTEN_S, token)
    listener = transport.stream(command, idle_timeout=LISTEN_S + 10)
    try:
        ready = _first_record(master, listener)
        if not ready.ready:
            raise HostError(
                master.name,
                f"cannot listen on port {port} for the connection test: "
                f"{ready.error or listener.stderr()[-300:]}",
                "is the port still free? run orch check again",
            )

        # All connected: the listener is closing the port now; wait until it has, so
        # that torchrun can bind it right after.
        return connect_all(group, nodes, master_addr, port, token, listener)
    finally:
        listener.close()


def connect_all(
    group: HostGroup,
    nodes: Sequence[Host],
    addr: str,
    port: int,
    token: str,
    server: RemoteProcess,
) -> dict[str, str]:
    """Connect from every node to `addr:port`, where `server` answers `token`; when all
    got through, wait for the server to end (it ends once each node came and went).

    Returns:
        {node name: reason} for each node that failed (a reply of the wrong shape
        among them, as the HostError that names it says).
    """

    def connect(host: Host, t: Transport) -> str | None:
        args = ("connect", addr, port, CONNECT_TIMEOUT_S, token)
        record = agent.run(host, t, _words(args), timeout=CONNECT_TIMEOUT_S + 30)
        reached = agent.parse(host, Reached, record)
        return None if reached.ok else reached.error or "no answer"

    results, errors = group.try_each(connect, only=[n.name for n in nodes])
    failures = {name: reason for name, reason in results.items() if reason}
    failures.update({e.host or "?": e.what for e in errors})
    if not failures:
        with contextlib.suppress(TimeoutError, OSError):
            for _ in server.lines():
                pass
    return failures


def bandwidth(
    group: HostGroup, master: Host, master_addr: str, nodes: Sequence[Host]
) -> dict[str, Throughput]:
    """Throughput between each node and the master, measured one node at a time.

    Raises:
        HostError: the master's test server answered a record of the wrong shape.
    """
    if not nodes:
        return {}
    transport = group.transports[master.name]
    idle = BANDWIDTH_S + 30
    command = _nettest(master, "bwserve", BANDWIDTH_S, len(nodes), idle)
    server = transport.stream(command, idle_timeout=idle)
    try:
        ready = _first_record(master, server)
        if not ready.ready or ready.port is None:
            error = f"cannot start the test server on {master.name}: {ready.error}"
            return {n.name: Throughput(error=error) for n in nodes}
        port = ready.port
        rates = {}
        for node in nodes:
            rates[node.name] = _measure(group.transports.get(node.name), node, master_addr, port)
        return rates
    finally:
        server.close()


def _measure(transport: Transport | None, node: Host, master_addr: str, port: int) -> Throughput:
    if transport is None:
        return Throughput(error="not connected")
    args = _words(("bwclient", master_addr, port, BANDWIDTH_S))
    try:
        record = agent.run(node, transport, args, timeout=2 * BANDWIDTH_S + 30)
        measured = agent.parse(node, Bandwidth, record)
    except OrchError as exc:
        return Throughput(error=exc.message)
    if measured.error is not None:
        return Throughput(error=measured.error)
    return Throughput(measured.up_gbps, measured.down_gbps)


def _first_record(host: Host, process: RemoteProcess) -> NetReady:
    """A test server's first record: listening, or why not.

    Raises:
        HostError: the record is not a NetReady (naming the host).
    """
    for line in process.lines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                record = line
            return agent.parse(host, NetReady, record)
    return NetReady(ready=False, error=process.stderr().strip()[-300:] or "no answer")


def _words(args: Sequence[object]) -> list[str]:
    return ["nettest", *(str(a) for a in args)]


def _nettest(host: Host, *args: object) -> str:
    """The command that streams a nettest from the host's agent (which the probe that
    always comes first has unpacked there: a stream sends no stdin)."""
    return agent.installed_command(host, *_words(args))


def relay_reach(
    group: HostGroup, master: Host, master_addr: str, nodes: Sequence[Host]
) -> dict[str, str]:
    """Which nodes cannot connect to a code relay on the master, and why.

    Returns:
        {node name: reason} for each node that failed; empty when all got through.

    Raises:
        HostError: the relay could not start on the master.
    """
    if not nodes:
        return {}
    config = RelayConfig(
        store=layout.store_dir(master.workdir),
        secret=secrets.token_hex(32),
        expect=len(nodes),  # it ends once each node came and went
    )
    relay = group.transports[master.name].stream(
        agent.command(master, "relay"),
        idle_timeout=LISTEN_S,
        stdin=agent.packed() + config.to_json().encode(),
    )
    try:
        try:
            port = int(json.loads(next(relay.lines(), ""))["port"])
        except (OSError, ValueError, KeyError, TypeError):
            raise HostError(
                master.name,
                f"the code relay did not start: {relay.stderr()[-300:] or 'no answer'}",
                "orch pushes the code to every host directly meanwhile",
            ) from None

        # Every node came: the relay is ending; nothing of it stays behind.
        return connect_all(group, nodes, master_addr, port, RELAY_GREETING, relay)
    finally:
        relay.close()


RELAY_GREETING = "orch-relay-1"  # what a relay says first (agent/relay.py GREETING)
