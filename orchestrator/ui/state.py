"""What the server knows while it runs, refreshed by one thread (`Ticker`) only while a
page looks: the jobs' rows, each shown job's feed and curves, the samplers of running
jobs and the inventories' hosts. Pages read it; nothing here waits on a page.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.api import curves
from orchestrator.api.errors import OrchError
from orchestrator.ui.board import Board
from orchestrator.ui.feeds import Feeds
from orchestrator.ui.sampling import ClusterView, Samplers

log = logging.getLogger(__name__)

TICK_S = 0.5
CURVES_EVERY_S = 1.0
BOARD_EVERY_S = 1.0
LOOKING_S = 15.0  # a page that has not asked for this long is gone
MAX_POINTS = 400_000  # a job's points the page holds; the CSV has them all


class CurveStore:
    """One job's points, read on as its ranks print (`api.curves`)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.points: list[list[Any]] = []  # [rank, name, step, time, value, host]
        self.truncated = False
        self.read_at = time.monotonic()
        self._reader = curves.curves(job_id)
        self._lock = threading.Lock()

    def refresh(self) -> None:
        found = self._reader.read()
        if not found:
            return
        with self._lock:
            room = MAX_POINTS - len(self.points)
            if len(found) > room:
                found, self.truncated = found[: max(room, 0)], True
            self.points.extend([p.rank, p.name, p.step, p.time, p.value, p.host] for p in found)

    def since(self, index: int) -> tuple[list[list[Any]], int]:
        with self._lock:
            self.read_at = time.monotonic()
            return self.points[index:], len(self.points)


class UiState:
    """The server's state.

    Args:
        inventories: the inventories whose hosts the page shows (`-i`; none: the
            default one).
    """

    def __init__(self, inventories: Sequence[Path]) -> None:
        self.feeds = Feeds()
        self.board = Board(self.feeds.following)
        self.samplers = Samplers(self.page_open)
        self.cluster = ClusterView(list(inventories))
        self._curves: dict[str, CurveStore] = {}
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._curves_at = 0.0
        self._board_at = 0.0
        self._thread = threading.Thread(target=self._tick, name="ui-ticker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.feeds.close()
        self.samplers.close()

    def touch(self, what: str) -> None:
        """A page looks at `what` ("jobs", "hosts", "job:ID")."""
        with self._lock:
            self._seen[what] = time.monotonic()

    def page_open(self) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(now - t < LOOKING_S for t in self._seen.values())

    def looking_at(self, what: str) -> bool:
        with self._lock:
            return time.monotonic() - self._seen.get(what, -LOOKING_S) < LOOKING_S

    def curves_of(self, job_id: str) -> CurveStore:
        """The curves of a job (its full id), read on while a page shows them.

        Raises:
            InputError: no such job.
        """
        with self._lock:
            store = self._curves.get(job_id)
        if store is None:
            store = CurveStore(job_id)
            store.refresh()
            with self._lock:
                store = self._curves.setdefault(job_id, store)
        return store

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            if not self.page_open():
                continue
            try:
                self._once()
            except Exception:  # the ticker must outlive any one surprise
                log.warning("ui refresh failed", exc_info=True)

    def _once(self) -> None:
        now = time.monotonic()
        # The jobs list is read each tick while a page lists the jobs (a new job shows
        # within a second), else each second: a job's page wants only its own changes.
        if self.looking_at("jobs") or now - self._board_at >= BOARD_EVERY_S:
            self._board_at = now
            self.board.refresh()
        self.feeds.sweep()
        running = [r["id"] for r in self.board.rows if r["state"] == "running"]
        self.samplers.ensure(running)
        if self.looking_at("hosts"):
            self.cluster.refresh()
        if now - self._curves_at >= CURVES_EVERY_S:
            self._curves_at = now
            with self._lock:
                stores = list(self._curves.items())
            for job_id, store in stores:
                if now - store.read_at > LOOKING_S:
                    with self._lock:
                        self._curves.pop(job_id, None)
                    continue
                try:
                    store.refresh()
                except OrchError:
                    log.debug("[job=%s] curves failed", job_id, exc_info=True)
