"""The push's byte stream: frames, pieces, compression, and the shared piece cache."""

from __future__ import annotations

import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.kernel import framing
from orchestrator.sync import wire


def read_frames(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    stream = io.BytesIO(data)
    while header := stream.read(framing.FRAME.size):
        kind, size = framing.FRAME.unpack(header)
        yield kind, stream.read(size)


def decode(encoded: bytes) -> tuple[dict[str, object], bytes]:
    (p_kind, meta), (b_kind, payload) = read_frames(encoded)
    assert (p_kind, b_kind) == (b"P", b"B")
    info = json.loads(meta)
    return info, zlib.decompress(payload) if info["z"] else payload


def test_objects_are_cut_into_pieces_and_an_empty_file_is_one_piece() -> None:
    size = 2 * wire.PIECE_BYTES + 5
    cut = wire.pieces("k", "big.bin", size)
    assert [(p.off, p.length) for p in cut] == [
        (0, wire.PIECE_BYTES),
        (wire.PIECE_BYTES, wire.PIECE_BYTES),
        (2 * wire.PIECE_BYTES, 5),
    ]
    assert [(p.off, p.length) for p in wire.pieces("e", "empty", 0)] == [(0, 0)]


def test_round_trips_take_about_the_budget_and_at_least_one_piece() -> None:
    todo = [wire.Piece(str(n), "f", 0, 100, 100) for n in range(10)]
    assert wire.batch_end(todo, 0, 250) == 3
    assert wire.batch_end(todo, 3, 1) == 4
    assert wire.batch_end(todo, 8, 10_000) == 10
    huge = [wire.Piece("h", "f", 0, 10**9, 10**9)]
    assert wire.batch_end(huge, 0, 100) == 1


def test_text_travels_compressed_and_random_bytes_as_they_are(tmp_path: Path) -> None:
    text = b"import torch\n" * 4000
    noise = os.urandom(100_000)
    (tmp_path / "t.py").write_bytes(text)
    (tmp_path / "n.bin").write_bytes(noise)
    info, data = decode(
        wire.encode_piece(tmp_path, wire.Piece("kt", "t.py", 0, len(text), len(text)))
    )
    assert info == {"k": "kt", "off": 0, "size": len(text), "z": 1} and data == text
    piece = wire.Piece("kn", "n.bin", 50_000, 50_000, 100_000)
    info, data = decode(wire.encode_piece(tmp_path, piece))
    assert info["z"] == 0 and data == noise[50_000:]


def test_a_file_shorter_than_when_it_was_hashed_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"12345")
    with pytest.raises(wire.ChangedDuringPush) as info:
        wire.encode_piece(tmp_path, wire.Piece("k", "a", 0, 10, 10))
    assert info.value.path == "a"


def test_hosts_share_one_encoding_of_each_piece_then_let_it_go(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 1000)
    piece = wire.Piece("k", "a", 0, 1000, 1000)
    cache = wire.PieceCache(tmp_path)
    for _host in range(3):
        cache.expect([piece])
    first = cache.take(piece)
    (tmp_path / "a").write_bytes(b"y" * 1000)  # not read again: the encoding is reused
    assert cache.take(piece) is first
    assert cache.held_bytes == len(first)
    cache.forgo([piece])  # the third host turned out to have it
    assert cache.held_bytes == 0


def test_the_cache_holds_nothing_past_its_limit(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(os.urandom(1000))
    piece = wire.Piece("k", "a", 0, 1000, 1000)
    cache = wire.PieceCache(tmp_path, limit=100)
    cache.expect([piece, piece])
    cache.take(piece)
    assert cache.held_bytes == 0
