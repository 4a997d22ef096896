"""A daemon that outlives the SSH channel that started it: the node's supervisor, the
keeper and its members. The channel waits for its first reply, then may close."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def daemonize(
    log_name: str, body: Callable[[int], int], died: str = "the daemon died before it was ready"
) -> int:
    """Run `body(ready_fd)` in a daemon of its own session, its output appended to
    `log_name` (owner-only); print what it writes to `ready_fd` (a JSON reply), or
    `died` as an error when it closes that pipe without a word.

    Returns:
        0 when the reply is not an error, 1 otherwise.
    """
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:
        os.close(ready_r)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        log = os.open(log_name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        code = 1
        try:
            code = body(ready_w)
        finally:
            os._exit(code)
    os.close(ready_w)
    report = b""
    while chunk := os.read(ready_r, 4096):
        report += chunk
    print(report.decode() or json.dumps({"error": died}))
    return 0 if report and b'"error"' not in report else 1
