"""`outputs DIR` (stdin: {"paths": [glob...], "have": {path: [size, mtime_ns]}}): send the
job's outputs that the controller lacks, as frames on stdout.

DIR is the job's output directory (ORCH_OUTPUT_DIR). Every regular file, symlink and
directory below it that a glob of `paths` matches (a directory matches with all it
holds; no globs: everything) is listed; a file's bytes go only when the controller's
copy differs in size or mtime. Symlinks are sent as links, never followed.

Frames: D {"path", "mode"} a directory; L {"path", "target"} a symlink; F {"path",
"size", "mode", "mtime_ns"} a file, then its bytes in B frames; U {"path"} a file the
controller has as it is; E {"path", "error"} a file that could not be read (after
its F frame, if one went: the controller drops what it got of it); Z {"files",
"bytes"} at the end.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
import sys
from typing import Any

from ..kernel.fileio import describe_error
from ..kernel.framing import frame, json_frame
from ..kernel.messages import parse_message
from ..kernel.requests import OutputsRequest

CHUNK_BYTES = 1 << 20


def main(args: list[str]) -> int:
    root = os.path.expanduser(args[0])
    try:
        request = parse_message(OutputsRequest, json.loads(sys.stdin.read() or "{}"))
    except ValueError as exc:  # bad JSON, or a MessageError: a controller of another version
        sys.stderr.write(f"orch agent outputs: {exc}\n")
        return 2
    out = sys.stdout.buffer
    sent = {"files": 0, "bytes": 0}
    have = dict(request.have or {})
    try:
        for path, st in walk(root, list(request.paths)):
            try:
                send(out, root, path, st, have, sent)
            except OSError as exc:  # that file only: the rest still comes
                out.write(json_frame(b"E", {"path": path, "error": describe_error(exc)}))
    except OSError as exc:
        out.write(json_frame(b"E", {"error": describe_error(exc)}))
    out.write(json_frame(b"Z", sent))
    out.flush()
    return 0


def walk(root: str, patterns: list[str]) -> Any:
    """(relative path, lstat) of everything below root that the patterns select, parents
    before children; symlinks to directories are entries, not directories to enter."""
    if not os.path.isdir(root):
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = os.path.relpath(dirpath, root)
        for name in [*dirnames, *sorted(filenames)]:
            path = name if base == "." else f"{base}/{name}"
            if selected(path, patterns):
                yield path, os.lstat(os.path.join(root, path))


def selected(path: str, patterns: list[str]) -> bool:
    """Whether a glob selects `path`, or one of the directories it lies in."""
    if not patterns:
        return True
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(
        fnmatch.fnmatchcase(p, pattern.rstrip("/")) for pattern in patterns for p in prefixes
    )


def send(
    out: Any, root: str, path: str, st: os.stat_result, have: dict[str, Any], sent: dict[str, int]
) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        out.write(json_frame(b"D", {"path": path, "mode": mode}))
    elif stat.S_ISLNK(st.st_mode):
        out.write(json_frame(b"L", {"path": path, "target": os.readlink(os.path.join(root, path))}))
    elif stat.S_ISREG(st.st_mode):
        if have.get(path) == [st.st_size, st.st_mtime_ns]:
            out.write(json_frame(b"U", {"path": path}))
            return
        meta = {"path": path, "size": st.st_size, "mode": mode, "mtime_ns": st.st_mtime_ns}
        with open(os.path.join(root, path), "rb") as f:  # before F: a file it cannot read
            out.write(json_frame(b"F", meta))
            left = st.st_size  # what it held when listed: a file still growing stops there
            while left > 0 and (chunk := f.read(min(CHUNK_BYTES, left))):
                out.write(frame(b"B", chunk))
                left -= len(chunk)
        out.write(frame(b"B"))  # the end of the file's bytes
        sent["files"] += 1
        sent["bytes"] += st.st_size
