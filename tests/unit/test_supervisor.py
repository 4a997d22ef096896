"""The node supervisor's log framing: `drain()` turns growing log files into JSON
line records with byte offsets, so that a follower can stop and resume anywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.remote import supervisor as sup


class Log:
    """One rank's log file and one follower's view of it (offsets, pending bytes)."""

    def __init__(self, path: Path, stream: str = "0") -> None:
        self.path = path
        self.stream = stream
        self.offsets: dict[str, int] = {}
        self.pending: dict[str, bytes] = {}
        path.touch()

    def append(self, data: bytes) -> None:
        with self.path.open("ab") as f:
            f.write(data)

    def drain(self, final: bool = False) -> bool:
        return sup.drain(self.stream, str(self.path), self.offsets, self.pending, final)


@pytest.fixture
def log(tmp_path: Path) -> Log:
    return Log(tmp_path / "rank-0.log")


def records(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """What the supervisor wrote since the last call: one JSON record per stdout line."""
    out = capsys.readouterr().out
    assert out == "" or out.endswith("\n")
    return [json.loads(line) for line in out.splitlines()]


def texts(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [r["t"] for r in records(capsys)]


def test_complete_lines_are_emitted_with_their_end_offsets(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    log.append(b"epoch 1\nloss 0.41\n")
    assert log.drain() is True
    assert records(capsys) == [
        {"k": "line", "s": "0", "o": 8, "t": "epoch 1"},
        {"k": "line", "s": "0", "o": 18, "t": "loss 0.41"},
    ]
    assert log.offsets == {"0": 18}


def test_nothing_new_emits_nothing(log: Log, capsys: pytest.CaptureFixture[str]) -> None:
    log.append(b"a\n")
    log.drain()
    records(capsys)
    assert log.drain() is False
    assert records(capsys) == []


def test_missing_file_emits_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sup.drain("3", str(tmp_path / "rank-3.log"), {}, {}, final=True) is False
    assert records(capsys) == []


def test_partial_line_is_held_back_until_its_newline(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    log.append(b"done\nepoch 2 lo")
    log.drain()
    assert texts(capsys) == ["done"]
    assert log.offsets == {"0": 5}  # the partial line is not counted yet

    log.append(b"ss 0.3")
    assert log.drain() is False
    assert records(capsys) == []

    log.append(b"8\nnext\n")
    log.drain()
    assert records(capsys) == [
        {"k": "line", "s": "0", "o": 5 + 18, "t": "epoch 2 loss 0.38"},
        {"k": "line", "s": "0", "o": 5 + 18 + 5, "t": "next"},
    ]


def test_final_drain_emits_the_unterminated_last_line(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    log.append(b"first\nTraceback: no newline")
    log.drain()
    assert texts(capsys) == ["first"]
    assert log.drain(final=True) is True
    assert records(capsys) == [{"k": "line", "s": "0", "o": 6 + 21, "t": "Traceback: no newline"}]
    assert log.drain(final=True) is False  # and only once
    assert records(capsys) == []


def test_binary_junk_is_replaced_without_breaking_the_framing(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    log.append(b"ok \xff\xfe\x00 \x1b[31mred\x1b[0m\rcr\n")
    log.append("é \u2028 sep\n".encode())
    log.append(b"\xe2\x82\n")  # a UTF-8 sequence cut short
    log.append(b"after\n")
    log.drain()
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 4  # one stdout line per record, whatever the bytes were
    got = [json.loads(line)["t"] for line in lines]
    assert got == [
        "ok \ufffd\ufffd\x00 \x1b[31mred\x1b[0m\rcr",
        "é \u2028 sep",
        "\ufffd",
        "after",
    ]
    assert json.loads(lines[-1])["o"] == log.path.stat().st_size


def test_long_line_below_max_line_is_kept_whole(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    line = b"x" * (sup.MAX_LINE // 2)
    for i in range(0, len(line), 4096):  # written in pieces, drained after each
        log.append(line[i : i + 4096])
        log.drain()
    assert records(capsys) == []
    log.append(b"\n")
    log.drain()
    (record,) = records(capsys)
    assert record["t"] == line.decode()
    assert record["o"] == len(line) + 1


def test_unterminated_line_reaching_max_line_is_cut(
    log: Log, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sup, "MAX_LINE", 8)
    log.append(b"abcdefghijklmnopqrst")  # 20 bytes, no newline yet
    log.drain()
    assert records(capsys) == [
        {"k": "line", "s": "0", "o": 8, "t": "abcdefgh"},
        {"k": "line", "s": "0", "o": 16, "t": "ijklmnop"},
    ]
    log.append(b"\n")
    log.drain()
    assert texts(capsys) == ["qrst"]


def test_line_longer_than_max_line_is_cut_even_with_its_newline(
    log: Log, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sup, "MAX_LINE", 8)
    log.append(b"abcdefghijklmnopqrst\n")
    log.drain()
    assert texts(capsys) == ["abcdefgh", "ijklmnop", "qrst"]


def test_resuming_from_offsets_emits_no_line_twice(
    log: Log, capsys: pytest.CaptureFixture[str]
) -> None:
    written = [f"line {i} " + "y" * (i * 37 % 300) for i in range(200)]
    data = "".join(f"{t}\n" for t in written).encode()
    seen: list[str] = []
    resume: dict[str, int] = {}
    # Followers come and go at arbitrary byte boundaries; each new one starts from the
    # offsets of the last record the controller received, with nothing pending.
    for cut in (1, 700, 701, 5000, 12000, 20000, len(data)):
        already = log.path.stat().st_size
        log.append(data[already:cut])
        follower = Log(log.path)
        follower.offsets = dict(resume)
        follower.drain()
        follower.drain()  # a second pass over the same bytes adds nothing
        got = records(capsys)
        seen += [r["t"] for r in got]
        if got:
            resume = {"0": got[-1]["o"]}
    assert seen == written


def test_streams_are_framed_independently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    offsets: dict[str, int] = {}
    pending: dict[str, bytes] = {}
    (tmp_path / "a.log").write_bytes(b"a1\na2 part")
    (tmp_path / "b.log").write_bytes(b"b1\n")
    sup.drain("0", str(tmp_path / "a.log"), offsets, pending, final=False)
    sup.drain("1", str(tmp_path / "b.log"), offsets, pending, final=False)
    assert [(r["s"], r["t"]) for r in records(capsys)] == [("0", "a1"), ("1", "b1")]
    assert offsets == {"0": 3, "1": 3}
    assert pending == {"0": b"a2 part", "1": b""}


def test_log_files_are_torchrun_log_then_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "logs").mkdir()
    for name in ("rank-0.log", "rank-10.log", "rank-2.log", "rank-0.pid", "other.log"):
        (tmp_path / "logs" / name).write_text("")
    monkeypatch.chdir(tmp_path)
    assert sup.log_files() == [
        ("node", "torchrun.log"),
        ("0", "logs/rank-0.log"),
        ("10", "logs/rank-10.log"),
        ("2", "logs/rank-2.log"),
    ]


def test_unknown_command_prints_usage_and_returns_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert sup.main(["launch"]) == 2
    assert "usage: orch_supervisor.py {probe,start,follow,kill,rank}" in capsys.readouterr().err
