"""Every recorded job as the page lists it, read from the records each refresh
(`api.statuses(ask_hosts=False)`: no host asked, a few milliseconds), and the jobs
that nothing follows brought up to date with their hosts now and then (`api.statuses`
of each), so that a detached job that ended shows as ended.

A job the page follows (its feed) needs no such asking: the follow records its nodes'
ends as they come, as `orch logs -f` does.
"""

from __future__ import annotations

import getpass
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator import api
from orchestrator.api import JobState, JobStatus, NodeStatus
from orchestrator.api.errors import OrchError

log = logging.getLogger(__name__)

RECONCILE_EVERY_S = 10.0
PLACES_EVERY_S = 3.0


def status_json(status: JobStatus, user: str, place: str | None = None) -> dict[str, Any]:
    """A job as the page draws it (the list's row and the job page's header). No
    duration: the page counts it from `started`, so that a running job's row changes
    only when the job does (and the list is sent again only then)."""
    spec = status.spec
    return {
        "id": status.id,
        "name": status.name,
        "state": status.state.value,
        "note": status.note,
        "place": place,
        "user": user,
        "created": status.created,
        "started": status.started,
        "ended": status.ended,
        "exit_code": status.exit_code,
        "attempt": status.attempt,
        "restarts": status.restarts,
        "earlier": [
            {"attempt": e.attempt, "nodes": {h: s.value for h, s in e.nodes.items()}}
            for e in status.earlier
        ],
        "master": f"{status.master_addr}:{status.master_port}" if status.master_port else "",
        "nodes": [
            {
                "host": n.host,
                "address": n.address,
                "node_rank": n.node_rank,
                "ranks": [n.ranks.start, n.ranks.stop],
                "state": _node_state(status, n),
                "exit_code": n.exit_code,
                "signal": n.signal,
                "error": n.error,
            }
            for n in status.nodes
        ],
        "ranks": sum(len(n.ranks) for n in status.nodes),
        "backend": spec.get("backend") or "ssh",
        "path": spec.get("path"),
        "entry": spec.get("entry"),
        "args": list(spec.get("args") or ()),
        "workdir": spec.get("workdir"),
        "outputs": list(spec.get("outputs") or ()),
        "metrics": list(spec.get("metrics") or ()),
    }


def _node_state(status: JobStatus, node: NodeStatus) -> str:
    """A node's state; one still running, as its record says, in a job that has ended is
    lost: its host never answered again (the record keeps the last state it knew)."""
    if status.state.is_terminal() and not node.state.is_terminal():
        return JobState.LOST.value
    return node.state.value


class Board:
    """The jobs page's rows, and a version that changes when any row does.

    Args:
        following: the jobs followed now (their records need no asking of hosts).
    """

    def __init__(self, following: Callable[[], set[str]]) -> None:
        self.user = getpass.getuser()
        self.rows: list[dict[str, Any]] = []
        self.version = 0
        self.error: str | None = None
        self._following = following
        self._text = ""
        self._places: dict[str, str] = {}
        self._places_at = 0.0
        self._reconciled_at = 0.0
        self._reconciling = threading.Lock()
        self._asked: dict[str, tuple[float, JobStatus]] = {}

    def refresh(self) -> None:
        """Read the records again; now and then, ask the hosts of jobs nothing follows."""
        try:
            found = api.statuses(ask_hosts=False)
        except OrchError as exc:
            self.error = exc.message
            return
        self.error = None
        now = time.monotonic()
        # Where the hosts were asked of a job that has not ended, their answer is the
        # fresher (a node whose host does not answer is lost in it, not in the record).
        found = [
            asked[1]
            if not s.state.is_terminal()
            and (asked := self._asked.get(s.id)) is not None
            and now - asked[0] < 2 * RECONCILE_EVERY_S
            else s
            for s in found
        ]
        rows = [status_json(s, self.user, self._places.get(s.id)) for s in found]
        text = json.dumps(rows, sort_keys=True, default=str)
        if text != self._text:
            self._text, self.rows = text, rows
            self.version += 1
        # Where a job waits in line, and how a job nothing follows stands, are asked of
        # the hosts: in a thread of their own, never holding up the next refresh.
        pending = [s.id for s in found if s.state is JobState.PENDING]
        unsettled = [s.id for s in found if not s.state.is_terminal()]
        places_due = bool(pending) and now - self._places_at > PLACES_EVERY_S
        reconcile_due = bool(unsettled) and now - self._reconciled_at > RECONCILE_EVERY_S
        if (places_due or reconcile_due) and not self._reconciling.locked():
            if places_due:
                self._places_at = now
            if reconcile_due:
                self._reconciled_at = now
            threading.Thread(
                target=self._ask_hosts,
                args=(pending if places_due else [], unsettled if reconcile_due else []),
                name="ui-hosts-of-jobs",
                daemon=True,
            ).start()

    def row(self, job_id: str) -> dict[str, Any] | None:
        return next((r for r in self.rows if r["id"] == job_id), None)

    def _ask_hosts(self, pending: list[str], unsettled: list[str]) -> None:
        if not self._reconciling.acquire(blocking=False):
            return
        try:
            if pending:
                try:
                    self._places = api.places(pending)
                except OrchError:
                    log.debug("places failed", exc_info=True)
            followed = self._following()
            for job_id in unsettled:
                if job_id not in followed:
                    try:
                        (asked,) = api.statuses(job_id)
                    except OrchError:
                        log.debug("[job=%s] status failed", job_id, exc_info=True)
                        continue
                    self._asked[job_id] = (time.monotonic(), asked)
        finally:
            self._reconciling.release()
