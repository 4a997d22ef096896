"""The byte stream a code push sends to a host's agent (`sync`).

A stream is a sequence of frames (their table is in agent/kernel/framing.py, which both
sides import). Names and hashes travel inside JSON payloads, file content inside B
frames, so nothing the stream carries is ever parsed by a shell.

Objects travel in pieces of at most PIECE_BYTES, so that neither side ever holds a
large file whole, and so that a push can be cut into several round trips. A piece is
zlib-compressed (level 1) only when a sample of it compresses: random or already
compressed data is sent as it is rather than burning CPU for nothing.
"""

from __future__ import annotations

import threading
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agent.kernel.framing import frame, json_frame

PIECE_BYTES = 4 << 20
SAMPLE_BYTES = 4 << 10
COMPRESS_LEVEL = 1
WORTH_COMPRESSING = 0.9  # send compressed only when it saves at least a tenth
CACHE_LIMIT_BYTES = 256 << 20


class ChangedDuringPush(Exception):
    """A file no longer has the size it had when it was hashed."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


@dataclass(frozen=True)
class Piece:
    """Bytes [off, off + length) of the object `key`, read from `path` under the root."""

    key: str
    path: str
    off: int
    length: int
    size: int  # of the whole object


def pieces(key: str, path: str, size: int) -> list[Piece]:
    """An object cut into pieces; an empty file is one empty piece."""
    offsets = range(0, size, PIECE_BYTES) if size else [0]
    return [Piece(key, path, off, min(PIECE_BYTES, size - off), size) for off in offsets]


def batch_end(todo: Sequence[Piece], start: int, budget: int) -> int:
    """Where the round trip that starts at todo[start] ends: about `budget` raw bytes
    (at least one piece, whatever its size)."""
    end = start
    while end < len(todo) and (end == start or budget > 0):
        budget -= max(todo[end].length, 1)
        end += 1
    return end


def encode_piece(root: Path, piece: Piece) -> bytes:
    """The P and B frames of a piece, its content read from disk now.

    Raises:
        ChangedDuringPush: the file is shorter than when it was hashed.
        OSError: it cannot be read.
    """
    with (root / piece.path).open("rb") as f:
        f.seek(piece.off)
        data = f.read(piece.length)
    if len(data) != piece.length:
        raise ChangedDuringPush(piece.path)
    compressed = _compressed(data)
    meta = {"k": piece.key, "off": piece.off, "size": piece.size, "z": int(compressed is not None)}
    return json_frame(b"P", meta) + frame(b"B", data if compressed is None else compressed)


def _compressed(data: bytes) -> bytes | None:
    if len(data) < 64:
        return None
    sample = data[:SAMPLE_BYTES]
    if len(zlib.compress(sample, COMPRESS_LEVEL)) > WORTH_COMPRESSING * len(sample):
        return None
    packed = zlib.compress(data, COMPRESS_LEVEL)
    return packed if len(packed) < WORTH_COMPRESSING * len(data) else None


class PieceCache:
    """Encoded pieces shared by the hosts of one push: each piece is read and
    compressed once, however many hosts need it.

    A piece stays cached until every host that was expected to need it took it, and
    only while the cache holds less than `limit` bytes; beyond that, hosts encode
    their own copy (hosts far apart then cost CPU, and each holds its own two
    batches, see push.BATCH_BYTES).
    """

    def __init__(self, root: Path, limit: int = CACHE_LIMIT_BYTES) -> None:
        self.root = root
        self._demand: Counter[Piece] = Counter()
        self._limit = limit
        self._held = 0
        self._done: dict[Piece, bytes] = {}
        self._locks: dict[Piece, threading.Lock] = {}
        self._lock = threading.Lock()

    def expect(self, todo: Iterable[Piece]) -> None:
        """One more host will take these pieces."""
        with self._lock:
            self._demand.update(todo)

    def forgo(self, todo: Iterable[Piece]) -> None:
        """A host that was expected to take these pieces will not."""
        with self._lock:
            for piece in todo:
                self._settle(piece)

    def take(self, piece: Piece) -> bytes:
        """The piece's frames, encoded once for all hosts that need it."""
        with self._lock:
            piece_lock = self._locks.setdefault(piece, threading.Lock())
        with piece_lock:  # a second host waits for the first one's encoding
            with self._lock:
                data = self._done.get(piece)
            if data is None:
                data = encode_piece(self.root, piece)
            with self._lock:
                wanted = self._settle(piece)  # by another host still
                if wanted and piece not in self._done and self._held + len(data) <= self._limit:
                    self._done[piece] = data
                    self._held += len(data)
        return data

    def _settle(self, piece: Piece) -> bool:
        """One demand for the piece is met; False once none is left (it is dropped)."""
        self._demand[piece] -= 1
        if self._demand[piece] > 0:
            return True
        del self._demand[piece]
        if piece in self._done:
            self._held -= len(self._done.pop(piece))
        self._locks.pop(piece, None)
        return False

    @property
    def held_bytes(self) -> int:
        return self._held
