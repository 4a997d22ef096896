"""`keeper start|member|show|stop DIR`: the keeper's commands on a host. Apart from
the daemon and the member it starts, since a member may become the keeper itself
(takeover.py runs a KeeperDaemon in the member's process)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .daemon import show, start_keeper, stop
from .member import start_member

VERBS: dict[str, Callable[[str], int]] = {
    "start": start_keeper,
    "member": start_member,
    "show": show,
    "stop": stop,
}


def main(args: list[str]) -> int:
    if len(args) != 2 or args[0] not in VERBS:
        sys.stderr.write("usage: keeper start|member|show|stop DIR\n")
        return 2
    return VERBS[args[0]](os.path.expanduser(args[1]))
