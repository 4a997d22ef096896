"""What `orch top` shows, whatever the backend: a refresh of a job (`TopView`), its
nodes, ranks and GPUs, and which job to watch. The sampling itself is the backend's
(ssh/top.py over SSH, slurm/top.py through srun); the loop of refreshes is
top_rates.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.agent.kernel.replies import WarmRow
from orchestrator.models.errors import InputError
from orchestrator.records.db import JobDB, JobRecord

INTERVAL_S = 2.0  # default refresh; bench/top.py measures what it costs the ranks
SILENT_S = 10.0


@dataclass(frozen=True)
class RankView:
    """One rank over the last window. None: not known yet (the first sample has no
    window) or not known at all (no log yet)."""

    host: str
    rank: int | None  # None: launcher python's one process per node
    pids: tuple[int, ...]
    cpu_percent: float | None  # of one core; a rank with 4 busy threads shows 400
    rss_bytes: int
    lines: int | None  # new lines in the window
    lines_per_s: float | None
    idle_s: float | None  # seconds since its last line
    age_s: float | None  # seconds since it started
    gpus: tuple[int, ...]
    gpu_memory_mib: int
    talks: bool = False
    behind: str | None = None  # why, in words

    @property
    def label(self) -> str:
        return "node" if self.rank is None else f"r{self.rank}"


@dataclass(frozen=True)
class GpuView:
    index: int | None
    uuid: str
    utilization_percent: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    used: bool  # a process of the job holds memory there
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class NodeView:
    """One node: `state` is running, starting, ended, missing (no job directory on the
    host) or unreachable (`error` says why)."""

    host: str
    node_rank: int
    state: str
    ranks: tuple[RankView, ...] = ()
    window_s: float | None = None
    launcher_cpu_percent: float | None = None
    launcher_rss_bytes: int = 0
    gpus: tuple[GpuView, ...] | None = None  # None: no nvidia-smi there
    gpu_error: str | None = None
    error: str | None = None
    warm: tuple[WarmRow, ...] = ()  # the user's warm interpreters on the host

    @property
    def behind(self) -> str | None:
        return next((f"{r.label} {r.behind}" for r in self.ranks if r.behind), None)

    @property
    def idle_s(self) -> float | None:
        """Seconds since any of its ranks last printed (None: none has yet)."""
        return min((r.idle_s for r in self.ranks if r.idle_s is not None), default=None)


@dataclass(frozen=True)
class TopView:
    """One refresh of a job."""

    job_id: str
    name: str
    state: str
    time: float  # the controller's wall clock
    interval_s: float
    nodes: tuple[NodeView, ...]
    stall_after: float | None = None  # the job's stall_after:, if it has one

    @property
    def ended(self) -> bool:
        return all(n.state in ("ended", "missing") for n in self.nodes)

    @property
    def behind(self) -> list[str]:
        return [n.host for n in self.nodes if n.behind]

    def quiet(self, node: NodeView) -> str | None:
        """Why a running node's silence is worth a look: its ranks have printed nothing
        for a tenth of the job's `stall_after:` or more (None: not so, or no watchdog)."""
        idle = node.idle_s
        if self.stall_after is None or idle is None or node.state != "running":
            return None
        if idle < self.stall_after / 10:
            return None
        return f"no line for {idle:.0f} s (stall_after: {self.stall_after:.0f})"

    def to_json(self) -> dict[str, Any]:
        """The `--once --json` shape:

        {"job", "name", "state", "time", "interval_s", "behind": [host...],
         "stall_after": seconds | null,
         "nodes": [{"host", "node_rank", "state", "error", "behind": why | null,
                    "idle_s": seconds since its ranks last printed | null,
                    "quiet": why its silence is a tenth of stall_after or more | null,
                    "window_s", "launcher": {"cpu_percent", "rss_bytes"},
                    "gpus": null (no nvidia-smi) | [{"index", "uuid",
                        "utilization_percent", "memory_used_mib", "memory_total_mib",
                        "used", "ranks"}],
                    "gpu_error",
                    "warm": [{"pid", "state", "preload", "pss_kb", "idle_s"}],
                    "ranks": [{"rank", "pids", "cpu_percent", "rss_bytes", "lines",
                               "lines_per_s", "idle_s", "age_s", "gpus",
                               "gpu_memory_mib", "talks", "behind": why | null}]}]}
        """
        return {
            "job": self.job_id,
            "name": self.name,
            "state": self.state,
            "time": self.time,
            "interval_s": self.interval_s,
            "behind": self.behind,
            "stall_after": self.stall_after,
            "nodes": [
                {
                    "host": n.host,
                    "node_rank": n.node_rank,
                    "state": n.state,
                    "error": n.error,
                    "behind": n.behind,
                    "idle_s": n.idle_s,
                    "quiet": self.quiet(n),
                    "window_s": n.window_s,
                    "launcher": {
                        "cpu_percent": n.launcher_cpu_percent,
                        "rss_bytes": n.launcher_rss_bytes,
                    },
                    "gpus": None if n.gpus is None else [_gpu_json(g) for g in n.gpus],
                    "gpu_error": n.gpu_error,
                    "warm": [
                        {
                            "pid": w.pid,
                            "state": w.state,
                            "preload": list(w.preload),
                            "pss_kb": w.pss_kb,
                            "idle_s": w.idle_s,
                        }
                        for w in n.warm
                    ],
                    "ranks": [_rank_json(r) for r in n.ranks],
                }
                for n in self.nodes
            ],
        }


def _gpu_json(g: GpuView) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "utilization_percent": g.utilization_percent,
        "memory_used_mib": g.memory_used_mib,
        "memory_total_mib": g.memory_total_mib,
        "used": g.used,
        "ranks": list(g.ranks),
    }


def _rank_json(r: RankView) -> dict[str, Any]:
    return {
        "rank": r.rank,
        "pids": list(r.pids),
        "cpu_percent": r.cpu_percent,
        "rss_bytes": r.rss_bytes,
        "lines": r.lines,
        "lines_per_s": r.lines_per_s,
        "idle_s": r.idle_s,
        "age_s": r.age_s,
        "gpus": list(r.gpus),
        "gpu_memory_mib": r.gpu_memory_mib,
        "talks": r.talks,
        "behind": r.behind,
    }


def pick_job(store: JobDB, job_id: str | None) -> JobRecord:
    """The job to watch: the one named, or the newest that has not ended.

    Raises:
        InputError: no such job, it has ended, or (none named) no job runs.
    """
    if job_id is None:
        record = next((r for r in store.jobs() if not r.state.is_terminal()), None)
        if record is None:
            raise InputError(
                f"no running job to watch (in {store.path})",
                "start one with: orch submit -d JOB.yaml; past jobs: orch status",
            )
        return record
    record = store.get(job_id)
    if record.state.is_terminal():
        raise ended_error(record)
    return record


def ended_error(record: JobRecord) -> InputError:
    return InputError(
        f"job {record.id} has ended ({record.state.value}): there is nothing to watch",
        f"what it printed: orch logs {record.id}; how it ended: orch status {record.id}",
    )


@dataclass(frozen=True)
class HostSample:
    """One host of a job at one refresh of `orch top`, as a page draws it over time:
    the job's processes there (CPU, of one core each: 200 is two busy cores, and
    memory) and the host's GPUs (None: no nvidia-smi there)."""

    time: float
    job_id: str
    host: str
    state: str
    cpu_percent: float | None
    rss_bytes: int
    ranks: int
    gpus: tuple[GpuView, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time,
            "job": self.job_id,
            "host": self.host,
            "state": self.state,
            "cpu_percent": self.cpu_percent,
            "rss_bytes": self.rss_bytes,
            "ranks": self.ranks,
            "gpus": None if self.gpus is None else [_gpu_json(g) for g in self.gpus],
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> HostSample:
        gpus = row.get("gpus")
        return cls(
            time=float(row["time"]),
            job_id=str(row.get("job") or ""),
            host=str(row.get("host") or ""),
            state=str(row.get("state") or ""),
            cpu_percent=None if row.get("cpu_percent") is None else float(row["cpu_percent"]),
            rss_bytes=int(row.get("rss_bytes") or 0),
            ranks=int(row.get("ranks") or 0),
            gpus=None
            if gpus is None
            else tuple(
                GpuView(
                    g.get("index"),
                    str(g.get("uuid") or ""),
                    g.get("utilization_percent"),
                    g.get("memory_used_mib"),
                    g.get("memory_total_mib"),
                    bool(g.get("used")),
                    tuple(g.get("ranks") or ()),
                )
                for g in gpus
            ),
        )


def host_samples(view: TopView) -> list[HostSample]:
    """Each node of a refresh, summed over its ranks and launcher. The first refresh
    has no rates yet: its CPU is None."""
    samples = []
    for node in view.nodes:
        cpus = [r.cpu_percent for r in node.ranks]
        cpus.append(node.launcher_cpu_percent)
        known = [c for c in cpus if c is not None]
        samples.append(
            HostSample(
                time=view.time,
                job_id=view.job_id,
                host=node.host,
                state=node.state,
                cpu_percent=sum(known) if known else None,
                rss_bytes=node.launcher_rss_bytes + sum(r.rss_bytes for r in node.ranks),
                ranks=sum(1 for r in node.ranks if r.rank is not None),
                gpus=node.gpus,
            )
        )
    return samples
