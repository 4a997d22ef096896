"""Transports: how orch reaches a host (SSH, or this machine directly)."""

from __future__ import annotations

from orchestrator.models.inventory import Host
from orchestrator.transport.base import CommandResult, ConnectOptions, RemoteProcess, Transport
from orchestrator.transport.dial import ahead
from orchestrator.transport.local import LocalTransport

__all__ = ["CommandResult", "ConnectOptions", "RemoteProcess", "Transport", "open_transport"]


def open_transport(host: Host, options: ConnectOptions, *, dial_ahead: bool = False) -> Transport:
    """The transport for a host, not yet connected: local for localhost, else SSH.

    Args:
        dial_ahead: start its TCP connection now, before paramiko is imported, where it
            surely goes straight to the host (dial.py).
    """
    if host.is_local:
        return LocalTransport(host.name)
    dialled = ahead(host.address, host.port, options.connect_timeout) if dial_ahead else None
    from orchestrator.transport.ssh import SshTransport  # paramiko costs ~0.2 s to import

    return SshTransport(host, options, dialled)
