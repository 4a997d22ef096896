"""Pure parts of the transports."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.models.errors import HostError
from orchestrator.models.inventory import Host
from orchestrator.transport import dial
from orchestrator.transport.base import ConnectOptions, coalesced, stdin_parts
from orchestrator.transport.ssh import (
    IDLE_WAKE_S,
    SshTransport,
    _new_transport,
    _PromptAckSocket,
    idle_wake_s,
)
from orchestrator.transport.terminal import ended


@given(parts=st.lists(st.integers(0, 300).map(lambda n: bytes([n % 251]) * n), max_size=40))
@settings(max_examples=300)
def test_coalesced_keeps_every_byte_in_order_and_joins_only_small_parts(parts: list[bytes]) -> None:
    sent = list(coalesced(parts, small=100, batch=250))
    assert b"".join(sent) == b"".join(parts)
    assert all(sent)  # no empty sends
    for chunk in sent:
        # a big part goes alone and as it is; joined small ones stay under batch + small
        assert any(chunk is p for p in parts if len(p) >= 100) or len(chunk) < 250 + 100


def test_many_small_parts_become_few_sends() -> None:
    assert len(list(coalesced([b"x" * 400] * 20_000))) == 31  # 8 MB in sends of 256 kB


def test_stdin_parts_takes_none_bytes_or_buffers() -> None:
    assert stdin_parts(None) == ()
    assert stdin_parts(b"ab") == (b"ab",)
    assert stdin_parts([b"a", b"b"]) == [b"a", b"b"]


def test_paramikos_thread_sleeps_a_third_of_the_keepalive_at_most_and_never_zero() -> None:
    assert idle_wake_s(15) == IDLE_WAKE_S == 5.0
    assert idle_wake_s(6) == 2.0  # a short keepalive is still checked in time
    assert idle_wake_s(600) == IDLE_WAKE_S
    assert idle_wake_s(0) == IDLE_WAKE_S  # no keepalive: a timeout, not a spinning socket


def test_the_connection_sends_without_nagle_and_acks_at_once_from_its_first_packet() -> None:
    """The handshake itself is small packets back to back: with Nagle's algorithm on
    until after the login, every login waited 40 ms for the host's delayed ACK; and
    without prompt ACKs here, the host's answer to the first channel waited 40 ms.
    Past the first reads, ACKs are delayed again (a stream costs less CPU so)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        sock = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        try:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
            transport = _new_transport(sock, key_types=list)
            used = transport.sock
            assert isinstance(used, _PromptAckSocket)  # a socket: paramiko reads its `_closed`
            assert used.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert used.getpeername() == server.getsockname()
            assert transport.get_security_options().ciphers[0].endswith("-gcm@openssh.com")
            peer.sendall(b"SSH-2.0-x\r\n")
            assert used.recv(64) == b"SSH-2.0-x\r\n"
            assert used.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
            used.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
            peer.sendall(b"more")
            assert used.recv(64) == b"more"
            assert used.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1  # again
            used.prompt_reads = 0  # past the login and first channel: ACKs as usual
            used.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
            peer.sendall(b"bulk")
            assert used.recv(64) == b"bulk"
            assert used.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 0
        finally:
            peer.close()
            sock.close()


# ---------------------------------------------------------------- dialled ahead


class Listener:
    """A TCP listener on loopback that counts its connections and answers each with a
    line that is no SSH banner (a handshake over it fails at once)."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((address, 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with contextlib.suppress(OSError):
                conn.sendall(b"not ssh\r\n")
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_only_configs_that_cannot_redirect_a_host_let_it_be_dialled_ahead(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("Include /etc/ssh/ssh_config.d/*.conf\nHost *\n    SendEnv LANG LC_*\n")
    assert dial.direct((plain, tmp_path / "missing"))
    for line in ("HostName 10.0.0.5", "  port=2222", "ProxyJump bastion", "Match host x"):
        redirecting = tmp_path / "redirecting"
        redirecting.write_text(f"Host gpu*\n{line}\n")
        assert not dial.direct((plain, redirecting)), line
    unreadable = tmp_path / "dir"
    unreadable.mkdir()  # exists, cannot be read as a file: counts as redirecting
    assert not dial.direct((unreadable,))


def test_a_dialled_connection_is_taken_only_for_the_address_and_port_it_went_to() -> None:
    listener = Listener()
    try:
        dialled = dial.Dialled("127.0.0.1", listener.port, 5)
        assert dialled.take("127.0.0.1", listener.port + 1) is None, "elsewhere: closed"
        again = dial.Dialled("127.0.0.1", listener.port, 5)
        sock = again.take("127.0.0.1", listener.port)
        assert sock is not None and sock.getpeername()[1] == listener.port
        assert sock.gettimeout() == 5, "blocking again, with the connect timeout"
        sock.close()
        by_name = dial.Dialled("localhost", listener.port, 5)  # resolved aside
        sock = by_name.take("localhost", listener.port)
        assert sock is not None and sock.getpeername()[1] == listener.port
        sock.close()
    finally:
        listener.close()


def test_a_dial_that_timed_out_is_a_timeout_and_one_refused_is_left_to_connect_again() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert dial.Dialled("127.0.0.1", port, 5).take("127.0.0.1", port) is None
    # A listener that accepts nothing, its queue full: Linux drops the next SYN.
    full = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = full.getsockname()[1]
    waiting = []
    try:
        for _ in range(3):
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
            waiting.append(client)
        silent = dial.Dialled("127.0.0.1", port, 0.3)
        with pytest.raises(TimeoutError):
            silent.take("127.0.0.1", port)
    finally:
        for client in waiting:
            client.close()
        full.close()


def test_the_handshake_goes_over_the_connection_dialled_ahead_and_no_other() -> None:
    listener = Listener()
    host = Host(name="n1", address="127.0.0.1", port=listener.port)
    try:
        dialled = dial.Dialled("127.0.0.1", listener.port, 5)
        transport = SshTransport(host, ConnectOptions(connect_timeout=5), dialled)
        with pytest.raises(HostError):  # the listener speaks no SSH
            transport.connect()
        transport.close()
        assert listener.accepted == 1, "the dialled connection, and no second one"
    finally:
        listener.close()


def test_each_host_is_dialled_once_and_a_local_one_not_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listener = Listener("127.0.0.2")  # loopback, yet no local host's address
    monkeypatch.setattr(dial, "direct", lambda: True)
    try:
        remote = Host(name="n1", address="127.0.0.2", port=listener.port)
        local = Host(name="here", address="localhost")
        dialled = dial.ahead([remote, remote, local], 5)
        assert list(dialled) == ["n1"]
        sock = dialled["n1"].take("127.0.0.2", listener.port)
        assert sock is not None
        sock.close()
        monkeypatch.setattr(dial, "direct", lambda: False)
        assert dial.ahead([remote], 5) == {}, "where a config could redirect it: none"
    finally:
        listener.close()


def test_a_terminal_session_ends_at_the_hosts_eof_once_drained_not_at_its_exit_status() -> None:
    """sshd may send the exit status while the shell's last output is still on its way:
    `orch ssh` reads on until the host's EOF and then until nothing is left unread."""
    channel = paramiko.Channel(7)  # no transport: its buffers and flags alone
    channel.exit_status = 5
    channel.status_event.set()
    assert channel.exit_status_ready() and not ended(channel)  # output may still come
    channel.in_buffer.feed(b"3000\r\n")
    channel.eof_received = True
    assert not ended(channel)  # the last line is not read yet
    assert channel.recv(100) == b"3000\r\n"
    assert ended(channel)
    channel.in_stderr_buffer.feed(b"bye\n")
    assert not ended(channel)
    assert channel.recv_stderr(100) == b"bye\n" and ended(channel)
