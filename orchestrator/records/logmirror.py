"""The controller's copy of every job's logs.

`$ORCH_HOME/logs/<job>/<host>/<stream>.log` is a byte-exact prefix of the host's own
file (`torchrun.log` for the stream `node`, `logs/rank-N.log` for rank N). Chunks
from the hosts arrive with their byte offset and are written at that offset, so two
controllers following the same job (an attached submit and an `orch logs -f`), or one
that reconnects, can never double or drop a line: the file's size is where the next
read starts. A dead host's lines stay readable up to the moment it died.

Beside each stream, `<stream>.times` says when its bytes arrived: a 16-byte record per
write (the offset its bytes end at, the controller's clock), so that the curves of
`orch ui` plot what a rank printed against the time it came. A write costs one more
small append; bytes first copied after the fact carry the time they were copied.
"""

from __future__ import annotations

import math
import os
import re
import struct
import threading
import time
from pathlib import Path

NODE_STREAM = "node"
_STREAM = re.compile(r"^(node|\d+)$")
_TIME = struct.Struct("<Qd")  # where a write's bytes end, and when they came


def rank_of(stream: str) -> int | None:
    """The global rank a stream belongs to; None for the node's torchrun output."""
    return int(stream) if stream.isdigit() else None


class LogMirror:
    """Local mirror of one job's log files, safe to write from several threads."""

    def __init__(self, root: Path, job_id: str, attempt: int = 0) -> None:
        # A restarted job's attempts each have their own nodes' files, so their own copy.
        self.dir = root / (job_id if attempt == 0 else f"{job_id}.attempt{attempt}")
        self._fds: dict[tuple[str, str], int] = {}
        self._time_fds: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def _path(self, host: str, stream: str) -> Path:
        if not _STREAM.match(stream):
            raise ValueError(f"bad stream name {stream!r}")
        return self.dir / host / f"{stream}.log"

    def offsets(self, host: str) -> dict[str, int]:
        """How many bytes of each of a host's streams are here already."""
        folder = self.dir / host
        if not folder.is_dir():
            return {}
        return {p.stem: p.stat().st_size for p in folder.glob("*.log") if _STREAM.match(p.stem)}

    def write(self, host: str, stream: str, offset: int, data: bytes) -> None:
        """Store bytes that sit at `offset` in the host's file (and when they came)."""
        key = (host, stream)
        with self._lock:
            fd = self._fds.get(key)
            if fd is None:
                path = self._path(host, stream)
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                self._fds[key] = fd
                self._time_fds[key] = os.open(
                    path.with_suffix(".times"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
                )
            times = self._time_fds[key]
        os.pwrite(fd, data, offset)
        if data:
            os.write(times, _TIME.pack(offset + len(data), time.time()))

    def arrivals(
        self, host: str, stream: str, start: int = 0
    ) -> tuple[list[tuple[int, float]], int]:
        """When a stream's bytes came, from byte `start` of its times file: (end offset,
        time) per write, and the times file's offset to read on from. Two controllers
        that copied the same bytes both said so: a reader takes the earlier time."""
        try:
            with self._path(host, stream).with_suffix(".times").open("rb") as f:
                f.seek(start)
                raw = f.read()
        except FileNotFoundError:
            return [], start
        whole = len(raw) - len(raw) % _TIME.size
        return [_TIME.unpack_from(raw, i) for i in range(0, whole, _TIME.size)], start + whole

    def came_between(self, host: str) -> tuple[float, float] | None:
        """When the first and the last piece of any of a host's streams came (None:
        nothing came, or a copy older than arrival times). Reads only the first and
        last record of each times file, whatever the log's size."""
        folder = self.dir / host
        if not folder.is_dir():
            return None
        first, last = math.inf, -math.inf
        for times in folder.glob("*.times"):
            try:
                with times.open("rb") as f:
                    head = f.read(_TIME.size)
                    whole = f.seek(0, os.SEEK_END) // _TIME.size * _TIME.size
                    if len(head) < _TIME.size:
                        continue
                    f.seek(whole - _TIME.size)
                    tail = f.read(_TIME.size)
            except OSError:
                continue
            for _, when in (_TIME.unpack(head), _TIME.unpack(tail)):
                first, last = min(first, when), max(last, when)
        return (first, last) if first <= last else None

    def streams(self, host: str) -> list[str]:
        """A host's streams: the node's torchrun output first, then ranks in order."""
        names = self.offsets(host)
        return sorted(names, key=lambda s: -1 if s == NODE_STREAM else int(s))

    def read(self, host: str, stream: str, tail: int | None = None) -> bytes:
        """The bytes stored for a stream, or only its last `tail` lines."""
        try:
            data = self._path(host, stream).read_bytes()
        except FileNotFoundError:
            return b""
        if tail is None:
            return data
        start = len(data) - 1 if data.endswith(b"\n") else len(data)
        for _ in range(max(tail, 0)):
            start = data.rfind(b"\n", 0, start)
            if start < 0:
                return data
        return data[start + 1 :] if tail > 0 else b""

    def close(self) -> None:
        with self._lock:
            for fd in [*self._fds.values(), *self._time_fds.values()]:
                os.close(fd)
            self._fds.clear()
            self._time_fds.clear()
