"""A job's attempts on a time line: each node of each attempt as a span of time on its
host, read from what the job's records already hold. Nothing new is recorded for it:

1. The nodes of each attempt, and how each ended, are the record's (the current
   attempt's rows, and `spec["attempts"]` for the earlier ones, as `JobDB.restart`
   keeps them).
2. An attempt's nodes start together: when the job started (the first attempt), else
   when the first piece of the attempt's logs reached the controller
   (records/logmirror.py keeps when each came, beside the copy; only the first and
   last record of each times file is read, whatever the log's size). A node ends when
   the last piece of its logs came; one that printed nothing, when its attempt did
   (its last piece of logs, or the job's end for the current attempt).
3. A host that holds a node rank in an attempt where another host held it in the
   attempt before took that host's place: a spare, or a host the restart moved to.

Logs copied after the fact (a detached job nothing followed) carry the time they were
copied: such an attempt's spans sit where the copy was made.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.models.states import JobState
from orchestrator.records.db import JobRecord
from orchestrator.records.logmirror import LogMirror


@dataclass(frozen=True)
class NodeSpan:
    """One node of one attempt, on its host.

    `start` and `end` are seconds since the epoch on the controller's clock; `end` is
    None while the node runs (or where nothing says when it ended). `took_place_of` is
    the host that held this node rank in the attempt before, where it was another.
    """

    attempt: int  # 0 for the first, as the ranks' ORCH_ATTEMPT
    host: str
    node_rank: int
    state: JobState
    exit_code: int | None
    error: str | None
    start: float | None
    end: float | None
    took_place_of: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "host": self.host,
            "node_rank": self.node_rank,
            "state": self.state.value,
            "exit_code": self.exit_code,
            "error": self.error,
            "start": self.start,
            "end": self.end,
            "took_place_of": self.took_place_of,
        }


@dataclass(frozen=True)
class Timeline:
    """A job's attempts, each node a span (`spans`, attempt by attempt, by node rank)."""

    job_id: str
    state: JobState
    started: float | None
    ended: float | None
    attempts: int  # how many there were so far (the current one included)
    spans: tuple[NodeSpan, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job_id,
            "state": self.state.value,
            "started": self.started,
            "ended": self.ended,
            "attempts": self.attempts,
            "spans": [s.as_json() for s in self.spans],
        }


def timeline(record: JobRecord, logs_root: Path) -> Timeline:
    """The time line of a recorded job (see the module's docstring)."""
    view = record.view
    attempts: list[tuple[int, list[dict[str, Any]]]] = [
        (a.attempt, [dict(n) for n in a.nodes]) for a in view.attempts
    ]
    current = [
        {
            "host": n.host.name,
            "node_rank": n.node_rank,
            "state": n.state.value,
            "exit_code": n.exit_code,
            "error": n.error,
        }
        for n in record.nodes
    ]
    attempts.append((view.attempt, current))
    spans: list[NodeSpan] = []
    before: dict[int, str] = {}  # node rank -> its host in the attempt before
    last_end = record.started
    for index, (attempt, nodes) in enumerate(attempts):
        is_current = index == len(attempts) - 1
        mirror = LogMirror(logs_root, record.id, attempt)
        came = {str(n["host"]): mirror.came_between(str(n["host"])) for n in nodes}
        firsts = [c[0] for c in came.values() if c is not None]
        lasts = [c[1] for c in came.values() if c is not None]
        # An attempt's nodes start together: the first of them to print says when,
        # and the job's own start when it is the first attempt.
        start: float | None
        if index == 0 and record.started is not None:
            start = record.started
        else:
            start = min(firsts) if firsts else last_end
        end = max(lasts) if lasts else None
        if is_current and record.ended is not None:
            end = max(end or record.ended, record.ended)
        held: dict[int, str] = {}
        for n in sorted(nodes, key=lambda n: int(n["node_rank"])):
            host, rank = str(n["host"]), int(n["node_rank"])
            state = JobState.parse(n["state"])
            found = came[host]
            node_end = found[1] if found is not None else end
            if not state.is_terminal():
                node_end = record.ended  # running: None, drawn to now
            previous = before.get(rank)
            spans.append(
                NodeSpan(
                    attempt,
                    host,
                    rank,
                    state,
                    n.get("exit_code"),
                    n.get("error"),
                    start,
                    node_end,
                    previous if previous not in (None, host) else None,
                )
            )
            held[rank] = host
        before = held
        last_end = end if end is not None else last_end
    return Timeline(
        record.id, record.state, record.started, record.ended, len(attempts), _closed(spans)
    )


def _closed(spans: list[NodeSpan]) -> tuple[NodeSpan, ...]:
    """An earlier attempt's node that ended with nothing to say when: it ended by the
    time the next attempt began (or where it began, when that is not known either)."""
    began: dict[int, float] = {}
    for s in spans:
        if s.start is not None:
            began[s.attempt] = min(began.get(s.attempt, s.start), s.start)
    last = max((s.attempt for s in spans), default=0)
    return tuple(
        dataclasses.replace(s, end=began.get(s.attempt + 1, s.start))
        if s.end is None and s.state.is_terminal() and s.attempt < last
        else s
        for s in spans
    )
