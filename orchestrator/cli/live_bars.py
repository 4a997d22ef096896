"""The ranks' progress bars on a terminal: one live line per bar, redrawn in place at
most REDRAWS_PER_S times a second, under the lines that scroll above them (rich's
Live display)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Mapping

from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.live import Live
from rich.segment import Segment
from rich.text import Text

from orchestrator.api.progress import Key, ProgressMode, choose, prefix

REDRAWS_PER_S = 4


def rows(bars: Mapping[Key, bytes], mode: ProgressMode) -> list[Text]:
    """The live lines for the moving bars (each stream's latest state): those `mode`
    chooses, with their prefix, then a count of the others and their spread."""
    choice = choose(bars, mode)
    lines = [
        Text.from_ansi(prefix(key) + _text(bars[key]), no_wrap=True, overflow="ellipsis")
        for key in choice.shown
    ]
    if choice.hidden:
        spread = (
            f" ({choice.low:.0%} to {choice.high:.0%})"
            if choice.low is not None and choice.high is not None
            else ""
        )
        lines.append(
            Text(
                f"... {choice.hidden} more bars{spread}; --progress all shows every rank's",
                style="dim",
                no_wrap=True,
                overflow="ellipsis",
            )
        )
    return lines


def _text(state: bytes) -> str:
    """A bar's bytes as text; a character that a read cut in two waits for its end."""
    try:
        return state.decode()
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":
            state = state[: exc.start]
        return state.decode("utf-8", "replace")


class _Raw:
    """Text that goes to the terminal exactly as it is (colour codes and all): the
    ranks' lines, printed above the live bars."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        yield Segment(self.text)


class LiveBars:
    """A live display of the bars that `snapshot` returns, on stdout.

    Args:
        snapshot: the moving bars now, a copy (called from the display's own thread,
            so it must not wait on anything held while calling `print`).
        mode: which of them to show.
    """

    def __init__(self, snapshot: Callable[[], Mapping[Key, bytes]], mode: ProgressMode) -> None:
        self._snapshot = snapshot
        self._mode = mode
        self._live = Live(
            console=Console(file=sys.stdout, highlight=False),
            get_renderable=self._render,
            refresh_per_second=REDRAWS_PER_S,
            transient=True,  # each bar's final state is printed as a line instead
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._started = threading.Event()

    def _render(self) -> RenderableType:
        return Group(*rows(self._snapshot(), self._mode))

    @property
    def running(self) -> bool:
        return self._started.is_set()

    def start(self) -> None:
        self._live.start(refresh=True)
        self._started.set()

    def stop(self) -> None:
        self._started.clear()
        self._live.stop()

    def refresh(self) -> None:
        """Draw the bars as they are now, not at the next tick."""
        self._live.refresh()

    def print(self, text: str) -> None:
        """Lines above the bars, exactly as they are; `text` ends with a newline."""
        self._live.console.print(_Raw(text), soft_wrap=True, end="")
