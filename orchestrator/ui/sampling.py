"""The hosts over time: while a page is open, every running job is sampled as `orch
top` samples it (`watch.top(keep=True)`, which keeps each refresh in the job's
records), and the hosts of the inventories the page was given are asked who holds
what, who waits, and which warm interpreters wait (`cluster.hosts`).

The last hour of samples is read back from the records (`watch.samples`), so that a
page opened later, or again, draws the hour it missed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from orchestrator.api import cluster, watch
from orchestrator.api.errors import OrchError

log = logging.getLogger(__name__)

BUCKET_S = 10.0  # the hosts' history, in steps of this
# Between two samples of a job (orch top's default is 2 s): one per step of the history;
# more would draw nothing more.
SAMPLE_S = BUCKET_S
RETRY_S = 30.0  # after a sampler failed (its hosts down)
HOSTS_EVERY_S = 15.0


class Samplers:
    """One `watch.top` per running job, while `wanted()` says a page is open."""

    def __init__(self, wanted: Callable[[], bool]) -> None:
        self._wanted = wanted
        self._threads: dict[str, threading.Thread] = {}
        self._failed: dict[str, float] = {}
        self._latest: dict[str, watch.TopView] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def ensure(self, running: Sequence[str]) -> None:
        """Sample each of these jobs (their full ids), unless being sampled already."""
        now = time.monotonic()
        with self._lock:
            for job_id in running:
                thread = self._threads.get(job_id)
                if thread is not None and thread.is_alive():
                    continue
                if now - self._failed.get(job_id, -math.inf) < RETRY_S:
                    continue
                thread = threading.Thread(
                    target=self._sample, args=(job_id,), name=f"ui-top-{job_id}", daemon=True
                )
                self._threads[job_id] = thread
                thread.start()

    def latest(self, job_id: str) -> watch.TopView | None:
        with self._lock:
            return self._latest.get(job_id)

    def close(self) -> None:
        self._stop.set()

    def _sample(self, job_id: str) -> None:
        try:
            for view in watch.top(job_id, SAMPLE_S, keep=True):
                with self._lock:
                    self._latest[job_id] = view
                if self._stop.is_set() or not self._wanted() or view.ended:
                    return
        except OrchError as exc:
            log.debug("[job=%s] sampling stopped: %s", job_id, exc.message)
            with self._lock:
                self._failed[job_id] = time.monotonic()


def history(job_ids: Sequence[str]) -> dict[str, Any]:
    """The last hour of these jobs' samples, per host, in BUCKET_S steps: the time of
    each step, and per host its jobs' CPU (percent of one core, summed over the jobs),
    memory (bytes, summed) and GPU use (percent, the mean of its GPUs); None where the
    host was not sampled."""
    cells: dict[str, dict[int, dict[str, float]]] = {}
    for job_id in job_ids:
        try:
            samples = watch.samples(job_id)
        except OrchError:
            continue
        per_bucket: dict[tuple[str, int], list[watch.HostSample]] = {}
        for s in samples:
            per_bucket.setdefault((s.host, int(s.time // BUCKET_S)), []).append(s)
        for (host, bucket), group in per_bucket.items():
            cell = cells.setdefault(host, {}).setdefault(bucket, {"cpu": 0.0, "mem": 0.0})
            cpus = [s.cpu_percent for s in group if s.cpu_percent is not None]
            if cpus:
                cell["cpu"] += sum(cpus) / len(cpus)
            cell["mem"] += sum(s.rss_bytes for s in group) / len(group)
            utils = [
                g.utilization_percent
                for s in group
                for g in s.gpus or ()
                if g.utilization_percent is not None
            ]
            if utils:
                cell["gpu"] = max(cell.get("gpu", 0.0), sum(utils) / len(utils))
    buckets = sorted({b for per_host in cells.values() for b in per_host})
    return {
        "time": [b * BUCKET_S for b in buckets],
        "hosts": {
            host: {
                key: [per_host.get(b, {}).get(key) for b in buckets]
                for key in ("cpu", "mem", "gpu")
            }
            for host, per_host in sorted(cells.items())
        },
    }


class ClusterView:
    """What the inventories' hosts hold, asked every HOSTS_EVERY_S while a page shows
    them: each GPU or slot and who holds it, the waiting line, the warm interpreters,
    and the hosts that did not answer."""

    def __init__(self, inventories: Sequence[Path | None]) -> None:
        self.inventories = list(inventories) or [None]
        self.found: list[dict[str, Any]] = []
        self.version = 0
        self._asked_at = -math.inf
        self._asking = threading.Lock()

    def refresh(self) -> None:
        """Ask again, in a thread of its own, when the last answer is old."""
        if time.monotonic() - self._asked_at < HOSTS_EVERY_S:
            return
        if not self._asking.acquire(blocking=False):
            return
        self._asked_at = time.monotonic()
        threading.Thread(target=self._ask, name="ui-hosts", daemon=True).start()

    def _ask(self) -> None:
        try:
            found: list[dict[str, Any]] = []
            for inventory in self.inventories:
                name = str(inventory) if inventory else "(default inventory)"
                try:
                    view = cluster.hosts(inventory)
                except OrchError as exc:
                    found.append({"inventory": name, "error": exc.message, "hint": exc.hint})
                    continue
                found.append(
                    {
                        "inventory": name,
                        **view.as_json(),
                        "lost": [
                            {"host": e.host, "error": e.message, "hint": e.hint}
                            for e in view.errors
                        ],
                    }
                )
            self.found = found
            self.version += 1
        finally:
            self._asked_at = time.monotonic()
            self._asking.release()
