"""A job's curves, read from its records: the controller's copy of every rank's log
(records/logmirror.py) and when each piece of it came, parsed for the numbers the
ranks print (metrics.py). Nothing is kept beside the logs: the curves of an ended
job are there as long as its log copy is, and two jobs compare by reading both.

A reader goes on from where it stopped, so that a page following a running job
parses each byte once.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.records.logmirror import LogMirror, rank_of
from orchestrator.reporting.metrics import MetricParser
from orchestrator.reporting.progress import Condenser, strip_ansi

READ_BUDGET = 16 << 20  # bytes parsed per read at most: a huge log fills in over reads


@dataclass(frozen=True)
class MetricPoint:
    """One number a rank printed.

    `step` is the step its line names (`step=120`), else the count of this metric's
    earlier points on this rank (0, 1, 2, ...); `time` is when the line reached the
    controller (None: a copy made before orch kept arrival times).
    """

    job_id: str
    host: str
    rank: int
    name: str
    value: float
    step: float
    time: float | None
    attempt: int = 0


@dataclass
class _Stream:
    """How far one rank's log copy has been read."""

    offset: int = 0  # bytes parsed
    times_offset: int = 0  # bytes of its times file read
    arrivals: list[tuple[int, float]] = field(default_factory=list)  # not yet reached
    timed: bool = False  # its times file has said something
    condenser: Condenser = field(default_factory=Condenser)


class CurveReader:
    """The points of one job's ranks, each read once.

    Args:
        logs_root: the controller's log copies (`$ORCH_HOME/logs`).
        job_id: the job.
        parser: what finds the numbers (the job's `metrics:` patterns).
    """

    def __init__(self, logs_root: Path, job_id: str, parser: MetricParser) -> None:
        self.job_id = job_id
        self._root = logs_root
        self._parser = parser
        self._streams: dict[tuple[int, str, str], _Stream] = {}
        self._counts: dict[tuple[int, str], int] = {}

    def read(self, attempts: int = 1, budget: int = READ_BUDGET) -> list[MetricPoint]:
        """The points printed since the last read, of attempts 0 to `attempts` - 1,
        reading at most about `budget` bytes (the rest on the next read)."""
        points: list[MetricPoint] = []
        for attempt in range(attempts):
            mirror = LogMirror(self._root, self.job_id, attempt)
            if not mirror.dir.is_dir():
                continue
            for host_dir in sorted(p for p in mirror.dir.iterdir() if p.is_dir()):
                host = host_dir.name
                for stream in mirror.streams(host):
                    rank = rank_of(stream)
                    if rank is None or budget <= 0:
                        continue
                    budget -= self._read_stream(mirror, attempt, host, stream, rank, budget, points)
        return points

    def _read_stream(
        self,
        mirror: LogMirror,
        attempt: int,
        host: str,
        stream: str,
        rank: int,
        budget: int,
        points: list[MetricPoint],
    ) -> int:
        state = self._streams.setdefault((attempt, host, stream), _Stream())
        came, state.times_offset = mirror.arrivals(host, stream, state.times_offset)
        if came:
            state.timed = True
            state.arrivals = _merged(state.arrivals, came, state.offset)
        path = mirror.dir / host / f"{stream}.log"
        try:
            with path.open("rb") as f:
                f.seek(state.offset)
                data = f.read(budget)
        except FileNotFoundError:
            return 0
        start = state.offset
        pos = reached = 0
        for end, when in state.arrivals:
            if end > start + len(data):
                break
            self._parse(state, data[pos : end - start], attempt, host, rank, when, points)
            pos, reached = end - start, reached + 1
        del state.arrivals[:reached]
        if not state.timed and pos < len(data):  # a copy older than arrival times
            self._parse(state, data[pos:], attempt, host, rank, None, points)
            pos = len(data)
        state.offset = start + pos
        return pos

    def _parse(
        self,
        state: _Stream,
        data: bytes,
        attempt: int,
        host: str,
        rank: int,
        when: float | None,
        points: list[MetricPoint],
    ) -> None:
        lines = state.condenser.feed(data)
        if not lines:
            return
        text = strip_ansi(lines).decode("utf-8", "replace")
        for line in text.split("\n"):
            for reading in self._parser.parse(line) if line else ():
                key = (rank, reading.name)
                count = self._counts.get(key, 0)
                self._counts[key] = count + 1
                step = reading.step if reading.step is not None else float(count)
                points.append(
                    MetricPoint(
                        self.job_id, host, rank, reading.name, reading.value, step, when, attempt
                    )
                )


def _merged(
    pending: list[tuple[int, float]], came: Iterable[tuple[int, float]], consumed: int
) -> list[tuple[int, float]]:
    """The arrival records still ahead of `consumed`, in byte order, the earliest time
    of each end offset (two controllers may both have copied the same bytes)."""
    earliest: dict[int, float] = {}
    for end, when in [*pending, *came]:
        if end > consumed and (end not in earliest or when < earliest[end]):
            earliest[end] = when
    return sorted(earliest.items())


CSV_HEADER = ("job", "host", "rank", "attempt", "metric", "step", "time", "value")


def to_csv(points: Sequence[MetricPoint]) -> str:
    """The points as CSV, a header first: job, host, rank, attempt, metric, step, time
    (seconds since the epoch, empty where unknown), value."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for p in points:
        writer.writerow(
            (
                p.job_id,
                p.host,
                p.rank,
                p.attempt,
                p.name,
                _plain(p.step),
                "" if p.time is None else f"{p.time:.3f}",
                repr(p.value),
            )
        )
    return out.getvalue()


def _plain(number: float) -> str:
    return str(int(number)) if number.is_integer() else repr(number)
