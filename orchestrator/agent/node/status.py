"""`status JOB_DIR`: one StatusReply line; `exists` false where there is no job dir."""

from __future__ import annotations

import os

from ..kernel.framing import send_record
from ..kernel.replies import StatusReply
from . import state


def main(args: list[str]) -> int:
    import sys

    job_dir = os.path.expanduser(args[0])
    if not os.path.isdir(job_dir):
        record = StatusReply(started=False, running=False, ended=None, exists=False)
        send_record(sys.stdout.buffer, record.as_dict())
        return 0
    os.chdir(job_dir)
    status = state.status()
    status.exists = True
    if status.running:
        status.idle_s = state.idle()
    send_record(sys.stdout.buffer, status.as_dict())
    return 0
