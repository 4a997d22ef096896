"""orch ui's parts without a browser: a rank's text as the page shows it, a feed's
bounded buffer, the browser opened without the token in its command line, the hosts'
history from top's samples, and the samples kept in the records."""

from __future__ import annotations

import stat
import time
import webbrowser
from pathlib import Path

import pytest

from orchestrator.records.samples import SampleLog
from orchestrator.ui import browser
from orchestrator.ui.feeds import MAX_LINE_CHARS, MAX_LINES, JobFeed, shown


def test_a_ranks_text_is_shown_as_text_whatever_it_holds() -> None:
    assert shown("<script>alert(1)</script>") == "<script>alert(1)</script>"
    assert shown("a\x07b\x00c\x1bd\x7fe\tf") == "a\u2407b\u2400c\u241bd\u2421e\tf"
    long = shown("x" * 1_000_000)
    assert long.startswith("x" * MAX_LINE_CHARS)
    assert long.endswith(f" … [{1_000_000 - MAX_LINE_CHARS} more characters]")


def test_a_feed_condenses_bars_strips_escapes_and_replaces_bad_bytes() -> None:
    feed = JobFeed("job-1", tail=10)
    feed.output("node1", 0, b"\x1b[31mred\x1b[0m and \xff\xfe\n")
    feed.output("node1", 1, b"\rtrain 1/9\rtrain 2/9")
    assert feed.bars()["shown"] == [["node1", 1, "train 2/9"]]
    feed.output("node1", 1, b"\rtrain 9/9\n")
    feed.output("node2 setup", None, b"pip install\n")
    feed.notice("host node3 lost")
    lines, after, skipped = feed.since(0, 100)
    assert [(x.host, x.rank, x.kind, x.text) for x in lines] == [
        ("node1", 0, "rank", "red and \ufffd\ufffd"),
        ("node1", 1, "rank", "train 9/9"),
        ("node2", None, "setup", "pip install"),
        ("", None, "notice", "host node3 lost"),
    ]
    assert (after, skipped) == (4, 0)
    assert feed.bars()["shown"] == []


def test_a_feed_holds_its_last_lines_and_says_how_many_a_page_missed() -> None:
    feed = JobFeed("job-1", tail=10)
    feed.output("node1", 0, b"".join(b"line %d\n" % i for i in range(MAX_LINES + 500)))
    lines, after, skipped = feed.since(0, MAX_LINES)
    assert len(lines) == MAX_LINES and lines[0].text == "line 500"
    assert (after, skipped) == (MAX_LINES + 500, 500)
    recent, _, missed = feed.since(after - 10, 4)
    assert [x.text for x in recent] == [f"line {MAX_LINES + 496 + i}" for i in range(4)]
    assert missed == 6
    assert feed.since(after, 100) == ([], after, 0)


def test_many_ranks_bars_are_condensed_as_the_terminal_shows_them() -> None:
    feed = JobFeed("job-1", tail=10)
    for rank in range(64):
        feed.output(f"node{rank // 8}", rank, b"\r%d%% |####" % (10 + rank))
    bars = feed.bars()
    assert [b[1] for b in bars["shown"]] == [0, 63], "the slowest and the fastest"
    assert (bars["hidden"], bars["low"], bars["high"]) == (62, 0.11, 0.72)


class _Recorder(webbrowser.BaseBrowser):
    def __init__(self) -> None:
        super().__init__("recorder")
        self.opened: list[str] = []

    def open(self, url: str, new: int = 0, autoraise: bool = True) -> bool:
        self.opened.append(url)
        return True


def test_the_browser_is_handed_an_owner_only_file_never_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISPLAY", ":0")
    recorder = _Recorder()
    monkeypatch.setattr(webbrowser, "get", lambda using=None: recorder)
    url = "http://127.0.0.1:40123/?token=s3cret-t0ken"
    assert browser.open_page(url)
    (opened,) = recorder.opened
    assert opened.startswith("file:///") and "s3cret" not in opened
    path = Path(opened.removeprefix("file://"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert "url=http://127.0.0.1:40123/?token=s3cret-t0ken" in path.read_text()


def test_without_a_display_no_browser_is_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(browser.sys, "platform", "linux")
    assert not browser.open_page("http://127.0.0.1:1/?token=t")


def test_top_samples_are_kept_for_an_hour_owner_only(tmp_path: Path) -> None:
    kept = SampleLog(tmp_path, "job-1")
    now = time.time()
    kept.add([{"time": now - 4000, "host": "node1"}, {"time": now - 10, "host": "node2"}])
    assert [r["host"] for r in kept.read()] == ["node2"]
    assert kept.read(since=now) == []
    assert stat.S_IMODE(kept.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.path.parent.stat().st_mode) == 0o700
