"""Progress bars from the ranks: a real tqdm bar on 2 hosts, redrawn in place
on a terminal (a pty), a bounded number of plain lines through a pipe, its final
state in `orch logs`; the hosts' files keep every redraw."""

from __future__ import annotations

import codecs
import fcntl
import itertools
import os
import pty
import re
import struct
import subprocess
import termios
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import Cluster, OrchRunner, orch_command
from tests.support import Lines, job_id_of, write_job

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.xdist_group("progress"),
]  # one piped job serves the module

STEPS, SECONDS = 60, 4.0  # 15 redraws a second: more than a display should show
# `[node1 r0] train r0:  45%|████▌     | 27/60 [00:01<00:02, 14.9it/s, t=1795444569.710]`
BAR = re.compile(
    rf"\[(node\d) r(\d)\] train r\2: +(\d+)%\|[^|]*\| (\d+)/{STEPS} \[[^\]]*t=(\d+\.\d+)\]"
)
SCREEN_ROWS, SCREEN_COLS = 50, 200


def bars_job(tmp_path: Path, seconds: float = SECONDS) -> Path:
    return write_job(
        tmp_path,
        "progress",
        "bars.py",
        nodes=2,
        args=["--steps", str(STEPS), "--seconds", str(seconds)],
    )


class Screen:
    """Enough of a terminal for rich's live display: text, CR, LF, erase line
    (ESC[2K), cursor up (ESC[nA); colours and other codes are dropped. Every line
    ever written stays (the scrollback)."""

    _CSI = re.compile(r"\x1b\[([0-?]*)[ -/]*([@-~])")

    def __init__(self) -> None:
        self.lines = [""]
        self.row = self.col = 0
        self._decode = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = ""

    def feed(self, data: bytes) -> None:
        text = self._pending + self._decode.decode(data)
        cut = text.rfind("\x1b")
        if cut >= 0 and not self._CSI.match(text, cut):  # an escape split by a read
            text, self._pending = text[:cut], text[cut:]
        else:
            self._pending = ""
        pos = 0
        for m in self._CSI.finditer(text):
            self._write(text[pos : m.start()])
            params, final = m.groups()
            if final == "K":
                self.lines[self.row] = ""
            elif final == "A":
                self.row = max(0, self.row - int(params or 1))
            pos = m.end()
        self._write(text[pos:])

    def _write(self, text: str) -> None:
        for part in re.split(r"([\r\n])", text):
            if part == "\r":
                self.col = 0
            elif part == "\n":
                self.row += 1
                if self.row == len(self.lines):
                    self.lines.append("")
            elif part:
                line = self.lines[self.row].ljust(self.col)
                self.lines[self.row] = line[: self.col] + part + line[self.col + len(part) :]
                self.col += len(part)

    def text(self) -> list[str]:
        return [line.rstrip() for line in self.lines if line.strip()]


class OnTerminal:
    """`orch ...` with a pty as its stdout (200 columns): what reached the screen,
    and when."""

    def __init__(self, orch: OrchRunner, *args: str | Path) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SCREEN_ROWS, SCREEN_COLS, 0, 0))
        env = orch.controller.env(TERM="xterm-256color")
        for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_INTERACTIVE"):
            env.pop(name, None)
        self.proc = subprocess.Popen(
            [*orch_command(), *map(str, args)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        os.close(slave)
        assert self.proc.stderr is not None
        self.err = Lines(self.proc.stderr)
        self.chunks: list[tuple[float, bytes]] = []
        self._master = master
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: the last writer is gone
                break
            if not data:
                break
            self.chunks.append((time.time(), data))
        os.close(self._master)

    def wait(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(10)
        return code

    @property
    def raw(self) -> bytes:
        return b"".join(data for _, data in self.chunks)


def assert_bars_moved_in_place(run: OnTerminal) -> None:
    """Each rank's bar was on screen while it moved, one live line per rank, every
    redraw shown within 1 s of being written and at most a few a second; what stays
    on screen is each bar's final state, once, with its prefix."""
    screen = Screen()
    first_seen: dict[tuple[str, float], float] = {}  # (rank, written at) -> on screen at
    moving: dict[str, set[int]] = defaultdict(set)  # percentages seen while it moved
    for at, data in run.chunks:
        screen.feed(data)
        live = [m for line in screen.lines if (m := BAR.search(line)) and m[4] != str(STEPS)]
        per_rank = defaultdict(int)
        for m in live:
            per_rank[m[2]] += 1
            moving[m[2]].add(int(m[3]))
            first_seen.setdefault((m[2], float(m[5])), at)
        assert all(n == 1 for n in per_rank.values()), f"one live line per rank: {live}"
    for rank in ("0", "1"):
        shown = sorted(at for (r, _), at in first_seen.items() if r == rank)
        assert len(moving[rank]) >= 8, f"rank {rank}'s bar moved on screen: {moving[rank]}"
        assert all(shown[i + 6] - shown[i] > 1.0 for i in range(len(shown) - 6)), (
            f"rank {rank}: more than 6 redraws in a second"
        )
    late = {k: at - k[1] for k, at in first_seen.items() if at - k[1] >= 1.0}
    assert late == {}, "redraws that reached the screen over 1 s after they were written"
    final = screen.text()
    kept = [m for line in final if (m := BAR.search(line))]
    assert sorted(m[2] for m in kept) == ["0", "1"], final
    assert all(m[4] == str(STEPS) for m in kept), final
    for rank in ("0", "1"):
        mine = [line for line in final if re.match(rf"\[node\d r{rank}\] ", line)]
        assert [line.split("] ", 1)[1].split(":")[0] for line in mine] == [
            f"start rank={rank}",
            f"train r{rank}",
            f"done rank={rank}",
        ], final


def test_on_a_terminal_each_rank_bar_is_redrawn_in_place_within_a_second(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    run = OnTerminal(orch, "submit", bars_job(tmp_path), "-i", inventory)
    assert run.wait() == 0, run.err.text()
    assert_bars_moved_in_place(run)
    assert b"\x1b[32mstart rank=0\x1b[0m" in run.raw, "colours go through to a terminal"


def test_logs_follow_on_a_terminal_redraws_the_bars_too(
    orch: OrchRunner, inventory: Path, tmp_path: Path
) -> None:
    # Twice as long a bar: a resubmit starts warm, its ranks draw the moment the submit
    # returns, and `orch logs -f` (a new command) would see only the bar's last part.
    submitted = orch("submit", "-d", bars_job(tmp_path, 2 * SECONDS), "-i", inventory, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    run = OnTerminal(orch, "logs", "-f", job_id_of(submitted.stdout))
    assert run.wait() == 0, run.err.text()
    assert_bars_moved_in_place(run)


@dataclass
class Piped:
    orch: OrchRunner
    result: subprocess.CompletedProcess[str]
    job_id: str


@pytest.fixture(scope="module")
def piped(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Piped:
    """One attached submit of the bars job with its stdout a pipe, a line every 1 s."""
    tmp = tmp_path_factory.mktemp("progress")
    orch = OrchRunner(cluster.new_controller())
    inventory = cluster.write_inventory(tmp / "inventory.yaml")
    result = orch("submit", bars_job(tmp), "-i", inventory, "--progress-every", "1", timeout=120)
    assert result.returncode == 0, result.stderr
    return Piped(orch, result, job_id_of(result.stdout))


def test_through_a_pipe_a_bar_is_a_plain_line_at_most_every_period(piped: Piped) -> None:
    out = piped.result.stdout
    assert "\r" not in out and "\x1b" not in out, "no redraws joined, no colour codes"
    for rank in ("0", "1"):
        mine = [line for line in out.splitlines() if re.match(rf"\[node\d r{rank}\] ", line)]
        assert mine[0].endswith(f"] start rank={rank}") and mine[-1].endswith(f"] done rank={rank}")
        bars = [m for line in mine[1:-1] if (m := BAR.fullmatch(line))]
        assert len(bars) == len(mine) - 2, mine
        assert bars[-1][4] == str(STEPS), "the final state comes last"
        moving = bars[:-1]
        assert 2 <= len(moving) <= SECONDS / 1 + 1, mine
        written = [float(m[5]) for m in bars]
        assert all(b - a >= 0.5 for a, b in itertools.pairwise(written)), (
            f"rank {rank}: lines closer than the period: {written}"
        )


def test_logs_show_each_bar_in_its_final_state_and_the_hosts_keep_every_redraw(
    cluster: Cluster, piped: Piped
) -> None:
    result = piped.orch("logs", piped.job_id, timeout=60)
    assert result.returncode == 0, result.stderr
    for rank in ("0", "1"):
        mine = [line for line in result.stdout.splitlines() if f" r{rank}] " in line]
        assert len(mine) == 3, mine
        assert mine[0].endswith(f"start rank={rank}") and mine[2].endswith(f"done rank={rank}")
        final = BAR.fullmatch(mine[1])
        assert final is not None and final[4] == str(STEPS), mine
    host_files = sorted(  # a set: hosts may share a home
        {
            path
            for i in (1, 2, 3)
            for path in (cluster.home(i) / ".orch" / "jobs" / piped.job_id).glob("*/logs/*.log")
        }
    )
    assert len(host_files) == 2
    for path in host_files:
        data = path.read_bytes()
        redraws = set(re.findall(rb"t=(\d+\.\d+)", data))
        assert len(redraws) == STEPS and data.count(b"\r") > STEPS, "every redraw kept"
        host = path.parts[-3]
        mirror = piped.orch.controller.state_dir / "logs" / piped.job_id / host
        assert (mirror / path.name.removeprefix("rank-")).read_bytes() == data
