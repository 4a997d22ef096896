"""Pure parts of the transports."""

from __future__ import annotations

import socket

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.transport.base import coalesced, stdin_parts
from orchestrator.transport.ssh import (
    IDLE_WAKE_S,
    _new_transport,
    _PromptAckSocket,
    idle_wake_s,
)


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
