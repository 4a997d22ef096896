"""A node's state as its job directory records it: started, running, ended how."""

from __future__ import annotations

import os

from ..host import proc
from ..kernel.fileio import read_json
from ..kernel.layout import EXIT, KILLED, NODE_SPEC, PIDS
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
