"""While `orch submit` connects, probes, pushes and starts, a terminal's stderr shows
one status line of where it is, gone once anything else prints."""

from __future__ import annotations

import io

import pytest

from orchestrator.cli.console import CLEAR_LINE, ConsoleReporter
from orchestrator.reporting.reporter import PhaseReporter, phase


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_status_line_is_rewritten_in_place_and_gone_before_other_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    reporter = ConsoleReporter()
    assert isinstance(reporter, PhaseReporter)
    phase(reporter, "connecting to 2 hosts")
    phase(reporter, "starting 2 nodes")
    reporter.notice("added host key for node1")
    reporter.job_started("j-1")
    assert err.getvalue() == (
        f"{CLEAR_LINE}orch: connecting to 2 hosts ..."
        f"{CLEAR_LINE}orch: starting 2 nodes ..."
        f"{CLEAR_LINE}orch: added host key for node1\n"
    ), "each phase replaces the last; a notice first takes it away, and only once"


def test_no_status_line_where_stderr_is_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    reporter = ConsoleReporter()
    phase(reporter, "connecting to 2 hosts")
    reporter.close()
    assert err.getvalue() == ""


def test_output_takes_the_line_away(
    monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    reporter = ConsoleReporter(redraw=False)
    phase(reporter, "starting 2 nodes")
    reporter.output("node1", 0, b"hello\n")
    assert err.getvalue().endswith(CLEAR_LINE)
    assert capsysbinary.readouterr().out == b"[node1 r0] hello\n"
