"""What `orch top` makes of two samples of a node, whatever the backend: rates, who
falls behind, and the loop of refreshes (`refreshes`: ssh/top.py samples SSH hosts,
slurm/top.py a Slurm job's nodes, and each gives the loop only its sampling).

Rates come from two consecutive samples of one host, on that host's own monotonic
clock (the network's delay is no part of them).

**Who falls behind** (`laggards`), among the job's ranks, relative to the others:

1. Only *talkers* are judged: ranks seen printing while `orch top` watched, or whose
   last line came at least STARTUP_S (30 s) after they started. A rank that prints only while
   it starts (scripts where rank 0 alone logs) is never judged: its silence is its habit.
2. Two talkers at least: behind means behind the others.
3. **Silent**: a talker whose last line is SILENT_S (10 s; `--silent-after`) or more
   ago, and SILENT_RATIO (3) times longer ago than the median of the other talkers'
   (while they print, it does not).
4. **Slow**: otherwise, a talker printing fewer lines per second than SLOW_RATIO (1/4)
   of the median of the other talkers, when that median is MIN_RATE (1 line/s) or more:
   a rate in one window is noisy, and below that, a line or two decide it.
5. A node is behind when one of its ranks is; the reason names the rank.

"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from orchestrator.agent.kernel.replies import TopSample
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.reporting.top import SILENT_S, GpuView, NodeView, RankView, TopView

STARTUP_S = 30.0
SILENT_RATIO = 3.0
SLOW_RATIO = 0.25
MIN_RATE = 1.0


# ---------------------------------------------------------------- rates


def node_view(
    node: NodeRecord, now: TopSample, before: TopSample | None, talked: set[tuple[str, str]]
) -> NodeView:
    """A node's figures from two consecutive samples of its host (`before` None: the
    first, which has no rates yet). Adds the ranks seen printing to `talked`."""
    host = node.host.name
    if not now.exists:
        return NodeView(host, node.node_rank, "missing", error="no job directory on the host")
    window = now.clock - before.clock if before is not None and now.clock > before.clock else None
    earlier = {str(r.get("stream")): r for r in (before.ranks if before is not None else ())}
    ranks = []
    for r in now.ranks:
        stream = str(r.get("stream"))
        log = r.get("log") or {}
        lines = log.get("lines") if window is not None else None
        if lines:
            talked.add((host, stream))
        idle, age = log.get("idle_s"), r.get("age_s")
        late_line = idle is not None and age is not None and age - idle >= STARTUP_S
        ranks.append(
            RankView(
                host=host,
                rank=r.get("rank"),
                pids=tuple(r.get("pids") or ()),
                cpu_percent=cpu_percent(r, earlier.get(stream), window),
                rss_bytes=int(r.get("rss_bytes") or 0),
                lines=lines,
                lines_per_s=None if lines is None or not window else round(lines / window, 2),
                idle_s=idle,
                age_s=age,
                gpus=tuple(r.get("gpus") or ()),
                gpu_memory_mib=int(r.get("gpu_memory_mib") or 0),
                talks=(host, stream) in talked or late_line,
            )
        )
    launcher = now.launcher or {}
    before_launcher = before.launcher if before is not None else None
    return NodeView(
        host,
        node.node_rank,
        state_of(now),
        tuple(ranks),
        window_s=None if window is None else round(window, 3),
        launcher_cpu_percent=cpu_percent(launcher, before_launcher, window),
        launcher_rss_bytes=int(launcher.get("rss_bytes") or 0),
        gpus=None if now.gpus is None else tuple(gpu_view(g) for g in now.gpus),
        gpu_error=now.gpu_error,
        warm=tuple(now.warm),
    )


def cpu_percent(
    now: dict[str, Any], before: dict[str, Any] | None, window: float | None
) -> float | None:
    """CPU use over the window, in % of one core. Processes that ended in the window
    take their seconds with them: never below 0."""
    if before is None or not window:
        return None
    used = float(now.get("cpu_s") or 0.0) - float(before.get("cpu_s") or 0.0)
    return round(max(0.0, used) / window * 100, 1)


def state_of(sample: TopSample) -> str:
    if sample.ended is not None:
        return "ended"
    return "running" if sample.running else "starting"


def gpu_view(g: dict[str, Any]) -> GpuView:
    return GpuView(
        index=g.get("index"),
        uuid=str(g.get("uuid") or ""),
        utilization_percent=g.get("utilization_percent"),
        memory_used_mib=g.get("memory_used_mib"),
        memory_total_mib=g.get("memory_total_mib"),
        used=bool(g.get("used")),
        ranks=tuple(g.get("ranks") or ()),
    )


# ---------------------------------------------------------------- who falls behind


def laggards(
    ranks: Sequence[RankView], silent_s: float = SILENT_S
) -> dict[tuple[str, int | None], str]:
    """The ranks that fall behind the others, by (host, rank), with why (module
    docstring, "Who falls behind"; `silent_s` is its SILENT_S)."""
    talkers = [r for r in ranks if r.talks]
    if len(talkers) < 2:
        return {}
    found: dict[tuple[str, int | None], str] = {}
    for r in talkers:
        others = [o for o in talkers if o is not r]
        idles = [o.idle_s for o in others if o.idle_s is not None]
        rates = [o.lines_per_s for o in others if o.lines_per_s is not None]
        if r.idle_s is not None and idles:
            usual = statistics.median(idles)
            if r.idle_s >= silent_s and r.idle_s >= SILENT_RATIO * usual:
                found[r.host, r.rank] = f"silent for {r.idle_s:.0f} s (others: {usual:.0f} s)"
                continue
        if r.lines_per_s is not None and rates:
            usual = statistics.median(rates)
            if usual >= MIN_RATE and r.lines_per_s < SLOW_RATIO * usual:
                found[r.host, r.rank] = f"{r.lines_per_s:.3g} lines/s (others: {usual:.3g})"
    return found


def judged(nodes: Sequence[NodeView], silent_s: float = SILENT_S) -> tuple[NodeView, ...]:
    """The nodes with each rank's `behind` set by `laggards`."""
    verdict = laggards([r for n in nodes for r in n.ranks], silent_s)
    return tuple(
        replace(n, ranks=tuple(replace(r, behind=verdict.get((r.host, r.rank))) for r in n.ranks))
        for n in nodes
    )


def top_view(
    record: JobRecord, views: list[NodeView], interval_s: float, silent_s: float = SILENT_S
) -> TopView:
    """One look at a job (SSH or Slurm alike): running while any node is, each rank's
    `behind` judged."""
    state = "ended" if all(v.state in ("ended", "missing") for v in views) else "running"
    nodes = judged(views, silent_s)
    stall = record.spec.get("stall_after")
    stall_after = float(stall) if isinstance(stall, (int, float)) else None
    return TopView(record.id, record.name, state, time.time(), interval_s, nodes, stall_after)


def log_offsets(sample: TopSample) -> dict[str, int]:
    """How far a node's sample read each rank's log: what the next sample asks for
    (a host reads only what a log grew by since, never a whole log)."""
    return {
        str(r.get("stream")): int((r.get("log") or {}).get("offset") or 0) for r in sample.ranks
    }


def refreshes(
    first: TopView,
    sample: Callable[[], TopView],
    final_state: Callable[[], str],
    interval_s: float,
) -> Iterator[TopView]:
    """`first`, then a refresh `interval_s` after each view's time (`sample`), until
    one says the job ended: that last one carries the job's final state as its
    backend records it (`final_state`), and the iteration stops after it.

    Args:
        first: the first view, sampled and checked by the backend.
        sample: the next view of every node (raises what the backend's sampling does).
        final_state: the job's state once its nodes ended (`JobState.value`).
        interval_s: seconds between two refreshes.
    """
    view = first
    yield view
    while not view.ended:
        time.sleep(max(0.0, view.time + interval_s - time.time()))
        view = sample()
        if view.ended:
            view = replace(view, state=final_state())
        yield view
