"""`follow JOB_DIR [OFFSETS] [--once]`: stream the node's log files as follow records
(see kernel/framing.py), from byte offsets, until the node has ended and all is sent."""

from __future__ import annotations

import os
import sys
import time
import zlib

from ..kernel import cjson
from ..kernel.framing import send_record, widen_pipe
from ..kernel.layout import LOGS, TORCHRUN_LOG
from . import state

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any

POLL_S = 0.05
MAX_LINE = 8 << 20  # lines up to this long are kept whole; longer ones go in pieces
HEARTBEAT_S = 2.0
COMPRESS_FROM = 4096  # smaller chunks go as they are: latency matters more there


def main(args: list[str]) -> int:
    """Stream the node's log files from the given byte offsets, as framed chunks.

    Each chunk is a JSON header line `{"k": "data", "s": STREAM, "o": OFFSET, "n": N}`
    followed by N raw bytes: complete lines (and an unfinished one that holds a `\\r`: a
    progress bar being redrawn), exactly as they are in the file at OFFSET, so a reader
    can mirror the file and never double or lose a line. With `"z": Z` the chunk
    travels zlib-compressed in Z bytes (logs shrink ~10x, and the controller's SSH
    decryption is what limits throughput). A heartbeat `{"k": "hb"}` comes every
    HEARTBEAT_S while idle; the last record is `{"k": "exit", ...}` once the node has
    ended and every file is drained, or `{"k": "end"}` with `--once` (drain what is
    there now, then stop).
    """
    os.chdir(os.path.expanduser(args[0]))
    offsets: dict[str, int] = cjson.loads(args[1]) if len(args) > 1 else {}
    once = "--once" in args[2:]
    widen_pipe(1)
    out = sys.stdout.buffer
    last_beat = time.monotonic()
    while True:
        finished = state.ended()  # looked at before draining: no line can be missed
        sent = behind = False
        for stream, path in log_files():
            stream_sent, stream_behind = send_new(
                out, stream, path, offsets, final=finished is not None
            )
            sent, behind = sent or stream_sent, behind or stream_behind
        if sent:
            out.flush()  # now, not at the next heartbeat: latency is the point
            last_beat = time.monotonic()
        if behind:
            continue  # catch up before sleeping
        if finished is not None:
            send_record(out, {"k": "exit", **finished})
            return 0
        if once:
            send_record(out, {"k": "end", **state.status().as_dict()})
            return 0
        if time.monotonic() - last_beat >= HEARTBEAT_S:
            send_record(out, {"k": "hb"})
            last_beat = time.monotonic()
        time.sleep(POLL_S)


def log_files() -> list[tuple[str, str]]:
    files = [("node", TORCHRUN_LOG)]
    try:
        names = os.listdir(LOGS)
    except OSError:
        names = []
    for name in sorted(names):
        if name.startswith("rank-") and name.endswith(".log"):
            files.append((name[5:-4], os.path.join(LOGS, name)))
    return files


def send_new(
    out: Any, stream: str, path: str, offsets: dict[str, int], final: bool
) -> tuple[bool, bool]:
    """Send the complete lines of `path` past its offset.

    A partial last line waits for its newline, unless the node has ended (`final`), it
    grew past MAX_LINE, or it holds a `\\r` (a progress bar): then it goes as it is.

    Returns:
        (whether anything was sent, whether more may be waiting already).
    """
    offset = offsets.get(stream, 0)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(MAX_LINE)
    except OSError:
        return False, False
    full = len(data) == MAX_LINE
    end = data.rfind(b"\n") + 1
    if (final and not full) or (end == 0 and full) or data.find(b"\r", end) >= 0:
        # The node ended: the rest goes; or one line too long for a block; or a progress
        # bar being redrawn with \r, which may go an hour without a newline: its latest
        # state goes now, so that the user sees it move.
        end = len(data)
    if end == 0:
        return False, False
    payload = data[:end]
    header: dict[str, Any] = {"k": "data", "s": stream, "o": offset, "n": end}
    if end >= COMPRESS_FROM:
        packed = zlib.compress(payload, 1)
        if len(packed) < end * 0.8:
            header["z"], payload = len(packed), packed
    send_record(out, header)
    out.write(payload)
    offsets[stream] = offset + end
    return True, full
