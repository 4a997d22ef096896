"""How a job failed, in words: the first failing host and rank, how it ended, and the
last lines it wrote. Both backends end a failed job's follow with it."""

from __future__ import annotations

import re
import signal
from collections import deque
from collections.abc import Mapping, Sequence

from orchestrator.models.clocks import HostClock
from orchestrator.records.db import JobRecord
from orchestrator.reporting.follow import NodeExit

TAIL_LINES = 20


def describe_exit(event: NodeExit) -> str:
    """How a node ended, in words."""
    if event.killed:
        return f"node {event.host} was killed"
    if event.returncode is None:
        return f"lost node {event.host} ({event.reason or 'unknown'})"
    if event.returncode < 0:
        return f"node {event.host} was killed by {_signal_name(-event.returncode)}"
    return f"node {event.host} exited with code {event.returncode}"


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


_ROOT_RANK = re.compile(rb"^\s*rank\s*:\s*(\d+)")


_ROOT_EXIT = re.compile(rb"^\s*exitcode\s*:\s*(-?\d+)")


def root_cause(torchrun_tail: Sequence[bytes]) -> tuple[int | None, int | None]:
    """The first failing rank and its exit code, from torchrun's failure report."""
    lines = list(torchrun_tail)
    start = next((i for i, line in enumerate(lines) if b"Root Cause" in line), None)
    rank = code = None
    for line in lines[start or 0 :]:
        if rank is None and (m := _ROOT_RANK.match(line)):
            rank = int(m.group(1))
        elif code is None and (m := _ROOT_EXIT.match(line)):
            code = int(m.group(1))
    return rank, code


def first_in_time(
    failures: Sequence[tuple[str, float | None]], clocks: Mapping[str, HostClock]
) -> int:
    """Which failure happened first, in time on the hosts' clocks.

    Args:
        failures: (host, the host's time of it) in the order they arrived here; no
            time where the host could not say (a lost host).
        clocks: how each host's clock stood to this machine's, as its probe measured it.

    Returns:
        The index of the first: a failure takes the place of the one before it only
        when, on this machine's clock, it surely happened earlier (their windows do
        not meet). Where that cannot be told (a host's clock not measured, no time, or
        windows that overlap), the arrival order stands.
    """

    def window(index: int) -> tuple[float, float] | None:
        host, when = failures[index]
        clock = clocks.get(host)
        return None if when is None or clock is None else clock.here(when)

    first = 0
    for index in range(1, len(failures)):
        this, before = window(index), window(first)
        if this is not None and before is not None and this[1] < before[0]:
            first = index
    return first


def failure_summary(
    record: JobRecord, failure: NodeExit, tails: dict[tuple[str, int | None], deque[bytes]]
) -> str:
    """The first failing host and rank, how it ended, and the end of its output."""
    node = record.node(failure.host)
    own = list(tails.get((failure.host, None), ()))  # torchrun's, or a script's of its own
    rank, code = root_cause(own)
    if rank is None:  # no torchrun report: the rank whose output ends in a traceback
        rank = next(
            (
                r
                for r in node.ranks
                if any(b"Traceback" in line for line in tails.get((node.host.name, r), ()))
            ),
            None,
        )
    what = describe_exit(failure)
    if rank is not None:
        how = (
            ""
            if code is None
            else (f", exit code {code}" if code >= 0 else f", {_signal_name(-code)}")
        )
        what += f"; first failure: rank {rank}{how}"
    lines = [f"job {record.id} failed: {what}"]
    tail = tails.get((failure.host, rank)) if rank is not None else None
    if tail:
        lines.append(f"last lines of [{failure.host} r{rank}]:")
        lines.extend("  " + line.decode("utf-8", "replace") for line in tail)
    elif rank is None and any(b"Traceback" in line for line in own):
        # No rank of its own: `launcher: python`'s script, whose output is the node's.
        lines.append(f"last lines of [{failure.host}]:")
        lines.extend("  " + line.decode("utf-8", "replace") for line in own)
    return "\n".join(lines)
