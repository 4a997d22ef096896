"""The SSH transport itself, against a real sshd."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from orchestrator.models.inventory import load_inventory
from orchestrator.transport import ConnectOptions
from orchestrator.transport.ssh import SshTransport
from tests.cluster import Cluster

pytestmark = pytest.mark.cluster


def test_connection_prefers_aes_gcm_and_moves_bytes_exactly(
    cluster: Cluster, tmp_path: Path
) -> None:
    controller = cluster.new_controller()
    host = load_inventory(cluster.write_inventory(tmp_path / "inventory.yaml")).hosts[0]
    transport = SshTransport(host, ConnectOptions(known_hosts=controller.known_hosts))
    transport.connect()
    try:
        assert transport.cipher == "aes128-gcm@openssh.com"
        data = os.urandom(3 << 20)
        result = transport.run("sha256sum", stdin=data)
        assert result.exit_code == 0, result.stderr
        assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest()
        parts = [data[:5], b"", data[5:]]  # several buffers go one after another, unjoined
        result = transport.run("sha256sum", stdin=parts)
        assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    finally:
        transport.close()
