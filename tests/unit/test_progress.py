"""Progress bars in ranks' output: `\\r` redraws condensed to what a terminal
would show, however the bytes were split into reads; ANSI codes kept for a terminal
and stripped elsewhere; which bars show; how often a bar is printed without a
terminal."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tqdm import tqdm

from orchestrator.cli.console import ConsoleReporter
from orchestrator.cli.live_bars import rows
from orchestrator.reporting.progress import (
    AUTO_MAX,
    Condenser,
    Key,
    Pacer,
    ProgressMode,
    choose,
    fraction,
    strip_ansi,
    visible,
)

PIECES = [
    b"\n",
    b"\r",
    b"\r\n",
    b"a",
    b" ",
    b"42%",
    b"\x1b[2K",  # rich's erase line: a segment of only that shows nothing
    b"\x1b[32m",
    b"\xe2\x96\x88",  # tqdm's full block, three bytes
    b"\xff",
]
streams = st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join)


def reference(data: bytes) -> bytes:
    """What a terminal leaves of each line, written the plain way: a line without
    `\\r` as it is; one with `\\r` as its last segment with visible text."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    out = []
    for line in lines:
        if b"\r" not in line:
            out.append(line)
            continue
        shown = [s for s in line.split(b"\r") if visible(s)]
        out.append(shown[-1].rstrip(b" ") if shown else b"")
    return b"".join(line + b"\n" for line in out)


def condensed(pieces: list[bytes]) -> bytes:
    condenser = Condenser()
    return b"".join(condenser.feed(p) for p in pieces) + condenser.flush()


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(data=streams, cuts=st.lists(st.integers(0, 400), max_size=12))
@settings(max_examples=500, deadline=None)
def test_condensing_does_not_depend_on_where_reads_split_the_stream(
    data: bytes, cuts: list[int]
) -> None:
    """Fed in pieces cut at any byte (inside a `\\r\\n`, an escape, a UTF-8 character),
    the lines and the unfinished bar come out as from one read, and as a terminal
    would leave them."""
    pieces = split_at(data, cuts)
    assert condensed(pieces) == condensed([data]) == reference(data)
    whole, split = Condenser(), Condenser()
    whole.feed(data)
    for piece in pieces:
        split.feed(piece)
    assert (split.bar, split.state()) == (whole.bar, whole.state())


@given(
    data=st.lists(st.sampled_from([b"\n", b"x", b"\x1b[1m", b"\xe2\x82\xac", b"\t"]), max_size=40),
    cuts=st.lists(st.integers(0, 200), max_size=8),
)
@settings(max_examples=300, deadline=None)
def test_lines_without_a_carriage_return_come_out_byte_for_byte(
    data: list[bytes], cuts: list[int]
) -> None:
    raw = b"".join(data)
    condenser = Condenser()
    out = b"".join(condenser.feed(p) for p in split_at(raw, cuts))
    assert out + condenser.flush() == raw + (b"" if raw.endswith(b"\n") or not raw else b"\n")
    assert not condenser.bar


def test_a_plain_chunk_comes_back_as_the_same_object() -> None:
    """Logs run to hundreds of MB: lines without `\\r` are not copied."""
    chunk = b"epoch 1 loss 0.41\n" * 1000
    assert Condenser().feed(chunk) is chunk


def tqdm_output(steps: int, **kwargs: object) -> bytes:
    out = io.StringIO()
    with tqdm(total=steps, file=out, mininterval=0, desc="train", **kwargs) as bar:  # type: ignore[call-overload]
        for _ in range(steps):
            bar.update(1)
    return out.getvalue().encode()


def test_a_real_tqdm_bar_becomes_its_final_state() -> None:
    raw = tqdm_output(40)
    assert raw.count(b"\r") > 40  # every redraw, as the host's file keeps them
    line = Condenser().feed(b"start\n" + raw + b"done\n")
    start, bar, done, end = line.split(b"\n")
    assert (start, done, end) == (b"start", b"done", b"")
    assert bar.startswith(b"train: 100%|") and b"40/40" in bar
    assert b"\r" not in bar and not bar.endswith(b" ")


def test_the_unfinished_bar_is_its_latest_redraw_and_memory_stays_small() -> None:
    condenser = Condenser()
    for step in range(10_000):  # an hour-long bar: never a newline
        assert condenser.feed(f"\r{step / 100:.0f}%|step {step}".encode()) == b""
    assert condenser.bar and condenser.state() == b"100%|step 9999"
    assert len(condenser._shown) + len(condenser._tail) < 100


def test_a_line_printed_through_a_bar_replaces_it() -> None:
    """tqdm.write (the HF Trainer's loss dicts) clears the bar, prints, redraws it: the
    screen shows the line, then the bar again."""
    condenser = Condenser()
    out = condenser.feed(b"\r 40%|####\r          \r{'loss': 0.5}\n\r 40%|####")
    assert out == b"{'loss': 0.5}\n"
    assert condenser.bar and condenser.state() == b" 40%|####"


def test_text_ended_with_a_carriage_return_is_a_bar_too() -> None:
    """`print(f"step {i}", end="\\r")`, then a newline: the last step stays."""
    condenser = Condenser()
    assert condenser.feed(b"step 1\rstep 2\r") == b""
    assert condenser.state() == b"step 2"
    assert condenser.feed(b"\n") == b"step 2\n"
    assert Condenser().feed(b"windows line\r\n") == b"windows line\n"


def test_ansi_codes_are_stripped_and_text_kept() -> None:
    coloured = b"\x1b[32mok\x1b[0m \x1b]0;title\x07\x1b[2K\x1b[1Aloss \x1b(B0.4\x1b7"
    assert strip_ansi(coloured) == b"ok loss 0.4"
    assert strip_ansi(b"plain \xe2\x82\xac") == b"plain \xe2\x82\xac"
    assert not visible(b"\x1b[2K   \x1b[0m") and visible(b"\x1b[32m.\x1b[0m")


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (b"Epoch 3/10:  45%|####5     | 9/20 [00:02<00:02]", 0.45),
        (b"\x1b[35m 7.5%\x1b[0m", 0.075),
        (b"step 9/20", 0.45),
        (b"9it [00:02, 4.47it/s]", None),
    ],
)
def test_fraction_reads_how_far_a_bar_is(state: bytes, expected: float | None) -> None:
    assert fraction(state) == (pytest.approx(expected) if expected is not None else None)


def bars_of(count: int) -> dict[Key, bytes]:
    return {(f"node{r // 8 + 1}", r): f"{(r * 37) % 64 + 10}%|".encode() for r in range(count)}


def test_auto_shows_every_bar_up_to_a_handful() -> None:
    bars = bars_of(AUTO_MAX)
    assert choose(bars, ProgressMode.AUTO).shown == sorted(bars, key=lambda k: k[1] or 0)


def test_auto_shows_the_slowest_and_fastest_of_many_and_counts_the_rest() -> None:
    bars = bars_of(64)  # 8 hosts x 8 ranks
    choice = choose(bars, ProgressMode.AUTO)
    by_progress = sorted(bars, key=lambda k: fraction(bars[k]) or 0)
    assert set(choice.shown) == {by_progress[0], by_progress[-1]}
    assert choice.hidden == 62
    assert choice.low is not None and choice.high is not None
    assert fraction(bars[by_progress[0]]) <= choice.low <= choice.high  # type: ignore[operator]
    assert choice.high <= fraction(bars[by_progress[-1]])  # type: ignore[operator]
    lines = [row.plain for row in rows(bars, ProgressMode.AUTO)]
    assert len(lines) == 3 and lines[-1].startswith("... 62 more bars (")


def test_modes_rank0_all_none() -> None:
    bars = bars_of(64)
    assert choose(bars, ProgressMode.RANK0).shown == [("node1", 0)]
    assert len(choose(bars, ProgressMode.ALL).shown) == 64
    assert choose(bars, ProgressMode.NONE).shown == []


def test_pacer_prints_a_bar_at_most_every_period_and_first_after_one() -> None:
    pacer, key = Pacer(10), ("node1", 0)
    pacer.appeared(key, now=0)
    assert not pacer.due(key, b"5%", now=9.9)
    assert pacer.due(key, b"50%", now=10)
    pacer.printed(key, b"50%", now=10)
    assert not pacer.due(key, b"60%", now=19)
    assert not pacer.due(key, b"50%", now=25), "an unchanged bar is not printed again"
    pacer.appeared(key, now=12)  # a line printed through the bar: the pace goes on
    assert pacer.due(key, b"70%", now=20)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def paced_reporter(
    every: float = 10, mode: ProgressMode = ProgressMode.AUTO
) -> tuple[ConsoleReporter, io.BytesIO, Clock]:
    clock = Clock()
    reporter = ConsoleReporter(mode, every, redraw=False, clock=clock)
    out = io.BytesIO()
    reporter._out = out  # type: ignore[assignment]
    reporter._terminal = False  # whatever runs the tests (pytest -s on a terminal)
    return reporter, out, clock


def test_without_a_terminal_a_bar_is_a_line_every_period_then_its_final_state() -> None:
    reporter, out, clock = paced_reporter(every=10)
    reporter.output("node1", 0, b"epoch 1\n\r  0%|  | 0/100")
    clock.now = 5
    reporter.output("node1", 0, b"\r 50%|# | 50/100")
    clock.now = 10.5
    reporter.output("node1", 0, b"\r 60%|# | 60/100")
    clock.now = 11
    reporter.output("node1", 0, b"\r 70%|# | 70/100   ")
    clock.now = 15
    reporter.output("node1", 0, b"\r100%|##| 100/100\ndone\n")
    assert out.getvalue() == (
        b"[node1 r0] epoch 1\n"
        b"[node1 r0]  60%|# | 60/100\n"
        b"[node1 r0] 100%|##| 100/100\n"
        b"[node1 r0] done\n"
    )


def test_a_bar_shorter_than_the_period_prints_only_its_final_state() -> None:
    reporter, out, clock = paced_reporter(every=10)
    for step in range(1, 21):
        clock.now = step * 0.2
        reporter.output("node2", 1, f"\r{step * 5}%|".encode())
    reporter.output("node2", 1, b"\n")
    assert out.getvalue() == b"[node2 r1] 100%|\n"


def test_a_bar_still_moving_at_the_end_is_printed_in_its_last_state() -> None:
    reporter, out, _ = paced_reporter()
    reporter.output("node1", 0, b"\r 10%|\r 20%|")
    assert out.getvalue() == b""
    reporter.close()
    assert out.getvalue() == b"[node1 r0]  20%|\n"


def test_a_bar_cut_short_is_not_printed_twice_in_the_same_state() -> None:
    reporter, out, clock = paced_reporter(every=1)
    reporter.output("node1", 0, b"\r 10%|")
    clock.now = 1
    reporter.output("node1", 0, b"\r 20%|")
    reporter.close()  # the job was killed: no newline will come
    assert out.getvalue() == b"[node1 r0]  20%|\n"


def test_many_bars_without_a_terminal_print_only_the_chosen_and_say_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reporter, out, clock = paced_reporter(every=1)
    bars = bars_of(64)
    for key, state in bars.items():
        reporter.output(key[0], key[1], b"\r" + state)
    clock.now = 2
    for key, state in bars.items():
        reporter.output(key[0], key[1], b"\r" + state + b"#")
    printed = out.getvalue().decode().splitlines()
    assert len(printed) == 2, printed
    assert "62 more ranks draw a progress bar" in capsys.readouterr().err


def test_mode_none_prints_no_moving_bar_but_every_final_state() -> None:
    reporter, out, clock = paced_reporter(every=1, mode=ProgressMode.NONE)
    reporter.output("node1", 0, b"\r 10%|")
    clock.now = 5
    reporter.output("node1", 0, b"\r 90%|")
    reporter.output("node1", 0, b"\r100%|\n")
    assert out.getvalue() == b"[node1 r0] 100%|\n"


def test_colour_codes_go_to_a_terminal_and_are_stripped_elsewhere() -> None:
    data = b"\x1b[32mloss 0.4\x1b[0m\n\r\x1b[1m 10%\x1b[0m\r\x1b[1m100%\x1b[0m\n"
    reporter, out, _ = paced_reporter()
    reporter.output("node1", 0, data)
    assert out.getvalue() == b"[node1 r0] loss 0.4\n[node1 r0] 100%\n"
    reporter, out, _ = paced_reporter()
    reporter._terminal = True
    reporter.output("node1", 0, data)
    assert out.getvalue() == (
        b"[node1 r0] \x1b[32mloss 0.4\x1b[0m\n[node1 r0] \x1b[1m100%\x1b[0m\n"
    )
