"""Reporters for Python callers: the service layer's output chunks as typed lines,
its notices through `logging`; and a queue that carries lines from the thread that
follows a job to the caller's iterator.

The chunks come as the Reporter contract says (reporting/reporter.py): complete lines,
except a progress bar's line being redrawn and a stream's very last piece. They are
cut into lines exactly as the console does it (a `Condenser` per stream), so that a
LogLine is what `orch logs` prints, without its prefix.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator

from orchestrator.api.types import LineKind, LogLine
from orchestrator.reporting.progress import Condenser, Key, strip_ansi

log = logging.getLogger(__name__)
SETUP_SUFFIX = " setup"  # submit's setup output comes as host "node1 setup", rank None


class QuietReporter:
    """A Reporter that prints nothing: notices go to `on_notice` (default: `logging`,
    INFO, this module's logger); output is dropped (it stays in the job's log copy,
    for `Job.logs`).
    """

    def __init__(self, on_notice: Callable[[str], None] | None = None) -> None:
        self._on_notice = on_notice

    def job_started(self, job_id: str) -> None:
        log.info("job %s started", job_id)

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        pass

    def notice(self, message: str) -> None:
        if self._on_notice is not None:
            self._on_notice(message)
        else:
            log.info("%s", message)


class LineReporter:
    """A Reporter that hands each complete line of output to `on_line` as a LogLine.

    Args:
        on_line: called with each line, in each stream's order (from the thread that
            reports; an exception it raises stops what is reporting).
        on_notice: called with each notice (default: `logging`, as QuietReporter's).

    `close()` hands on the last state of any progress bar still being drawn.
    """

    def __init__(
        self,
        on_line: Callable[[LogLine], None],
        on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self._on_line = on_line
        self._on_notice = on_notice or QuietReporter().notice
        self._streams: dict[Key, Condenser] = {}
        self._lock = threading.Lock()  # setup output comes from every host's thread

    def job_started(self, job_id: str) -> None:
        log.info("job %s started", job_id)

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        with self._lock:
            stream = self._streams.setdefault((host, rank), Condenser())
            lines = stream.feed(data)
            if not stream.bar:  # a line cut short (the node's last, or too long) ends here
                lines += stream.flush()
        self._hand_on(host, rank, lines)

    def notice(self, message: str) -> None:
        self._on_notice(message)

    def close(self) -> None:
        """Hand on each progress bar still being drawn, in its last state."""
        with self._lock:
            ended = [(key, s.flush()) for key, s in self._streams.items() if s.bar]
        for (host, rank), line in ended:
            self._hand_on(host, rank, line)

    def _hand_on(self, host: str, rank: int | None, lines: bytes) -> None:
        if not lines:
            return
        kind = LineKind.RANK if rank is not None else LineKind.NODE
        if rank is None and host.endswith(SETUP_SUFFIX):
            host, kind = host.removesuffix(SETUP_SUFFIX), LineKind.SETUP
        text = strip_ansi(lines).decode("utf-8", "replace")
        for line in text.removesuffix("\n").split("\n"):
            self._on_line(LogLine(host, rank, kind, line))


class Abandoned(Exception):
    """The iterator's caller went away: whatever feeds it stops."""


class LineQueue:
    """Lines from a worker thread (which reports to `reporter`) to the caller's thread
    (which iterates). The worker ends with `finish()`; the caller with `close()`,
    after which the worker's next line raises Abandoned in the worker."""

    def __init__(self, on_notice: Callable[[str], None] | None = None, size: int = 4096) -> None:
        self._queue: queue.Queue[LogLine | None] = queue.Queue(maxsize=size)  # None: the end
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self.reporter = LineReporter(self._put, on_notice)

    def _put(self, item: LogLine | None) -> None:
        while True:
            if self._closed.is_set():
                raise Abandoned
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def finish(self, error: BaseException | None = None) -> None:
        """The worker is done (with `error`, raised to the caller after the lines)."""
        try:
            self.reporter.close()
        except Abandoned:
            return
        self._error = error
        with contextlib.suppress(Abandoned):
            self._put(None)

    def close(self) -> None:
        """The caller stops reading."""
        self._closed.set()

    def __iter__(self) -> Iterator[LogLine]:
        while True:
            try:
                item = self._queue.get(timeout=0.5)  # short waits keep Ctrl-C responsive
            except queue.Empty:
                continue
            if item is None:
                if self._error is not None:
                    raise self._error
                return
            yield item
