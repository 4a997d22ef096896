"""What a running command shows the user: rank lines on stdout, notices and push
progress on stderr.

The ranks' progress bars (lines redrawn with `\\r`) are condensed here: on a
terminal, redrawn in place under the other lines (live_bars.py); elsewhere, and in
`orch logs`, printed as a plain line at most once every `every` seconds per rank,
then once more in their final state (orchestrator/reporting/progress.py).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from orchestrator.api.progress import (
    PROGRESS_EVERY_S,
    Condenser,
    Key,
    Pacer,
    ProgressMode,
    choose,
    prefix,
    strip_ansi,
)

if TYPE_CHECKING:  # a push's module is not for `orch kill` or `orch status` to import
    from rich.progress import Progress, TaskID

    from orchestrator.api.progress import PushProgress
    from orchestrator.cli.live_bars import LiveBars

# rich (30 ms of every command's start) is imported where a terminal or a bar needs it:
# `orch kill`, and a submit whose output goes to a file, never do.

CLEAR_LINE = "\r\x1b[2K"  # back to the line's start, and erase it


class ConsoleReporter:
    """Prints a running job: prefixed rank lines on stdout, notices on stderr.

    Args:
        progress: which ranks' bars show while they move.
        every: without a terminal (or `redraw` False), seconds between two lines of
            one rank's moving bar.
        redraw: whether bars are redrawn in place (None: when stdout is a terminal).
        clock: the time, in seconds (for tests).
    """

    def __init__(
        self,
        progress: ProgressMode = ProgressMode.AUTO,
        every: float = PROGRESS_EVERY_S,
        redraw: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._out = sys.stdout.buffer
        self._terminal = sys.stdout.isatty()  # colour codes go only to a terminal
        if redraw is None:  # a terminal that can move the cursor (TERM=dumb cannot)
            redraw = self._terminal and _interactive()
        self._redraw = redraw
        self._mode = progress
        self._clock = clock
        self._streams: dict[Key, Condenser] = {}
        self._bars: dict[Key, bytes] = {}  # each moving bar's latest state
        self._bars_lock = threading.Lock()  # never held while printing: the live
        self._live: LiveBars | None = None  # display's thread takes it to draw
        self._pacer = Pacer(every)
        self._summary_due = 0.0
        self._push_lock = threading.Lock()
        self._pushes: dict[str, PushProgress] = {}
        self._push_timer: threading.Timer | None = None
        self._push_bar: Progress | None = None
        self._push_tasks: dict[str, TaskID] = {}
        self._phase = False  # a status line of where the submit is, on stderr

    def phase(self, message: str) -> None:
        """Where a submit is (connecting, probing, pushing, starting): one status line
        on a terminal's stderr, rewritten in place, gone once anything else prints."""
        if not sys.stderr.isatty():
            return
        with self._lock:
            sys.stderr.write(f"{CLEAR_LINE}orch: {message} ...")
            sys.stderr.flush()
            self._phase = True

    def _end_phase(self) -> None:
        """Take the status line away (with the lock held), before anything else prints."""
        if self._phase:
            sys.stderr.write(CLEAR_LINE)
            sys.stderr.flush()
            self._phase = False

    def __enter__(self) -> ConsoleReporter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def job_started(self, job_id: str) -> None:
        with self._lock:
            self._end_phase()
        self._write(f"job {job_id}\n".encode())

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        """Print a stream's next bytes, each line with its prefix: lines without `\\r`
        as they are (colour codes stripped when stdout is no terminal), a bar's line in
        its final state; a moving bar goes to the live display, or is paced."""
        if not data:
            return
        key = (host, rank)
        with self._lock:
            self._end_phase()
            stream = self._streams.setdefault(key, Condenser())
            had_bar = stream.bar
            lines = stream.feed(data)
            if not stream.bar:  # a line cut short (the node's last, or too long) ends here
                rest = stream.flush()
                if rest:
                    lines += rest
            moved = stream.bar or had_bar
            if moved:
                bars = self._note_bar(key, stream)
                if self._live is not None and not stream.bar:
                    self._live.refresh()  # the ended bar's live line goes before its final one
            self._print(key, lines)
            if moved:
                self._show_bar(key, stream, had_bar, bars)

    def _print(self, key: Key, data: bytes) -> None:
        """Complete lines of one stream, each given the stream's prefix."""
        if not data:
            return
        if not data.isascii():  # ASCII is valid UTF-8: no decoding pass for most logs
            try:
                data.decode("utf-8")  # valid text goes through untouched
            except UnicodeDecodeError:  # invalid bytes from a rank become U+FFFD
                data = data.decode("utf-8", "replace").encode()
        if not self._terminal:
            data = strip_ansi(data)
        head = prefix(key).encode()
        if self._live is not None:
            self._live.print((head + data.replace(b"\n", b"\n" + head)[: -len(head)]).decode())
            return
        # One copy of the data (the replace), however big: logs run to hundreds of MB.
        lines = memoryview(data.replace(b"\n", b"\n" + head))
        self._out.write(head)
        self._out.write(lines[: -len(head)])
        self._out.flush()

    def _note_bar(self, key: Key, stream: Condenser) -> dict[Key, bytes]:
        """Keep a stream's moving bar (or forget the one that ended); all of them now."""
        with self._bars_lock:
            if stream.bar:
                self._bars[key] = stream.state()
            else:
                self._bars.pop(key, None)
            return dict(self._bars)

    def _show_bar(
        self, key: Key, stream: Condenser, had_bar: bool, bars: Mapping[Key, bytes]
    ) -> None:
        """A stream's bar moved, started or ended: redraw it, or print it when due."""
        now = self._clock()
        if self._mode is ProgressMode.NONE:
            return
        if self._redraw:
            self._show_live(bars)
            return
        if not stream.bar:
            return
        if not had_bar:
            self._pacer.appeared(key, now)
        state = bars[key]
        if not self._pacer.due(key, state, now):
            return
        choice = choose(bars, self._mode)
        if key not in choice.shown:
            self._pacer.wait(key, now)
            return
        self._pacer.printed(key, state, now)
        self._print(key, state + b"\n")
        if choice.hidden and now >= self._summary_due:
            self._summary_due = now + self._pacer.every
            self._notice(
                f"{choice.hidden} more ranks draw a progress bar; --progress all shows them"
            )

    def _show_live(self, bars: Mapping[Key, bytes]) -> None:
        wanted = any(k[1] == 0 for k in bars) if self._mode is ProgressMode.RANK0 else bool(bars)
        if wanted and self._live is None:
            self._out.flush()
            from orchestrator.cli.live_bars import LiveBars

            self._live = LiveBars(self._snapshot, self._mode)
            self._live.start()
        elif not wanted and self._live is not None:
            self._live.stop()
            self._live = None

    def _snapshot(self) -> dict[Key, bytes]:
        with self._bars_lock:
            return dict(self._bars)

    def close(self) -> None:
        """End the display: a bar still moving is printed in its last state."""
        with self._lock:
            self._end_phase()
            for key, stream in self._streams.items():
                if not stream.bar:
                    continue
                line = stream.flush()
                if self._redraw or self._pacer.last(key) != line[:-1]:  # not twice in a row
                    self._print(key, line)
            with self._bars_lock:
                self._bars.clear()
            if self._live is not None:
                self._live.stop()
                self._live = None

    def notice(self, message: str) -> None:
        with self._lock:
            self._notice(message)

    def _notice(self, message: str) -> None:
        self._end_phase()
        if self._live is not None and sys.stderr.isatty():  # the same screen: above the bars
            self._live.print(f"orch: {message}\n")
            return
        self._out.flush()
        sys.stderr.write(f"orch: {message}\n")
        sys.stderr.flush()

    def _write(self, data: bytes) -> None:
        with self._lock:
            self._out.write(data)
            self._out.flush()

    def progress(self, update: PushProgress) -> None:
        """A bar per host (files, bytes) on stderr for a code push still going after a
        second; none when stdout is not a terminal."""
        if not (sys.stdout.isatty() and sys.stderr.isatty()):
            return
        with self._push_lock:
            self._pushes[update.host] = update
            if self._push_bar is not None:
                self._show_push(update)
            elif self._push_timer is None:
                self._push_timer = threading.Timer(1.0, self._start_push_bar)
                self._push_timer.daemon = True
                self._push_timer.start()
            if all(p.finished for p in self._pushes.values()):
                if self._push_timer is not None:
                    self._push_timer.cancel()
                if self._push_bar is not None:
                    self._push_bar.stop()
                self._pushes, self._push_tasks = {}, {}
                self._push_timer = self._push_bar = None

    def _start_push_bar(self) -> None:
        with self._push_lock:
            if self._push_timer is None:  # the push ended meanwhile
                return
            with self._lock:
                self._end_phase()  # the bars say it now
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TransferSpeedColumn,
            )

            self._push_bar = Progress(
                TextColumn("pushing code to {task.description}"),
                BarColumn(),
                TextColumn("{task.fields[files]} files"),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._push_bar.start()
            for update in self._pushes.values():
                self._show_push(update)

    def _show_push(self, update: PushProgress) -> None:
        assert self._push_bar is not None
        task = self._push_tasks.get(update.host)
        if task is None:
            task = self._push_bar.add_task(update.host, total=None, files="?")
            self._push_tasks[update.host] = task
        self._push_bar.update(
            task,
            completed=update.bytes_done,
            total=update.bytes_total or None,  # None until the host said what it lacks
            files=f"{update.files_done}/{update.files_total}" if update.bytes_total else "?",
        )


def _interactive() -> bool:
    """Whether stdout, a terminal, can move the cursor (TERM=dumb cannot), as rich sees it."""
    from rich.console import Console

    return Console(file=sys.stdout).is_interactive
