"""Progress bars in ranks' output, condensed for display. Pure: no I/O, no clock.

tqdm, the Hugging Face Trainer, Lightning and rich draw a bar by rewriting one line:
`\\r` and the new state, many times a second, and a newline only when the bar is
done (an epoch bar can go an hour without one). A terminal shows the latest state;
printed as it is, one line of a log becomes every redraw joined by `^M`, megabytes
of them. Here a line holding `\\r` becomes what a terminal would leave on screen: its
last segment with visible text. Lines without `\\r` pass through as they are.

The files on the hosts keep every byte; only what the user is shown condenses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

Key = tuple[str, int | None]  # (host, global rank), rank None: the node's own output


def prefix(key: Key) -> str:
    """`[host rN] `, or `[host] ` for a node's own output."""
    host, rank = key
    return f"[{host} r{rank}] " if rank is not None else f"[{host}] "


# CSI (colours, cursor moves, erase), OSC (titles, links: ended by BEL or ST), the
# character-set designations, and the other two-byte escapes (save cursor, ...).
_ANSI = re.compile(
    rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()*+][ -~]|[0-Z\\-~])"
)
_PERCENT = re.compile(rb"(?<![\d.])(\d{1,3}(?:\.\d+)?)%")
_COUNT = re.compile(rb"(?<![\d.])(\d+)/(\d+)(?![\d.])")


def strip_ansi(data: bytes) -> bytes:
    """`data` without its ANSI escape sequences (colours, cursor movement, titles)."""
    return _ANSI.sub(b"", data) if b"\x1b" in data else data


def visible(segment: bytes) -> bool:
    """Whether a segment shows anything: more than blanks and escape sequences (tqdm
    clears its line with `\\r`, spaces, `\\r`; rich erases it with an escape)."""
    return bool(strip_ansi(segment).strip())


def fraction(state: bytes) -> float | None:
    """How far a bar is, 0 to 1, from its text: `45%`, else `9/20`; None when it does
    not say (`9it [00:02, 4.47it/s]`: a bar without a total)."""
    text = strip_ansi(state)
    if m := _PERCENT.search(text):
        return min(float(m.group(1)) / 100, 1.0)
    if (m := _COUNT.search(text)) and int(m.group(2)) > 0:
        return min(int(m.group(1)) / int(m.group(2)), 1.0)
    return None


class Condenser:
    """One stream's bytes, fed as they come (split anywhere), turned into lines as a
    terminal would leave them.

    A line without `\\r` comes out byte for byte. A line with `\\r` comes out as its
    last segment with visible text, trailing blanks removed (tqdm pads each redraw to
    cover the last). Only that segment and the one being written are kept, however
    long the line runs.
    """

    def __init__(self) -> None:
        self._plain = b""  # the unfinished line, while it holds no \r
        self._bar = False  # the unfinished line holds a \r
        self._shown = b""  # its last complete segment with visible text
        self._tail = b""  # its segment after the last \r, still being written

    def feed(self, data: bytes) -> bytes:
        """Take the next bytes of the stream.

        Returns:
            The lines these bytes complete, each ending with a newline: lines without
            `\\r` exactly as written, lines with `\\r` condensed.
        """
        if not self._bar and b"\r" not in data:  # the common case: no bar at all
            end = data.rfind(b"\n") + 1
            if end == 0:
                self._plain += data
                return b""
            done = self._plain + data[:end] if self._plain else data[:end]
            self._plain = data[end:]
            return done
        out: list[bytes] = []
        pos, size = 0, len(data)
        while pos < size:
            if not self._bar:
                cr = data.find(b"\r", pos)
                if cr < 0:  # the rest holds no \r: plain lines, then maybe a partial one
                    out.append(self.feed(data[pos:]))
                    break
                start = data.rfind(b"\n", pos, cr) + 1 or pos  # where the \r's line starts
                if start > pos:
                    out.append(self._plain + data[pos:start])
                    self._plain = b""
                self._bar, self._tail = True, self._plain + data[start:cr]
                self._plain, self._shown = b"", b""
                pos = cr
            nl = data.find(b"\n", pos)
            stop = size if nl < 0 else nl
            self._take(data[pos:stop])
            if nl < 0:
                break
            out.append(self.state() + b"\n")
            self._bar, self._shown, self._tail = False, b"", b""
            pos = nl + 1
        return b"".join(out)

    def _take(self, region: bytes) -> None:
        """Segments of the bar line: the tail goes on with `region` up to its first
        `\\r`; each `\\r` completes one segment; the last visible one is kept."""
        last = region.rfind(b"\r")
        if last < 0:
            self._tail += region
            return
        end = last
        while True:  # back from the last complete segment to one with visible text
            cr = region.rfind(b"\r", 0, end)
            segment = region[cr + 1 : end] if cr >= 0 else self._tail + region[:end]
            if visible(segment):
                self._shown = segment
                break
            if cr < 0:
                break
            end = cr
        self._tail = region[last + 1 :]

    @property
    def bar(self) -> bool:
        """Whether the unfinished line is a bar being redrawn (it holds a `\\r`)."""
        return self._bar

    def state(self) -> bytes:
        """What a terminal shows of the unfinished line now: a bar's latest state, or
        the plain text written so far."""
        if not self._bar:
            return self._plain
        latest = self._tail if visible(self._tail) else self._shown
        return latest.rstrip(b" ")

    def flush(self) -> bytes:
        """The unfinished line as it stands, ended with a newline (b"" if none); the
        next bytes start a new line."""
        if not self._bar and not self._plain:
            return b""
        line = self.state() + b"\n"
        self._plain, self._bar, self._shown, self._tail = b"", False, b"", b""
        return line


class ProgressMode(StrEnum):
    """Which ranks' bars are shown while they move (each bar's final state is always
    printed, as a line)."""

    AUTO = "auto"  # every bar up to AUTO_MAX; beyond, the slowest, the fastest and a count
    ALL = "all"
    RANK0 = "rank0"
    NONE = "none"


AUTO_MAX = 4  # the most bars `auto` shows one by one
PROGRESS_EVERY_S = 10.0  # without a terminal: one line per moving bar this often, at most


@dataclass(frozen=True)
class Choice:
    """The bars to show, in rank order, and what the others are.

    `low` and `high` are the least and the most progress among the hidden bars that
    say how far they are (None: none says)."""

    shown: list[Key]
    hidden: int = 0
    low: float | None = None
    high: float | None = None


def _order(key: Key) -> tuple[int, str]:
    return (-1 if key[1] is None else key[1], key[0])


def choose(bars: Mapping[Key, bytes], mode: ProgressMode) -> Choice:
    """Which of the moving bars (each stream's latest state) to show.

    `auto` shows all of them up to AUTO_MAX; beyond, the slowest and the fastest
    (those that say how far they are, else the first two ranks) and a count of the
    rest: at 64 ranks, the spread is what tells a straggler from a healthy job.
    """
    if mode is ProgressMode.NONE:
        return Choice([])
    if mode is ProgressMode.RANK0:
        return Choice([k for k in bars if k[1] == 0])
    keys = sorted(bars, key=_order)
    if mode is ProgressMode.ALL or len(keys) <= AUTO_MAX:
        return Choice(keys)
    done = {k: f for k in keys if (f := fraction(bars[k])) is not None}
    if len(done) >= 2:
        slowest = min(done, key=lambda k: (done[k], _order(k)))
        fastest = max(done, key=lambda k: (done[k], -_order(k)[0]))
        shown = sorted({slowest, fastest}, key=_order)
    else:
        shown = keys[:2]
    rest = [done[k] for k in keys if k in done and k not in shown]
    return Choice(
        shown,
        hidden=len(keys) - len(shown),
        low=min(rest) if rest else None,
        high=max(rest) if rest else None,
    )


class Pacer:
    """When a display that cannot redraw (a file, a pipe, CI) prints a stream's bar
    state as a line: at most once every `every` seconds per stream, the first time
    `every` seconds after the bar appeared, and only when it changed. A bar shorter
    than `every` prints nothing here: its final state is its line.

    A bar line that ends and starts again at once (a line printed through the bar, as
    the HF Trainer logs its loss) keeps its pace rather than starting over.
    """

    def __init__(self, every: float) -> None:
        self.every = every
        self._due: dict[Key, float] = {}
        self._printed: dict[Key, bytes] = {}

    def appeared(self, key: Key, now: float) -> None:
        """A bar started on a stream that had none."""
        if self._due.get(key, 0.0) <= now:
            self._due[key] = now + self.every

    def due(self, key: Key, state: bytes, now: float) -> bool:
        """Whether a moving bar's `state` may be printed now."""
        return now >= self._due.get(key, now + self.every) and self._printed.get(key) != state

    def printed(self, key: Key, state: bytes, now: float) -> None:
        """`state` was printed now: the next one waits `every` seconds."""
        self._due[key], self._printed[key] = now + self.every, state

    def last(self, key: Key) -> bytes | None:
        """The state of the stream's bar printed last, if any."""
        return self._printed.get(key)

    def wait(self, key: Key, now: float) -> None:
        """The stream's bar was due but not chosen to show: it waits `every` seconds."""
        self._due[key] = now + self.every
