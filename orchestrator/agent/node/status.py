"""`status JOB_DIR`: one NodeStatus line; `exists` false where there is no job dir."""

from __future__ import annotations

import os

from ..kernel.protocol import send_record
from . import state


def main(args: list[str]) -> int:
    import sys

    job_dir = os.path.expanduser(args[0])
    if not os.path.isdir(job_dir):
        record = {"started": False, "running": False, "ended": None, "exists": False}
        send_record(sys.stdout.buffer, record)
        return 0
    os.chdir(job_dir)
    send_record(sys.stdout.buffer, {**state.status(), "exists": True})
    return 0
