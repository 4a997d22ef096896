"""Setup commands and the processes they start: the error every room raises, running a
command (its failure a ``ClusterError`` with its stderr), the PID 1 that ``unshare
--fork`` made, and killing a group of processes children first."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class ClusterError(RuntimeError):
    """The test cluster could not be built, or a host is not in the state asked for."""


def _run(
    argv: Sequence[str], *, check: bool = True, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run a setup command; a failure raises with its stderr."""
    result = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise ClusterError(
            f"{shlex.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
        )
    return result


def _run_input(argv: Sequence[str], stdin: str) -> str:
    """Run a setup command with ``stdin`` (a secret stays out of its argv); its stdout."""
    result = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        raise ClusterError(
            f"{shlex.join(argv)} exited {result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout


def _json_list(argv: Sequence[str]) -> list[dict[str, Any]]:
    """Parse the ``-j`` output of an ``ip`` listing (empty output means none)."""
    out = _run(argv).stdout.strip()
    return json.loads(out) if out else []


def _child_pid(parent: int, timeout: float = 5) -> int:
    """The single child of ``parent``: the process ``unshare --fork`` made PID 1."""
    children = Path(f"/proc/{parent}/task/{parent}/children")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            pids = children.read_text().split()
        except OSError as exc:
            raise ClusterError(f"unshare ({parent}) exited before forking its PID 1") from exc
        if pids:
            return int(pids[0])
        time.sleep(0.01)
    raise ClusterError(f"unshare ({parent}) forked no PID 1 within {timeout}s")


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` from its third field on (state, parent, ... start time at
    index 19), or None once the process is gone. Split after the command's ")": a
    command name may hold spaces and parentheses."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _kill_children_first(pids: Sequence[int]) -> None:
    """SIGKILL ``pids``; those whose parent is among them go first.

    A parent killed before its child is reaped orphans the child to the machine's
    init, which may never reap it; given time, the parents (unshare) reap and exit.
    """

    def parent_of(pid: int) -> int | None:
        fields = stat_fields(pid)
        return int(fields[1]) if fields else None

    def kill(group: Sequence[int]) -> None:
        for pid in group:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    children = [pid for pid in pids if parent_of(pid) in pids]
    kill(children)
    time.sleep(0.2)
    kill([pid for pid in pids if pid not in children])
