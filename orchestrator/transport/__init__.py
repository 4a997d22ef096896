"""Transports: how orch reaches a host (SSH, or this machine directly)."""

from __future__ import annotations

from orchestrator.models.inventory import Host
from orchestrator.transport.base import CommandResult, ConnectOptions, RemoteProcess, Transport
from orchestrator.transport.local import LocalTransport

__all__ = ["CommandResult", "ConnectOptions", "RemoteProcess", "Transport", "open_transport"]


def open_transport(host: Host, options: ConnectOptions) -> Transport:
    """The transport for a host, not yet connected: local for localhost, else SSH."""
    if host.is_local:
        return LocalTransport(host.name)
    from orchestrator.transport.ssh import SshTransport  # paramiko costs ~0.2 s to import

    return SshTransport(host, options)
