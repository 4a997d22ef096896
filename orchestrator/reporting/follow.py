"""Following a running job: every node's output, merged into one event queue.

One thread per node reads its supervisor's `follow` stream over the node's existing
connection: framed chunks of complete lines (and of a progress bar's redraws, before
its line ends), each at its byte offset in the host's file. Chunks go to the local
log mirror first, then to the queue, so what the user saw is always on disk too.
Lines of one rank arrive in the rank's own order.

A stream that breaks or stays silent (the supervisor sends a heartbeat every 2 s)
does not end anything by itself: the node's thread opens a fresh connection, again
and again, and follows on from the byte offsets it holds, so no line is lost or
doubled. Whether a silent host is lost, or the controller itself was away (asleep,
paused, off the network), is `contact.judge`'s call, made in `events()`. With
`once` (`orch logs`), a silent host is simply reported lost.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from orchestrator.agent.kernel.fileio import describe_error
from orchestrator.agent.kernel.replies import ExitRecord, StatusReply
from orchestrator.models.errors import OrchError, Refused
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.ops import NodeRef, follow_command
from orchestrator.records.logmirror import LogMirror, rank_of
from orchestrator.reporting.contact import Contact, StallClock, judge
from orchestrator.transport import RemoteProcess, Transport

log = logging.getLogger(__name__)
IDLE_TIMEOUT_S = 12.0  # `once`: six missed heartbeats, the host is gone
QUIET_AFTER_S = 5.0  # following: silent this long, a fresh connection is tried
RETRY_MAX_S = 1.0  # between fresh connection attempts, at most
EMPTY_STREAMS = 3  # streams in a row that ended with no record: the host cannot follow
# Silent hosts are judged this often (and Ctrl-C, which interrupts the wait, is seen at
# once): each judgement looks at every host, 5 a second cost a 32-host launch 0.2 s.
JUDGE_EVERY_S = 0.5
Reconnect = Callable[[Host], Transport]


@dataclass(frozen=True)
class Output:
    """The next bytes of one stream: a rank (global rank), or the node's torchrun (None).

    Complete lines, or the redraws of a progress bar whose line goes on (`Reporter`)."""

    host: str
    rank: int | None
    data: bytes


@dataclass(frozen=True)
class NodeExit:
    """How a node's stream ended.

    `ended` is how the node ended, as its host recorded it. None means the host could
    not say: either it was lost (`lost`, and `error` says how), or, with --once, the
    node has not ended yet (`drained`).
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


@dataclass(frozen=True)
class Notice:
    """Something the user should know about the following itself (stderr)."""

    message: str


Event = Output | NodeExit | Notice


class Watcher:
    """Streams the output of nodes until each has ended (or, `once`, is drained).

    Args:
        transports: the hosts' connections; a fresh one replaces a silent one here.
        reconnect: opens a fresh connection to a host and puts it in `transports` in
            place of the old one (HostGroup.fresh; None: never, and a silent host is
            then lost, as with `once`).
        lost_after: per host, seconds of confirmed silence before it is lost.
    """

    def __init__(
        self,
        nodes: Sequence[NodeRef],
        transports: Mapping[str, Transport],
        mirror: LogMirror | None = None,
        once: bool = False,
        idle_timeout: float = IDLE_TIMEOUT_S,
        reconnect: Reconnect | None = None,
        lost_after: Mapping[str, float] | None = None,
    ) -> None:
        self._queue: queue.Queue[Event] = queue.Queue(maxsize=256)
        self._procs: list[RemoteProcess] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._nodes = list(nodes)
        self._mirror = mirror
        self._transports = transports
        self._reconnect = None if once else reconnect
        self._once = once
        self._idle = idle_timeout if self._reconnect is None else min(idle_timeout, QUIET_AFTER_S)
        self._lost_after = dict(lost_after or {})
        self._clock = StallClock().start()
        now = time.monotonic()
        self.contacts = {n.host.name: Contact(heard=now) for n in self._nodes}
        self._given_up: set[str] = set()
        self._offsets = {
            n.host.name: (mirror.offsets(n.host.name) if mirror else {}) for n in self._nodes
        }
        for node in self._nodes:
            threading.Thread(
                target=self._follow, args=(node,), name=f"follow-{node.host.name}", daemon=True
            ).start()

    def _follow(self, node: NodeRef) -> None:
        """Follow one node until it ends; whatever goes wrong here makes it lost, with
        the reason, never a thread that dies unheard (and a controller that waits)."""
        try:
            self._follow_node(node)
        except Exception as exc:  # any surprise ends in a report
            log.debug("[host=%s] following failed", node.host.name, exc_info=True)
            why = f"following {node.host.name} failed: {describe(exc)}"
            self._put(NodeExit(node.host.name, node.node_rank, None, error=why))

    def _follow_node(self, node: NodeRef) -> None:
        """Follow one node until it ends, through fresh connections when need be."""
        name = node.host.name
        contact = self.contacts[name]
        ended_early = 0  # streams in a row that the host ended without a record
        retried = False
        while not self._closed.is_set() and name not in self._given_up:
            heard = contact.heard
            ended, error, host_ended = self._stream(node, contact)
            if ended is not None:
                self._put(ended)
                return
            if contact.heard > heard:
                ended_early, retried = 0, False
            elif host_ended:
                ended_early += 1
            if self._reconnect is None or ended_early >= EMPTY_STREAMS:
                self._put(NodeExit(name, node.node_rank, None, error=error))
                return
            if self._clock.stalled_until >= contact.heard and not retried:
                retried = True  # this process was paused, not the host: same connection
                continue
            contact.quiet()
            self._connect_again(node.host, contact)

    def _stream(self, node: NodeRef, contact: Contact) -> tuple[NodeExit | None, str | None, bool]:
        """One follow stream from the offsets held: how the node ended; else why the
        stream stopped first (None: closed here), and whether the host ended it (not
        silence, nor a connection that failed)."""
        name = node.host.name
        try:
            proc = self._transports[name].stream(
                follow_command(node, self._offsets[name], self._once), idle_timeout=self._idle
            )
        except OrchError as exc:
            return None, exc.message, False
        with self._lock:
            self._procs.append(proc)
        if self._closed.is_set():
            proc.close()
        try:
            ended = self._read(node, proc.stdout, contact)
            return ended, self._lost_connection(name), True
        except TimeoutError:
            return None, f"no answer from {name} for {self._idle:.0f} s", False
        finally:
            proc.close()
            with self._lock:
                self._procs.remove(proc)

    def _lost_connection(self, name: str) -> str | None:
        return None if self._closed.is_set() else f"lost the connection to {name}"

    def _connect_again(self, host: Host, contact: Contact) -> None:
        """Try fresh connections until one works (it replaces the old one), the node is
        given up, or following stops."""
        assert self._reconnect is not None
        delay = 0.25
        while not self._closed.is_set() and host.name not in self._given_up:
            started = time.monotonic()
            try:
                self._reconnect(host)
            except OrchError as exc:
                log.debug("[host=%s] fresh connection failed: %s", host.name, exc.message)
                contact.attempt_failed(started, exc.what, isinstance(exc, Refused))
                self._closed.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            contact.back(time.monotonic())
            return

    def _read(self, node: NodeRef, stdout: IO[bytes], contact: Contact) -> NodeExit | None:
        """Read records until the stream's last one: how the node ended, or None when
        the stream broke first."""
        name = node.host.name
        while header := stdout.readline():
            contact.hear(time.monotonic())
            try:
                record = json.loads(header)
            except ValueError:
                record = None
            if not isinstance(record, dict):  # a shell rc file's chatter, say
                log.debug("[host=%s] not a follow record: %r", name, header[:200])
                continue
            kind = record.get("k")
            if kind == "data" and not self._data(name, record, stdout):
                break
            if kind == "exit":
                ended = agent.parse(node.host, ExitRecord, record)
                return NodeExit(name, node.node_rank, ended)
            if kind == "end":
                status = agent.parse(node.host, StatusReply, record)
                return NodeExit(name, node.node_rank, status.ended, drained=True)
        return None

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
        stream, offset = str(record["s"]), int(record["o"])
        if offset + size <= self._offsets[name].get(stream, 0):
            return True  # had it already (a stream cut short, followed again)
        if self._mirror is not None:
            self._mirror.write(name, stream, offset, data)
        self._offsets[name][stream] = offset + size
        self._put(Output(name, rank_of(stream), data))
        return True

    def _put(self, event: Event) -> None:
        while not self._closed.is_set():
            try:
                self._queue.put(event, timeout=0.2)
                return
            except queue.Full:
                continue

    def events(self) -> Iterator[Event]:
        """Every event, until all nodes ended; lost nodes as `contact.judge` finds them,
        every JUDGE_EVERY_S."""
        remaining = {n.host.name for n in self._nodes}
        ranks = {n.host.name: n.node_rank for n in self._nodes}
        outage, stalls = False, 0
        outage_ended = 0.0  # silence before this was the network here, no host's
        back = True  # since the last outage, some host answered again
        judged = 0.0
        while remaining:
            try:
                event = self._queue.get(timeout=JUDGE_EVERY_S)
            except queue.Empty:
                event = None
            if isinstance(event, NodeExit):
                if event.host not in remaining:
                    continue  # already given up
                remaining.discard(event.host)
            if event is not None:
                yield event
            if self._reconnect is None:
                continue
            if self._clock.stalls > stalls:
                stalls = self._clock.stalls
                if self._clock.stalled_for >= 2 * QUIET_AFTER_S:
                    yield Notice(
                        f"this process did not run for {self._clock.stalled_for:.0f} s "
                        "(a closed lid? Ctrl-Z?): the job kept running; following on"
                    )
            if time.monotonic() - judged < JUDGE_EVERY_S:
                continue  # judging every host on every line of output costs the most
            judged = time.monotonic()
            followed = {n: c for n, c in self.contacts.items() if n in remaining}
            if not back and any(c.following for c in followed.values()):
                back, outage_ended = True, time.monotonic()  # the network is back: count anew
            away_until = max(self._clock.stalled_until, outage_ended)
            ended = {
                n: c
                for n, c in self.contacts.items()
                if n not in remaining and n not in self._given_up
            }
            verdict = judge(time.monotonic(), followed, self._lost_after, away_until, ended)
            for name, why in verdict.lost.items():
                self._given_up.add(name)
                remaining.discard(name)
                yield NodeExit(name, ranks[name], None, error=why)
            if verdict.outage and not outage:
                outage, back = True, False
                yield Notice(
                    "lost contact with every host (the network here?): reconnecting; "
                    "the job keeps running"
                )
            elif outage and all(c.following for c in followed.values()):
                outage = False
                yield Notice("in contact with every host again: following the job")

    def close(self) -> None:
        """Stop following; the job itself goes on."""
        self._closed.set()
        self._clock.stop()
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            proc.close()


def describe(exc: BaseException) -> str:
    """An error in words, with the module of a library's own error type (`zlib error`)."""
    if isinstance(exc, OrchError):
        return exc.message
    if isinstance(exc, OSError):
        return describe_error(exc)
    kind = type(exc)
    where = "" if kind.__module__ == "builtins" else f"{kind.__module__} "
    return f"{where}{kind.__name__}: {exc}"


def _read_exact(stdout: IO[bytes], size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = stdout.read(size)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
