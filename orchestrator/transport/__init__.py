"""Transports: how orch reaches a host (SSH, or this machine directly)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.models.inventory import Host
from orchestrator.transport.base import CommandResult, ConnectOptions, RemoteProcess, Transport
from orchestrator.transport.dial import Dialled, ahead
from orchestrator.transport.local import LocalTransport

__all__ = [
    "CommandResult",
    "ConnectOptions",
    "Dialled",
    "RemoteProcess",
    "Transport",
    "dial_ahead",
    "open_transport",
]


def dial_ahead(hosts: Sequence[Host], options: ConnectOptions) -> dict[str, Dialled]:
    """Start the hosts' TCP connections now, before paramiko is imported, where they
    surely go straight to the hosts (dial.py): by host name, for `open_transport`."""
    return ahead(hosts, options.connect_timeout)


def open_transport(
    host: Host, options: ConnectOptions, dialled: Dialled | None = None
) -> Transport:
    """The transport for a host, not yet connected: local for localhost, else SSH,
    over `dialled` where it goes where the host's SSH connection goes."""
    if host.is_local:
        return LocalTransport(host.name)
    from orchestrator.transport.ssh import SshTransport  # paramiko costs ~0.2 s to import

    return SshTransport(host, options, dialled)
