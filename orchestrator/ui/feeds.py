"""A job's output for the page: followed once (`Job.logs_to`, as `orch logs -f`),
however many pages show it, into a bounded buffer of lines that each page reads on
from where it stood, and the state of every progress bar still moving.

What a rank printed is text: colour codes and other escape sequences removed, bytes
that are not UTF-8 replaced, control characters shown as their symbols, a line cut
at MAX_LINE_CHARS with a note of how much more it had. The page puts it in the
document as text (`textContent`), never as HTML.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any

from orchestrator import api
from orchestrator.api.errors import OrchError
from orchestrator.api.progress import Condenser, Key, ProgressMode, choose, strip_ansi

log = logging.getLogger(__name__)

MAX_LINES = 20_000  # a feed's buffer: what a page that opens late can still show
MAX_LINE_CHARS = 8_192
TAIL_LINES = 8_000  # the lines of a job's past shown at first, over all its ranks
IDLE_CLOSE_S = 60.0  # a feed no page has read this long stops following
SETUP_SUFFIX = " setup"
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def shown(text: str) -> str:
    """A line as the page shows it: control characters as their symbols (U+2400 on),
    cut at MAX_LINE_CHARS."""
    if len(text) > MAX_LINE_CHARS:
        text = f"{text[:MAX_LINE_CHARS]} … [{len(text) - MAX_LINE_CHARS} more characters]"
    return _CONTROL.sub(_symbol, text)


def _symbol(match: re.Match[str]) -> str:
    code = ord(match.group())
    return "\u2421" if code == 0x7F else chr(0x2400 + code)


@dataclass(frozen=True)
class Line:
    """One line of a job, numbered in the order the feed took it."""

    seq: int
    host: str
    rank: int | None
    kind: str  # "rank", "node" (torchrun's own), "setup", "notice" (orch's own)
    text: str

    def to_json(self) -> list[Any]:
        return [self.seq, self.host, self.rank, self.kind, self.text]


class _Stopped(Exception):
    """The feed was closed: what reports to it stops."""


class JobFeed:
    """Follows one job for the pages that show it.

    Args:
        job_id: the job's full id.
        tail: how many lines of each rank's past to start with.
    """

    def __init__(self, job_id: str, tail: int) -> None:
        self.job_id = job_id
        self.started = time.monotonic()
        self.read_at = self.started
        self.done = False
        self.error: str | None = None
        self._tail = tail
        self._lines: deque[Line] = deque(maxlen=MAX_LINES)
        self._seq = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._streams: dict[Key, Condenser] = {}
        self._bars: dict[Key, bytes] = {}
        self._thread = threading.Thread(target=self._follow, name=f"ui-feed-{job_id}", daemon=True)

    def start(self) -> JobFeed:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop following, at the job's next output (or its end)."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def since(self, seq: int, limit: int) -> tuple[list[Line], int, int]:
        """The lines after number `seq`, at most the last `limit` of them: (lines, the
        number to ask from next, how many were passed over)."""
        with self._lock:
            self.read_at = time.monotonic()
            first = self._seq - len(self._lines)  # the oldest line still held
            start = max(seq, first, self._seq - limit)
            skipped = start - seq if seq < start else 0
            # from the end: a page that follows wants the last few of 20,000
            lines = list(islice(reversed(self._lines), self._seq - start))[::-1]
            return lines, self._seq, skipped

    def bars(self) -> dict[str, Any]:
        """The bars still moving, condensed as the terminal shows them (every bar up
        to a few, beyond that the slowest, the fastest and how many others)."""
        with self._lock:
            moving = {k: v for k, v in self._bars.items() if v}
        choice = choose(moving, ProgressMode.AUTO)
        return {
            "shown": [
                [host, rank, shown(strip_ansi(moving[(host, rank)]).decode("utf-8", "replace"))]
                for host, rank in choice.shown
            ],
            "hidden": choice.hidden,
            "low": choice.low,
            "high": choice.high,
        }

    # ------------------------------------------------------------ the reporter

    def job_started(self, job_id: str) -> None:
        pass

    def notice(self, message: str) -> None:
        self._add([("", None, "notice", message)])

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        if self._closed.is_set():
            raise _Stopped
        key = (host, rank)
        with self._lock:
            stream = self._streams.setdefault(key, Condenser())
            done = stream.feed(data)
            if stream.bar:
                self._bars[key] = stream.state()
            else:
                done += stream.flush()  # a line cut short (the node's last, or too long)
                self._bars.pop(key, None)
        if not done:
            return
        kind = "rank" if rank is not None else "node"
        if rank is None and host.endswith(SETUP_SUFFIX):
            host, kind = host.removesuffix(SETUP_SUFFIX), "setup"
        text = strip_ansi(done).decode("utf-8", "replace")
        self._add([(host, rank, kind, line) for line in text.removesuffix("\n").split("\n")])

    def _add(self, items: list[tuple[str, int | None, str, str]]) -> None:
        with self._lock:
            for host, rank, kind, text in items:
                self._lines.append(Line(self._seq, host, rank, kind, shown(text)))
                self._seq += 1

    # ------------------------------------------------------------ following

    def _follow(self) -> None:
        try:
            api.job(self.job_id).logs_to(self, follow=True, tail=self._tail)
        except _Stopped:
            pass
        except OrchError as exc:
            self.error = exc.message
            self.notice(f"following stopped: {exc.message}")
        except Exception as exc:  # the page says so; the server goes on
            log.debug("[job=%s] following failed", self.job_id, exc_info=True)
            self.error = repr(exc)
            self.notice(f"following stopped: {exc!r}")
        finally:
            with self._lock:
                self._bars.clear()
            self.done = True


class Feeds:
    """Every job's feed, made on a page's first look and closed when no page has read
    it for IDLE_CLOSE_S (or at once when the server stops)."""

    def __init__(self) -> None:
        self._feeds: dict[str, JobFeed] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str, ranks: int) -> JobFeed:
        """The feed of a job (its full id), started if there is none, or again where the
        last one stopped on an error (its hosts may be back)."""
        with self._lock:
            feed = self._feeds.get(job_id)
            if feed is None or (feed.done and feed.error is not None) or feed.closed:
                tail = max(20, TAIL_LINES // max(ranks, 1))
                feed = self._feeds[job_id] = JobFeed(job_id, tail).start()
            return feed

    def following(self) -> set[str]:
        """The jobs followed now (their records are kept up to date by the follow)."""
        with self._lock:
            return {j for j, f in self._feeds.items() if not f.done}

    def sweep(self) -> None:
        """Close the feeds no page reads any more."""
        now = time.monotonic()
        with self._lock:
            for job_id, feed in list(self._feeds.items()):
                if now - feed.read_at > IDLE_CLOSE_S:
                    feed.close()
                    del self._feeds[job_id]

    def close(self) -> None:
        with self._lock:
            for feed in self._feeds.values():
                feed.close()
            self._feeds.clear()
