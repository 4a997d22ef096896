"""A node's state as its job directory records it: started, running, ended how."""

from __future__ import annotations

import os
from typing import Any

from ..host import proc
from ..kernel.protocol import EXIT, KILLED, NODE_SPEC, PIDS, read_json


def ended() -> dict[str, Any] | None:
    """How the node in the current directory ended (an ExitRecord), or None while it
    runs (or was never started)."""
    finished = read_json(EXIT)
    if finished is not None:
        finished["killed"] = os.path.exists(KILLED)
        return finished
    started = read_json(PIDS)
    if started and not proc.alive(started["supervisor"]) and not os.path.exists(EXIT):
        return {
            "returncode": None,
            "error": "the supervisor vanished (host rebooted?)",
            "killed": os.path.exists(KILLED),
        }
    if not started and not os.path.exists(NODE_SPEC):
        return {
            "returncode": None,
            "error": "the node was never started",
            "killed": os.path.exists(KILLED),
        }
    return None


def status() -> dict[str, Any]:
    """The node in the current directory as a NodeStatus."""
    started = read_json(PIDS)
    return {
        "started": started is not None,
        "ended": ended(),
        "running": started is not None and proc.alive(started["pid"]),
    }
