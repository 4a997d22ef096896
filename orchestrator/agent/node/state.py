"""A node's state as its job directory records it: started, running, ended how."""

from __future__ import annotations

import os
import time

from ..host import proc
from ..kernel.fileio import read_json
from ..kernel.layout import EXIT, KILLED, LOGS, NODE_SPEC, PIDS, TORCHRUN_LOG
from ..kernel.replies import ExitRecord, StatusReply

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any


def exit_record() -> ExitRecord | None:
    """How the node in the current directory ended, or None while it runs (or was
    never started)."""
    finished = read_json(EXIT)
    if finished is not None:
        return ExitRecord(**{**finished, "killed": os.path.exists(KILLED)})
    started = read_json(PIDS)
    if started and not proc.alive(started["supervisor"]) and not os.path.exists(EXIT):
        return ExitRecord(
            returncode=None,
            error="the supervisor vanished (host rebooted?)",
            killed=os.path.exists(KILLED),
        )
    if not started and not os.path.exists(NODE_SPEC):
        return ExitRecord(
            returncode=None, error="the node was never started", killed=os.path.exists(KILLED)
        )
    return None


def idle(node_dir: str = ".") -> float | None:
    """Seconds since the node's ranks or its launcher last wrote anything, or since its
    ranks started where none has yet; None where no rank has started (a node waiting in
    line, or in its setup)."""
    latest = None
    started = False
    logs = os.path.join(node_dir, LOGS)
    for folder, names in (
        (logs, os.listdir(logs) if os.path.isdir(logs) else []),
        (node_dir, [TORCHRUN_LOG]),
    ):
        for name in names:
            if not name.startswith(("rank-", "torchrun")) or not name.endswith((".log", ".pid")):
                continue
            started = started or name.endswith(".pid")
            try:
                when = os.stat(os.path.join(folder, name)).st_mtime
            except OSError:
                continue
            latest = when if latest is None else max(latest, when)
    if not started or latest is None:
        return None
    return round(max(0.0, time.time() - latest), 3)


def ended() -> dict[str, Any] | None:
    """`exit_record()` as JSON data."""
    record = exit_record()
    return None if record is None else record.as_dict()


def status() -> StatusReply:
    """The node in the current directory."""
    started = read_json(PIDS)
    return StatusReply(
        started=started is not None,
        ended=exit_record(),
        running=started is not None and proc.alive(started["pid"]),
    )
