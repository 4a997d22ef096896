"""What `orch stack` shows (pure): every rank's stack, grouped by identical stacks.

Each node's agent answers with its ranks' threads (agent/node/stack.py, `RankStack`);
`view` turns those answers into a `StackView`: one `RankDump` per rank, the ranks
grouped where their main threads' stacks are the same frame for frame (the largest
group first), ranks that could not be read grouped by why, and the hosts that did not
answer. `lines` renders it as text, as the CLI prints it and the job's records keep
it; `to_json` is the `--json` shape, documented there and stable (fields may be
added, none renamed or removed).

A group shows its main thread condensed: the innermost frame, then the frames outside
the standard library, at most `SHOWN` of them; `-v` (`verbose`) shows every thread
of every rank, each rank apart. Files read as the ranks' logs would name them: the
job's own relative to its code directory, an installed package's from its package
(`torch/distributed/...`), the standard library's by module path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.agent.kernel.replies import RankStack, StackReply

SHOWN = 8  # frames of a group's condensed stack
_PACKAGES = re.compile(r"/(?:site|dist)-packages/")
_STDLIB = re.compile(r"/lib/python\d+(?:\.\d+)?t?/")
# orch's own frames outside the user's code, dropped: traceable.BOOT's (`-c`, runpy) and
# a warm rank's launcher (the agent's package, or its run.py, in a version's directory).
_ORCH_OUTER = re.compile(
    r"^<string>$|^<frozen runpy>$|/runpy\.py$|/orch_agent/"
    r"|/agent/[0-9a-f]{16}/run\.py$|/orch-agent-[^/]+/run\.py$"
)


@dataclass(frozen=True)
class StackOptions:
    """`orch stack`: which ranks (none named: all; else those of `ranks` and of the
    hosts in `nodes`), and `native`: C frames too, where py-spy reads the rank."""

    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    native: bool = False


@dataclass(frozen=True)
class Frame:
    """One frame: the function, its file as the rank has it, the line."""

    function: str
    file: str
    line: int
    short: str = ""  # the file as shown (see the module docstring)

    @property
    def where(self) -> str:
        """`file:line`; a native frame (`--native`), whose line is 0, its library."""
        shown = self.short or self.file
        return f"{shown}:{self.line}" if self.line else shown

    @property
    def stdlib(self) -> bool:
        return bool(_STDLIB.search(self.file)) and not _PACKAGES.search(self.file)


@dataclass(frozen=True)
class Thread:
    id: int | None
    name: str | None
    active: bool
    frames: tuple[Frame, ...]  # innermost first


@dataclass(frozen=True)
class RankDump:
    """One rank's stack, or why it has none (`error`, `hint`; `ended`: it was gone)."""

    host: str
    rank: int
    pid: int | None = None
    via: str | None = None  # "py-spy" or "faulthandler"
    native: bool = False
    error: str | None = None
    hint: str | None = None
    ended: bool = False
    threads: tuple[Thread, ...] = ()

    @property
    def main(self) -> Thread | None:
        """The thread that runs the rank's script: MainThread, else the one whose
        outermost frame is a module's, else the first."""
        for thread in self.threads:
            if thread.name == "MainThread":
                return thread
        for thread in self.threads:
            if thread.frames and thread.frames[-1].function == "<module>":
                return thread
        return self.threads[0] if self.threads else None

    @property
    def key(self) -> tuple[object, ...]:
        """What two ranks in one group share."""
        if self.ended:
            return ("ended",)
        if self.error is not None or self.main is None:
            return ("error", self.error or "no Python thread")
        return tuple((f.function, f.short or f.file, f.line) for f in self.main.frames)


@dataclass(frozen=True)
class StackGroup:
    """Ranks with the same stack: (host, rank) pairs, their condensed frames (or the
    error they share), how many frames were left out."""

    ranks: tuple[tuple[str, int], ...]
    frames: tuple[Frame, ...] = ()
    more: int = 0
    error: str | None = None
    hint: str | None = None
    ended: bool = False


@dataclass(frozen=True)
class StackView:
    """A job's stacks, taken once."""

    job_id: str
    taken: float  # seconds since the epoch
    ranks: tuple[RankDump, ...]
    groups: tuple[StackGroup, ...]
    unanswered: tuple[tuple[str, str], ...] = ()  # (host, why) of hosts that did not answer
    flight: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # host -> rank -> path
    saved: str | None = None  # the controller's copy (records/stacks.py)

    @property
    def ways(self) -> dict[str, int]:
        """How many ranks were read each way."""
        counts: dict[str, int] = {}
        for dump in self.ranks:
            if dump.via:
                counts[dump.via] = counts.get(dump.via, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        """{"job", "taken", "groups": [{"ranks": [{"host", "rank"}], "frames":
        [{"function", "file", "line"}], "error", "ended"}], "ranks": [{"host", "rank",
        "pid", "via", "native", "error", "hint", "ended", "threads": [{"id", "name",
        "active", "frames"}]}], "unanswered": [{"host", "error"}], "flight": {host:
        {rank: path}}, "saved"}; `file` is as shown, `path` the rank's own."""

        def frame(f: Frame) -> dict[str, Any]:
            return {
                "function": f.function,
                "file": f.short or f.file,
                "line": f.line,
                "path": f.file,
            }

        return {
            "job": self.job_id,
            "taken": self.taken,
            "groups": [
                {
                    "ranks": [{"host": h, "rank": r} for h, r in g.ranks],
                    "frames": [frame(f) for f in g.frames],
                    "error": g.error,
                    "ended": g.ended,
                }
                for g in self.groups
            ],
            "ranks": [
                {
                    "host": d.host,
                    "rank": d.rank,
                    "pid": d.pid,
                    "via": d.via,
                    "native": d.native,
                    "error": d.error,
                    "hint": d.hint,
                    "ended": d.ended,
                    "threads": [
                        {
                            "id": t.id,
                            "name": t.name,
                            "active": t.active,
                            "frames": [frame(f) for f in t.frames],
                        }
                        for t in d.threads
                    ],
                }
                for d in self.ranks
            ],
            "unanswered": [{"host": h, "error": e} for h, e in self.unanswered],
            "flight": {h: dict(found) for h, found in self.flight.items()},
            "saved": self.saved,
        }


# ---------------------------------------------------------------- from the replies


def short_file(path: str, code: str | None) -> str:
    """A frame's file as shown: relative to the job's code, from its package, or from
    the standard library; else as it is."""
    if code and path.startswith(code.rstrip("/") + "/"):
        return path[len(code.rstrip("/")) + 1 :]
    if ".so" in path.rpartition("/")[2]:  # a native frame's library (--native)
        return path.rpartition("/")[2]
    for pattern in (_PACKAGES, _STDLIB):
        found = list(pattern.finditer(path))
        if found:
            return path[found[-1].end() :]
    return path


def rank_dump(host: str, given: RankStack, code: str | None) -> RankDump:
    """A rank's answer, its frames' files shortened, orch's own outer frames dropped."""
    threads = []
    for thread in given.threads:
        frames = [
            Frame(str(f.get("function")), str(f.get("file")), int(f.get("line") or 0))
            for f in thread.get("frames") or ()
        ]
        while len(frames) > 1 and _ORCH_OUTER.search(frames[-1].file):
            frames.pop()
        shown = tuple(Frame(f.function, f.file, f.line, short_file(f.file, code)) for f in frames)
        name = thread.get("name")
        number = thread.get("id")
        threads.append(
            Thread(
                number if isinstance(number, int) else None,
                name if isinstance(name, str) else None,
                bool(thread.get("active")),
                shown,
            )
        )
    return RankDump(
        host,
        given.rank,
        given.pid,
        given.via,
        given.native,
        given.error,
        given.hint,
        given.ended,
        tuple(threads),
    )


def view(
    job_id: str,
    taken: float,
    replies: Mapping[str, StackReply],
    unanswered: Sequence[tuple[str, str]] = (),
    hosts_order: Sequence[str] = (),
) -> StackView:
    """The job's StackView from each host's reply (hosts in `hosts_order` first)."""
    order = {name: i for i, name in enumerate(hosts_order)}
    dumps = sorted(
        (rank_dump(host, r, reply.code) for host, reply in replies.items() for r in reply.ranks),
        key=lambda d: (d.rank, order.get(d.host, len(order)), d.host),
    )
    flight = {host: dict(reply.flight) for host, reply in replies.items() if reply.flight}
    return StackView(job_id, taken, tuple(dumps), grouped(dumps), tuple(unanswered), flight)


def grouped(dumps: Iterable[RankDump]) -> tuple[StackGroup, ...]:
    """Ranks grouped by `RankDump.key`: the read ones by size, the largest first, then
    the unread (errors, then ended); ties by the lowest rank."""
    by_key: dict[tuple[object, ...], list[RankDump]] = {}
    for dump in dumps:
        by_key.setdefault(dump.key, []).append(dump)

    def order(members: list[RankDump]) -> tuple[int, int, int]:
        first = members[0]
        unread = 2 if first.ended else 1 if first.key[0] == "error" else 0
        return (unread, -len(members), min(d.rank for d in members))

    groups = []
    for members in sorted(by_key.values(), key=order):
        first, ranks = members[0], tuple((d.host, d.rank) for d in members)
        if first.ended or first.key[0] == "error":
            error = "ended" if first.ended else str(first.key[1])
            groups.append(StackGroup(ranks, error=error, hint=first.hint, ended=first.ended))
            continue
        main = first.main
        frames, more = condensed(main.frames if main else ())
        groups.append(StackGroup(ranks, frames, more))
    return tuple(groups)


def condensed(frames: Sequence[Frame]) -> tuple[tuple[Frame, ...], int]:
    """The innermost frame, then those outside the standard library, at most SHOWN;
    and how many were left out."""
    if not frames:
        return (), 0
    kept = [frames[0], *(f for f in frames[1:] if not f.stdlib)]
    return tuple(kept[:SHOWN]), len(frames) - min(len(kept), SHOWN)


# ---------------------------------------------------------------- as text


def rank_names(ranks: Sequence[tuple[str, int]]) -> str:
    """`node1 r0-r1, node2 r2-r3, node4 r6`: each host's ranks, runs joined, hosts in
    the order of their first rank."""
    by_host: dict[str, list[int]] = {}
    for host, rank in sorted(ranks, key=lambda hr: hr[1]):
        by_host.setdefault(host, []).append(rank)
    parts = []
    for host, numbers in by_host.items():
        runs: list[list[int]] = []
        for n in numbers:
            if runs and n == runs[-1][-1] + 1:
                runs[-1].append(n)
            else:
                runs.append([n])
        spans = [f"r{r[0]}" if len(r) == 1 else f"r{r[0]}-r{r[-1]}" for r in runs]
        parts.append(f"{host} {','.join(spans)}")
    return ", ".join(parts)


def lines(stacks: StackView, verbose: bool = False) -> list[str]:
    """`stacks` as text: the groups, then (verbose) every rank apart with every thread,
    then the hosts that did not answer and how the ranks were read."""
    out: list[str] = []
    if not stacks.groups and not stacks.unanswered:
        out.append(f"no rank of job {stacks.job_id} runs on its nodes (yet, or any more)")
    width = max((len(str(len(g.ranks))) for g in stacks.groups), default=1)
    for group in stacks.groups:
        count = len(group.ranks)
        head = f"{count:>{width}} {'rank ' if count == 1 else 'ranks'}  {rank_names(group.ranks)}"
        if group.error is not None:
            out.append(f"{head}  {'ended' if group.ended else 'not read: ' + group.error}")
            if group.hint:
                out.append(f"  hint: {group.hint}")
            continue
        out.append(head)
        name_width = max((len(f.function) for f in group.frames), default=0)
        out += [f"  {f.function:<{name_width}}  {f.where}" for f in group.frames]
        if group.more:
            out.append(f"  ... {group.more} more frame{'s' if group.more != 1 else ''} (-v)")
    if verbose:
        for dump in stacks.ranks:
            out += ["", *rank_lines(dump)]
    for host, why in stacks.unanswered:
        out.append(f"{host}: no stacks: {why}")
    for host, found in stacks.flight.items():
        for rank, path in sorted(found.items()):
            out.append(f"{host} r{rank}: NCCL flight recorder dump {path}")
    ways = stacks.ways
    if ways:
        said = ", ".join(f"{n} rank{'s' if n != 1 else ''} with {way}" for way, n in ways.items())
        out.append(f"read: {said}")
    return out


def rank_lines(dump: RankDump) -> list[str]:
    """One rank apart: every thread, every frame."""
    how = f"pid {dump.pid}" + (f", {dump.via}" if dump.via else "")
    out = [f"{dump.host} r{dump.rank} ({how})"]
    if dump.error is not None:
        out.append(f"  {'ended' if dump.ended else 'not read: ' + dump.error}")
        if dump.hint:
            out.append(f"  hint: {dump.hint}")
        return out
    if dump.hint:
        out.append(f"  note: {dump.hint}")
    for thread in dump.threads:
        label = f"Thread {thread.id if thread.id is not None else '?'}"
        label += f' "{thread.name}"' if thread.name else ""
        out.append(f"  {label}{' (active)' if thread.active else ''}")
        out += [f"    {f.function} ({f.where})" for f in thread.frames]
    return out
