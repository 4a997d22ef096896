"""The frames and records the controller and the agent stream to each other.

**Frames** carry the code push and gc on stdin, so that no name or byte of the
user's ever passes through a shell: one kind byte, an 8-byte big-endian length,
the payload.

    H  {"store": DIR, "push": TOKEN}                       always first
    P  {"k": KEY, "off": N, "size": N, "z": 0|1}  then B  a piece of an object
    M  zlib(canonical manifest)                            a manifest the host lacks
    S  {"digest", "job_dir", "setup", "keep"[, "nodes"]}   build the job's snapshot
    Z  (empty)                                             the end

**Follow records** (`follow`): a JSON header line per record; a `data` record is
followed by its N raw bytes (Z bytes when zlib-compressed):

    {"k": "data", "s": STREAM, "o": OFFSET, "n": N[, "z": Z]}   complete lines of a log
                                                                (and a \\r bar's redraws)
    {"k": "hb"}                                                 idle heartbeat
    {"k": "exit", EXIT RECORD}                                  the node ended, all sent
    {"k": "end", NODE STATUS}                                   --once: all sent for now
"""

from __future__ import annotations

import struct

from . import cjson  # not json: its import costs every host command 5 ms (cjson.py)

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any

FRAME = struct.Struct(">cQ")  # kind, payload length
MAX_FRAME = 256 << 20


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return FRAME.pack(kind, len(payload)) + payload


def json_frame(kind: bytes, data: dict[str, Any]) -> bytes:
    return frame(kind, cjson.dumps(data).encode())  # ensure_ascii, as json.dumps


def read_exact(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("input ended in the middle of a frame")
    return bytes(data)


def read_frame(stream: Any) -> tuple[bytes, bytes]:
    kind, size = FRAME.unpack(read_exact(stream, FRAME.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is too large")
    return kind, read_exact(stream, size)


def send_record(out: Any, record: dict[str, Any]) -> None:
    """One JSON record line; all but data records go out at once."""
    out.write(cjson.dumps(record).encode() + b"\n")
    if record.get("k") != "data":
        out.flush()


def widen_pipe(fd: int) -> None:
    """Give the pipe to or from sshd 1 MB instead of 64 kB (Linux): each side then
    waits for the other far less often (a push of 8 hosts on 2 cores: -20% CPU).
    Anything else (a file, a terminal) is left as it is."""
    import contextlib
    import fcntl

    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
