"""`orch gc`: old code snapshots and unused stored content go from the hosts."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.agent.kernel import framing
from orchestrator.agent.kernel.replies import GcReport
from orchestrator.agent.kernel.requests import GcRequest
from orchestrator.models.errors import HostError
from orchestrator.models.inventory import Host, Inventory
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.sync.store import host_key, snapshot_retention
from orchestrator.transport.base import ConnectOptions, Transport


def gc(
    inventory: Inventory,
    keep: int | None,
    notice: Callable[[str], None],
    outputs: bool = False,
) -> dict[str, GcReport]:
    """`orch gc`: on every host of the inventory, remove the code snapshots of finished
    jobs but the newest `keep` (default: $ORCH_KEEP_SNAPSHOTS), then the stored
    content that no snapshot uses any more; with `outputs`, ended jobs' output
    directories too. Logs and job records stay.

    Returns:
        Each host's report: snapshots removed and kept, jobs running, objects removed,
        bytes freed. Hosts that share a store (one machine and workdir under two
        names) are collected once, under the first name.

    Raises:
        InputError: a bad retention.
        HostError / MultiHostError: hosts that could not be reached or collected.
    """
    keep = snapshot_retention() if keep is None else keep
    stores = {host_key(h): h.name for h in reversed(inventory.hosts)}  # one name per store

    def collect(host: Host, transport: Transport) -> GcReport:
        return collect_garbage(host, transport, keep, outputs=outputs)

    with HostGroup(inventory.hosts, ConnectOptions(notice=notice)) as group:
        group.connect()
        return group.each(collect, only=stores.values())


def collect_garbage(
    host: Host,
    transport: Transport,
    keep: int,
    grace_s: float | None = None,
    outputs: bool = False,
) -> GcReport:
    """Remove the host's snapshots of finished jobs but the newest `keep`, and content
    that no snapshot uses any more.

    Raises:
        HostError: the host could not collect.
    """
    options = GcRequest(workdir=host.workdir, keep=keep)
    if grace_s is not None:
        options.grace = grace_s
    if outputs:
        options.outputs = True
    header = framing.json_frame(b"H", options.as_dict())
    report = agent.parse(host, GcReport, agent.run(host, transport, ["gc"], [header], 600))
    if report.error is not None:
        raise HostError(host.name, f"gc failed: {report.error}")
    return report
