"""Relay push through LocalTransport: two "hosts" on this machine (two
workdirs), the second fetching from the first's relay over loopback. The cluster test
in tests/integration/test_relay.py does the same over SSH, with a host that cannot
reach the seed."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.kernel import framing, layout
from orchestrator.agent.kernel.requests import RelayConfig, RelayOrder
from orchestrator.agent.store.content import ContentStore
from orchestrator.agent.store.relay import GREETING, NONCE_BYTES, fetch
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.sync.manifest import HostMemory, scan_workdir
from orchestrator.sync.push import push
from orchestrator.sync.relay import Relay
from orchestrator.transport import ConnectOptions


@pytest.fixture(autouse=True)
def _orch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "orch-home"))


def local_host(tmp_path: Path, name: str) -> Host:
    return Host(name=name, address="localhost", python=sys.executable, workdir=str(tmp_path / name))


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[HostGroup, list[Host]]]:
    made = [local_host(tmp_path, n) for n in ("seed", "other", "third")]
    notices: list[str] = []
    with HostGroup(made, ConnectOptions(notice=notices.append)) as group:
        group.connect()
        group.notices = notices  # type: ignore[attr-defined]
        yield group, made


def work_tree(root: Path) -> Path:
    root.mkdir()
    (root / "big.bin").write_bytes(os.urandom(6 << 20))
    (root / "pkg").mkdir()
    for n in range(20):
        (root / "pkg" / f"m{n}.py").write_text(f"x = {n}\n")
    return root


def snapshot(host: Host, job: str) -> dict[str, str]:
    code = Path(host.workdir) / "jobs" / job / host.name / "code"
    return {
        str(p.relative_to(code)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(code.rglob("*"))
        if p.is_file()
    }


def test_other_hosts_fetch_from_the_seed_and_the_controller_sends_one_copy(
    hosts: tuple[HostGroup, list[Host]], tmp_path: Path
) -> None:
    group, made = hosts
    tree = scan_workdir(work_tree(tmp_path / "work"))
    dirs = {h.name: str(Path(h.workdir) / "jobs" / "j1" / h.name) for h in made}
    results = push(
        group, tree, dirs, memory=HostMemory(tmp_path / "mem"), relay=Relay("seed", "127.0.0.1")
    )
    assert results["seed"].files_sent == len(tree.objects) and results["seed"].relayed == 0
    for name in ("other", "third"):
        assert results[name].files_sent == 0 and results[name].bytes_sent == 0
        assert results[name].relayed == len(tree.objects)
        assert results[name].relayed_bytes == tree.total_bytes
    expected = snapshot(made[0], "j1")
    assert len(expected) == 21 and all(snapshot(h, "j1") == expected for h in made[1:])


def test_a_small_change_goes_directly_as_before(
    hosts: tuple[HostGroup, list[Host]], tmp_path: Path
) -> None:
    group, made = hosts
    work = work_tree(tmp_path / "work")
    memory = HostMemory(tmp_path / "mem")
    dirs = {h.name: str(Path(h.workdir) / "jobs" / "j1" / h.name) for h in made}
    push(group, scan_workdir(work), dirs, memory=memory, relay=Relay("seed", "127.0.0.1"))
    (work / "pkg" / "m3.py").write_text("x = 'changed'\n")
    dirs = {h.name: str(Path(h.workdir) / "jobs" / "j2" / h.name) for h in made}
    results = push(group, scan_workdir(work), dirs, memory=memory, relay=Relay("seed", "127.0.0.1"))
    assert all(r.files_sent == 1 and r.relayed == 0 for r in results.values())


def start_relay(host: Host, group: HostGroup, secret: str) -> tuple[object, int]:
    config = RelayConfig(store=layout.store_dir(host.workdir), secret=secret)
    process = group.transports[host.name].stream(
        agent.command(host, "relay"), stdin=agent.packed() + config.to_json().encode()
    )
    return process, int(json.loads(next(process.lines()))["port"])


def test_a_host_without_the_push_secret_gets_nothing(
    hosts: tuple[HostGroup, list[Host]], tmp_path: Path
) -> None:
    group, made = hosts
    seed_store = ContentStore(os.path.expanduser(layout.store_dir(made[0].workdir)))
    data = b"secret weights"
    key = hashlib.sha256(data).hexdigest()
    assert seed_store.put_piece({"k": key, "size": len(data), "off": 0}, data, "t")
    process, port = start_relay(made[0], group, "ab" * 32)
    try:
        store = ContentStore(str(tmp_path / "thief"))
        request = RelayOrder(addr="127.0.0.1", port=port, secret="cd" * 32, keys=[key])
        report = fetch(store, request, "p")
        assert report["relayed"] == 0 and "relay_error" in report
        assert not os.path.exists(store.object_path(key))
        request.secret = "ab" * 32
        report = fetch(store, request, "p")
        assert report["relayed"] == 1 and "relay_error" not in report
        assert Path(store.object_path(key)).read_bytes() == data
    finally:
        process.close()  # type: ignore[attr-defined]
    # The server ends with its channel: its port is free again.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
        except ConnectionRefusedError:
            break
        except OSError:  # reset: accepted by a backlog the ending relay dropped
            pass
        time.sleep(0.1)
    else:
        pytest.fail("the relay still listens after its channel closed")


def test_a_relay_that_sends_other_bytes_changes_nothing(tmp_path: Path) -> None:
    """A bad relay (a fake one: no real server can be made to lie) delays the push:
    the object is refused by its hash and reported for the controller to send."""
    data = b"the real content"
    key = hashlib.sha256(data).hexdigest()
    listener = socket.create_server(("127.0.0.1", 0))

    def lie() -> None:
        conn, _ = listener.accept()
        with conn:
            stream = conn.makefile("rwb")
            stream.write(GREETING + b"n" * NONCE_BYTES)
            stream.flush()
            stream.read(32)
            framing.read_frame(stream)
            forged = b"other content!!!"
            stream.write(framing.json_frame(b"O", {"k": key, "size": len(forged)}) + forged)
            stream.write(framing.frame(b"Z"))
            stream.flush()

    threading.Thread(target=lie, daemon=True).start()
    store = ContentStore(str(tmp_path / "store"))
    request = RelayOrder(
        addr="127.0.0.1", port=listener.getsockname()[1], secret="ab" * 32, keys=[key]
    )
    report = fetch(store, request, "p")
    listener.close()
    assert report["relayed"] == 0 and "does not match its hash" in report["relay_error"]
    assert not os.path.exists(store.object_path(key))
    assert list(Path(store.objects).iterdir()) == [], "no part left either"
