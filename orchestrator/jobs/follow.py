"""Following a running job: every node's output, merged into one event queue.

One thread per node reads its supervisor's `follow` stream over the node's existing
connection: framed chunks of complete lines, each at its byte offset in the host's
file. Chunks go to the local log mirror first, then to the queue, so what the user
saw is always on disk too. Lines of one rank arrive in the rank's own order.

A node whose stream stays silent past the idle timeout (the supervisor sends a
heartbeat every 2 s) or breaks is reported as lost: its host stopped answering.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from orchestrator.agent.protocol import ExitRecord, NodeStatus
from orchestrator.models.errors import OrchError
from orchestrator.nodes import agent
from orchestrator.nodes.ops import NodeRef, follow_command
from orchestrator.records.logmirror import LogMirror, rank_of
from orchestrator.transport import RemoteProcess, Transport

log = logging.getLogger(__name__)
IDLE_TIMEOUT_S = 12.0  # six missed heartbeats: the host is gone


@dataclass(frozen=True)
class Output:
    """Complete lines from one stream: a rank (global rank), or the node's torchrun (None)."""

    host: str
    rank: int | None
    data: bytes


@dataclass(frozen=True)
class NodeExit:
    """How a node's stream ended.

    `ended` is how the node ended, as its host recorded it. None means the host could
    not say: either it was lost (the stream broke or went silent: `lost`, and `error`
    says how), or, with --once, the node has not ended yet (`drained`).
    """

    host: str
    node_rank: int
    ended: ExitRecord | None
    error: str | None = None  # how the host was lost
    drained: bool = False  # --once: the stream stopped because it had sent everything

    @property
    def lost(self) -> bool:
        return self.ended is None and not self.drained

    @property
    def returncode(self) -> int | None:
        return None if self.ended is None else self.ended.returncode

    @property
    def killed(self) -> bool:
        return self.ended is not None and self.ended.killed

    @property
    def reason(self) -> str | None:
        """Why the outcome is unknown, when it is: the host's word, or how it was lost."""
        return self.error if self.ended is None else self.ended.error

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.killed


Event = Output | NodeExit


class Watcher:
    """Streams the output of nodes until each has ended (or, `once`, is drained)."""

    def __init__(
        self,
        nodes: Sequence[NodeRef],
        transports: Mapping[str, Transport],
        mirror: LogMirror | None = None,
        once: bool = False,
        idle_timeout: float = IDLE_TIMEOUT_S,
    ) -> None:
        self._queue: queue.Queue[Event] = queue.Queue(maxsize=256)
        self._procs: list[RemoteProcess] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._nodes = list(nodes)
        self._mirror = mirror
        for node in self._nodes:
            transport = transports[node.host.name]
            args = (node, transport, once, idle_timeout)
            threading.Thread(
                target=self._follow, args=args, name=f"follow-{node.host.name}", daemon=True
            ).start()

    def _follow(self, node: NodeRef, transport: Transport, once: bool, idle_timeout: float) -> None:
        name = node.host.name
        offsets = self._mirror.offsets(name) if self._mirror else {}
        try:
            proc = transport.stream(follow_command(node, offsets, once), idle_timeout=idle_timeout)
        except OrchError as exc:
            self._put(NodeExit(name, node.node_rank, None, error=exc.message))
            return
        with self._lock:
            self._procs.append(proc)
        if self._closed.is_set():
            proc.close()
        try:
            self._put(self._read(node, proc.stdout))
        except TimeoutError:
            self._put(
                NodeExit(
                    name,
                    node.node_rank,
                    None,
                    error=f"no answer from {name} for {idle_timeout:.0f} s",
                )
            )

    def _read(self, node: NodeRef, stdout: IO[bytes]) -> NodeExit:
        """Read records until the stream's last one; returns how the node ended."""
        name = node.host.name
        while header := stdout.readline():
            try:
                record = json.loads(header)
            except ValueError:
                log.debug("[host=%s] not a follow record: %r", name, header[:200])
                continue
            kind = record.get("k")
            if kind == "data" and not self._data(name, record, stdout):
                break
            if kind == "exit":
                ended = agent.parse(node.host, ExitRecord, record)
                return NodeExit(name, node.node_rank, ended)
            if kind == "end":
                status = agent.parse(node.host, NodeStatus, record)
                return NodeExit(name, node.node_rank, status.ended, drained=True)
        error = None if self._closed.is_set() else f"lost the connection to {name}"
        return NodeExit(name, node.node_rank, None, error=error)

    def _data(self, name: str, record: dict[str, Any], stdout: IO[bytes]) -> bool:
        """Take a data record's bytes into the mirror and the queue; False when the
        stream broke in the middle of them."""
        size = int(record["n"])
        wire = int(record.get("z") or size)
        data = _read_exact(stdout, wire)
        if len(data) < wire:
            return False
        if "z" in record:
            data = zlib.decompress(data)
        if len(data) != size:
            log.warning("[host=%s] corrupt log chunk: %d bytes, expected %d", name, len(data), size)
            return False
        if self._mirror is not None:
            self._mirror.write(name, record["s"], int(record["o"]), data)
        self._put(Output(name, rank_of(str(record["s"])), data))
        return True

    def _put(self, event: Event) -> None:
        while not self._closed.is_set():
            try:
                self._queue.put(event, timeout=0.2)
                return
            except queue.Full:
                continue

    def events(self) -> Iterator[Event]:
        """Every event, until all nodes ended. Short waits keep Ctrl-C responsive."""
        remaining = {n.host.name for n in self._nodes}
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
        self._closed.set()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            proc.close()


def _read_exact(stdout: IO[bytes], size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = stdout.read(size)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
