"""Following a running job: every node's log records, merged into one event queue.

One thread per node reads its supervisor's `follow` stream over the node's existing
connection. Lines of one rank arrive in the rank's own order; ranks and hosts
interleave as they print.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.hosts import HostGroup
from orchestrator.launch import follow_command
from orchestrator.models.errors import OrchError
from orchestrator.plan import LaunchPlan, NodeLaunch
from orchestrator.transport import RemoteProcess

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LineEvent:
    """One line of output: from a rank (global rank), or from the node's torchrun (None)."""

    host: str
    rank: int | None
    text: str


@dataclass(frozen=True)
class NodeExit:
    """How a node ended. `returncode` is None when it is unknown (host lost)."""

    host: str
    node_rank: int
    returncode: int | None
    killed: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


Event = LineEvent | NodeExit


class Watcher:
    """Streams the events of every node of a plan until each node has exited."""

    def __init__(self, plan: LaunchPlan, group: HostGroup) -> None:
        self.plan = plan
        self.group = group
        self._queue: queue.Queue[Event] = queue.Queue()
        self._procs: dict[str, RemoteProcess] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._threads = [
            threading.Thread(
                target=self._follow, args=(node,), name=f"follow-{node.host.name}", daemon=True
            )
            for node in plan.nodes
        ]
        for thread in self._threads:
            thread.start()

    def _follow(self, node: NodeLaunch) -> None:
        name = node.host.name
        try:
            proc = self.group.transports[name].stream(follow_command(node))
        except OrchError as exc:
            self._queue.put(NodeExit(name, node.node_rank, None, error=exc.message))
            return
        with self._lock:
            self._procs[name] = proc
            if self._closed:
                proc.close()
        for raw in proc.lines():
            try:
                record = json.loads(raw)
            except ValueError:
                log.debug("[host=%s] not a follow record: %r", name, raw)
                continue
            if record.get("k") == "line":
                stream = record.get("s")
                rank = int(stream) if isinstance(stream, str) and stream.isdigit() else None
                self._queue.put(LineEvent(name, rank, str(record.get("t", ""))))
            elif record.get("k") == "exit":
                self._queue.put(
                    NodeExit(
                        name,
                        node.node_rank,
                        record.get("returncode"),
                        bool(record.get("killed")),
                        record.get("error"),
                    )
                )
                return
        if not self._closed:
            self._queue.put(
                NodeExit(name, node.node_rank, None, error="lost the connection while following")
            )

    def events(self) -> Iterator[Event]:
        """Every event, until all nodes exited. Short waits keep Ctrl-C responsive."""
        remaining = {n.host.name for n in self.plan.nodes}
        while remaining:
            try:
                event = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if isinstance(event, NodeExit):
                remaining.discard(event.host)
            yield event

    def close(self) -> None:
        """Stop following; the job itself goes on."""
        with self._lock:
            self._closed = True
            procs = list(self._procs.values())
        for proc in procs:
            proc.close()
