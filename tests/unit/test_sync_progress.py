"""The push's progress bar in the CLI: shown for pushes over a second, on terminals only."""

from __future__ import annotations

import io
import time

import pytest

from orchestrator.cli.console import ConsoleReporter
from orchestrator.sync.push import PushProgress


class Terminal(io.TextIOWrapper):
    """A text stream that says it is a terminal, and keeps what was written."""

    def __init__(self, tty: bool) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", write_through=True)
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def text(self) -> str:
        raw = self.buffer
        assert isinstance(raw, io.BytesIO)
        return raw.getvalue().decode()


def run_push(monkeypatch: pytest.MonkeyPatch, tty: bool, seconds: float) -> str:
    out, err = Terminal(tty), Terminal(tty)
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    reporter = ConsoleReporter()
    for host in ("node1", "node2"):
        reporter.progress(PushProgress(host, 0, 0, 0, 0))
    time.sleep(seconds)
    reporter.progress(PushProgress("node1", 3, 10, 3_000_000, 10_000_000))
    time.sleep(0.2)
    for host in ("node1", "node2"):
        reporter.progress(PushProgress(host, 10, 10, 10_000_000, 10_000_000, finished=True))
    return out.text() + err.text()


def test_a_push_over_a_second_shows_each_host_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shown = run_push(monkeypatch, tty=True, seconds=1.2)
    assert "pushing code to node1" in shown and "pushing code to node2" in shown
    assert "3/10 files" in shown and "3.0/10.0 MB" in shown


def test_a_quick_push_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_push(monkeypatch, tty=True, seconds=0.1) == ""


def test_nothing_is_drawn_when_stdout_is_not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_push(monkeypatch, tty=False, seconds=1.2) == ""
