"""The push itself: each host gets what it lacks and builds the job's snapshot.

Per host, in parallel (see sync.py for the whole design):

1. The controller recalls which objects it pushed to the host before. A host it knows
   nothing of is asked what it lacks, in a first round trip that already carries the
   first few MB (most such hosts lack everything), unless the tree is so small that
   it is simply sent.
2. The missing objects go in round trips of BATCH_BYTES; while one is on the wire,
   the next one is read and compressed. The last one also carries the manifest (when
   the host may lack it) and the snapshot request.
3. The host answers with the objects it still lacks (the controller's memory was
   stale: a gc ran, another controller pushed, the disk was wiped); those go next.
   Unchanged code is one round trip that sends nothing but the check.

With a `Relay` (relay.py), the laptop's link carries each object once: the
controller pushes to the seed host as above, while it serves what it gets to the
others, which fetch in one round trip that carries no content.
"""

from __future__ import annotations

import functools
import itertools
import logging
import secrets
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from orchestrator.agent.kernel import framing, layout
from orchestrator.agent.kernel.replies import SyncReply
from orchestrator.agent.kernel.requests import PushHeader, RelayOrder, SnapshotRequest
from orchestrator.models.errors import (
    HostError,
    InfraError,
    InputError,
    MultiHostError,
)
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.sync import wire
from orchestrator.sync.manifest import HostMemory, Tree
from orchestrator.sync.relay import Relay, RelayServer, relayed_hosts
from orchestrator.sync.store import host_key, snapshot_retention
from orchestrator.transport import Transport

ROUND_TRIP_TIMEOUT_S = 600.0
# Raw bytes per round trip: the first, then every later one. The first is
# small: a host's answer to a question, and the first progress, come back quickly.
# Later ones are big: each round trip starts a process on the host and drains the
# pipeline while the host answers, which hosts that share a machine (or a busy
# controller) feel. A round trip's frames are not copied per host: hosts in step send
# the piece cache's own bytes. Each host holds its batch and the next one, encoded;
# while the cache has room (wire.CACHE_LIMIT_BYTES) those are shared by all hosts.
BATCH_BYTES = (4 << 20, 64 << 20)
PROGRESS_EVERY_S = 0.1  # within a round trip
ASK_FIRST_BYTES = 1 << 20  # a host orch knows nothing of is asked what it lacks first
MAX_ATTEMPTS = 4
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PushProgress:
    """How far the push to one host is: content objects (files) and their raw bytes."""

    host: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    finished: bool = False


@dataclass(frozen=True)
class PushResult:
    """What one host's push cost, and whether setup already ran for this code there."""

    host: str
    files_sent: int
    bytes_sent: int  # raw bytes of the content sent
    wire_bytes: int  # bytes on the wire, after compression
    round_trips: int
    setup_done: bool
    relayed: int = 0  # objects the host fetched from the seed host's relay
    relayed_bytes: int = 0
    env_python: str | None = None  # the job's environment's python, where it is built


Progress = Callable[[PushProgress], None]


def push(
    group: HostGroup,
    tree: Tree,
    job_dirs: Mapping[str, str],
    setup_keys: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    keep: int | None = None,
    memory: HostMemory | None = None,
    shares: Mapping[str, Sequence[str]] | None = None,
    relay: Relay | None = None,
    env: str | None = None,
) -> dict[str, PushResult]:
    """Push `tree` to every host named in `job_dirs`, in parallel, and build each one's
    snapshot at `<job dir>/code` (with the agent beside it).

    Args:
        group: connected hosts.
        tree: the manifest to push (`scan_workdir`).
        job_dirs: host name -> where its snapshot goes.
        setup_keys: host name -> `setup_key(...)`, to learn whether setup ran there.
        progress: called from the hosts' threads as each host's push moves on.
        keep: finished snapshots to keep per host (default: `snapshot_retention()`).
        memory: what was pushed to which host before (default: under $ORCH_HOME).
        shares: host name -> the nodes (host names) whose hosts share its filesystem
            and so its snapshot: each gets a directory beside it, linked to it, and
            the content pushed counts as theirs too.
        relay: the seed host the others fetch from, when they lack enough to be
            worth it; None pushes to every host directly.
        env: the job's environment's digest: each result says the environment's
            python where the host has it built (`env_python`).

    Returns:
        Each host's PushResult.

    Raises:
        HostError / MultiHostError: naming each host whose push failed.
        InfraError: a file changed while it was being pushed.
    """
    memory = memory or HostMemory()
    hosts = [h for h in group.hosts if h.name in job_dirs]
    plans = {h.name: HostPlan.of(tree, memory.recall(host_key(h))) for h in hosts}
    relayed = relayed_hosts(tree, plans, relay)
    cache = wire.PieceCache(tree.root)
    for name, plan in plans.items():  # a host that will be asked most likely lacks it all
        if name not in relayed:
            cache.expect(_pieces(tree, tree.objects if plan.missing is None else plan.missing))
    shared = _Shared(
        tree,
        cache,
        keep if keep is not None else snapshot_retention(),
        progress or (lambda _: None),
        env,
    )

    # Names the temporary files of each host's push: one per writer, whatever shares
    # a store (hosts on one filesystem found out or not, pushes from two laptops).
    token = secrets.token_hex(8)
    shares = shares or {}

    server = RelayServer.start(group, relay, len(relayed)) if relayed and relay else None
    if server is None:
        relayed = {}

    def one(host: Host, transport: Transport) -> PushResult:
        key = (setup_keys or {}).get(host.name)
        nodes = list(shares.get(host.name, ()))
        writer = f"{token}-{hosts.index(host)}"
        job = _HostPush(shared, host, transport, job_dirs[host.name], key, nodes, writer)
        if server is not None and host.name in relayed:
            try:
                return job.run(plans[host.name], server.request(relayed[host.name]), server.missed)
            except BaseException:
                server.all_came = False  # it may never have reached the relay
                raise
        return job.run(plans[host.name])

    try:
        results, failures = group.try_each(one, only=job_dirs)
    finally:
        if server is not None:
            server.close()
    by_name = {h.name: h for h in group.hosts}
    for host in hosts:  # in this thread: two names of one store share a memory file
        if host.name in results:
            for name in dict.fromkeys([host.name, *shares.get(host.name, ())]):
                memory.remember(host_key(by_name[name]), tree.digest, tree.objects)
    if failures:
        raise failures[0] if len(failures) == 1 else MultiHostError(failures, list(results))
    return results


@dataclass(frozen=True)
class HostPlan:
    """What the controller believes one host lacks: the diff of a tree against the
    host's remembered store."""

    missing: tuple[str, ...] | None  # object keys; None: nothing is known, ask first
    send_manifest: bool

    @staticmethod
    def of(tree: Tree, recalled: list[tuple[str, list[str]]]) -> HostPlan:
        """The plan for a host, from `HostMemory.recall()` of it."""
        if not recalled and tree.total_bytes > ASK_FIRST_BYTES:
            return HostPlan(None, True)
        known = {key for _, keys in recalled for key in keys}
        missing = tuple(key for key in tree.objects if key not in known)
        return HostPlan(missing, tree.digest not in {digest for digest, _ in recalled})


def _pieces(tree: Tree, keys: Iterable[str]) -> list[wire.Piece]:
    objects = tree.objects
    # A grafted file's source is an absolute path, which root / path leaves whole.
    return [p for k in keys for p in wire.pieces(k, tree.source(objects[k].path), objects[k].size)]


@dataclass
class _Shared:
    """What every host's push of one tree shares."""

    tree: Tree
    cache: wire.PieceCache
    keep: int
    progress: Progress
    env: str | None = None  # the job's environment's digest: the reply says if it is built

    @functools.cached_property
    def manifest_frame(self) -> bytes:
        return framing.frame(b"M", zlib.compress(self.tree.body))


class _HostPush:
    """The push to one host: round trips until its snapshot is built."""

    def __init__(
        self,
        shared: _Shared,
        host: Host,
        transport: Transport,
        job_dir: str,
        setup: str | None,
        nodes: list[str],
        token: str,
    ) -> None:
        self.shared = shared
        self.host = host
        self.transport = transport
        self.job_dir = job_dir
        self.setup = setup
        self.files = self.bytes = self.wire_bytes = self.round_trips = 0
        self.files_total = self.bytes_total = 0
        # The agent's archive goes first only where the host may lack its version.
        self.command, self.archive = agent.invocation(host, "sync")
        self.nodes = nodes
        self.token = token  # names the temporary files of this push on this host

    def run(
        self,
        plan: HostPlan,
        relay: RelayOrder | None = None,
        notice: Callable[[str], None] | None = None,
    ) -> PushResult:
        """Push until the host's snapshot is built: what it lacks fetched from the
        `relay` (an R frame's content) first when there is one, else sent directly."""
        tree = self.shared.tree
        asking = plan.missing is None
        todo = _pieces(tree, tree.objects if asking else plan.missing or ())
        manifest = plan.send_manifest
        self._report()
        if relay is not None:
            reply = self._fetch(relay, manifest or asking)
            if reply.snapshot:
                return self._done(reply)
            if reply.relay_error and notice is not None:
                notice(f"{self.host.name}: {reply.relay_error}; pushing to it directly")
            asking, manifest = False, reply.need_manifest
            todo = _pieces(tree, [k for k in reply.missing if k in tree.objects])
            self.shared.cache.expect(todo)
        for _ in range(MAX_ATTEMPTS):
            reply = self._send(todo, manifest, asking)
            if reply.snapshot:
                return self._done(reply)
            # The host lost content the controller thought it had: send that too.
            asking, manifest = False, reply.need_manifest
            todo = _pieces(tree, [k for k in reply.missing if k in tree.objects])
            self.shared.cache.expect(todo)
        raise HostError(
            self.host.name,
            f"the content store in {layout.store_dir(self.host.workdir)} kept losing files during the push",
            "is another 'orch gc' or a cleanup job running there? submit again",
        )

    def _done(self, reply: SyncReply) -> PushResult:
        self._report(finished=True)
        return PushResult(
            self.host.name,
            self.files,
            self.bytes,
            self.wire_bytes,
            self.round_trips,
            reply.setup_done,
            reply.relayed,
            reply.relayed_bytes,
            reply.env_python,
        )

    def _fetch(self, relay: RelayOrder, manifest: bool) -> SyncReply:
        """One round trip that carries no content: the host fetches from the relay,
        then builds the snapshot if it has everything."""
        frames = [framing.json_frame(b"R", relay.as_dict())]
        if manifest:
            frames.append(self.shared.manifest_frame)
        frames.append(framing.json_frame(b"S", self._snapshot_request().as_dict()))
        return self._round_trip(frames, ())

    def _send(self, todo: list[wire.Piece], manifest: bool, ask: bool) -> SyncReply:
        """Send the pieces in round trips of BATCH_BYTES; the last one
        also carries the manifest (when the host may lack it) and the snapshot request.

        With `ask`, the first round trip carries them too: the host's answer says what
        it lacks, and only that goes on (a host orch knows nothing of may have it all).
        While one round trip is on the wire, the next one's pieces are read and
        compressed in a helper thread (while asking too: most such hosts lack it all).
        """
        self._count(todo, +1)
        sizes = iter(BATCH_BYTES)
        size = next(sizes)
        with ThreadPoolExecutor(1, thread_name_prefix=f"encode-{self.host.name}") as helper:
            start, end = 0, wire.batch_end(todo, 0, size)
            encoded = helper.submit(self._encode_all, todo[start:end])
            while True:
                batch, last = todo[start:end], end == len(todo)
                frames = encoded.result()
                if manifest and (last or ask):
                    frames.append(self.shared.manifest_frame)
                    manifest = False
                if last or ask:
                    frames.append(framing.json_frame(b"S", self._snapshot_request().as_dict()))
                size = next(sizes, size)
                following = wire.batch_end(todo, end, size)
                encoded = helper.submit(self._encode_all, todo[end:following])
                reply = self._round_trip(frames, batch)
                if not last and ask:
                    ask = False
                    todo, following, encoded = self._answered(todo, end, following, encoded, reply)
                    last = end == len(todo)
                self._report()
                if last:
                    return reply
                start, end = end, following

    def _answered(
        self,
        todo: list[wire.Piece],
        sent: int,
        following: int,
        encoded: Future[list[bytes]],
        reply: SyncReply,
    ) -> tuple[list[wire.Piece], int, Future[list[bytes]]]:
        """What is left to send once the host said what it lacks, and the next round
        trip's frames: those already encoded, less what the host has."""
        lacking = set(() if reply.snapshot else reply.missing)
        later = [p for p in todo[following:] if p.key not in lacking]
        self.shared.cache.forgo(later)  # push() counted on this host for them
        self._count([p for p in todo[sent:] if p.key not in lacking], -1)
        ready = [(p, f) for p, f in zip(todo[sent:following], encoded.result(), strict=True)]
        wanted = [(p, f) for p, f in ready if p.key in lacking]
        left = (
            todo[:sent] + [p for p, _ in wanted] + [p for p in todo[following:] if p.key in lacking]
        )
        done: Future[list[bytes]] = Future()
        done.set_result([f for _, f in wanted])
        return left, sent + len(wanted), done

    def _encode_all(self, batch: list[wire.Piece]) -> list[bytes]:
        return [self._encode(p) for p in batch]

    def _count(self, todo: Iterable[wire.Piece], sign: int) -> None:
        """Add pieces to (or take them from) the totals the progress shows."""
        for piece in todo:
            self.files_total += sign * (piece.off + piece.length == piece.size)
            self.bytes_total += sign * piece.length

    def _encode(self, piece: wire.Piece) -> bytes:
        try:
            return self.shared.cache.take(piece)
        except wire.ChangedDuringPush as exc:
            raise _changed(self.shared.tree, exc.path) from None
        except OSError as exc:
            raise InputError(
                f"cannot read {piece.path}: {exc.strerror} (workdir {self.shared.tree.root})",
                "fix its permissions, or add it to the job's exclude: list",
            ) from None

    def _snapshot_request(self) -> SnapshotRequest:
        request = SnapshotRequest(
            digest=self.shared.tree.digest,
            job_dir=self.job_dir,
            setup=self.setup,
            keep=self.shared.keep,
        )
        if self.nodes:
            request.nodes = self.nodes
        if self.shared.env is not None:
            request.env = self.shared.env
            request.envs = layout.envs_dir(self.host.workdir)
        return request

    def _round_trip(self, frames: list[bytes], batch: Sequence[wire.Piece]) -> SyncReply:
        """Send one stream and read the host's answer. The frames go as they are, never
        joined: every host of the push sends the same (cached) piece frames. The first
        len(batch) frames are those pieces', counted into the progress as they go."""
        header = PushHeader(store=layout.store_dir(self.host.workdir), push=self.token)
        header_frame = framing.json_frame(b"H", header.as_dict())
        ends = [self.archive, header_frame, framing.frame(b"Z")]
        size = sum(len(part) for part in ends) + sum(len(frame) for frame in frames)
        stream = itertools.chain(ends[:2], self._counted(frames, batch), ends[2:])
        self.round_trips += 1
        self.wire_bytes += size
        started = time.monotonic()
        result = self.transport.run(self.command, stdin=stream, timeout=ROUND_TRIP_TIMEOUT_S)
        log.debug(
            "[host=%s] round trip %d: %d bytes in %.3f s",
            self.host.name,
            self.round_trips,
            size,
            time.monotonic() - started,
        )
        reply = agent.parse(self.host, SyncReply, agent.reply_of(self.host, result, "sync"))
        if reply.changed is not None:
            entry = self.shared.tree.objects.get(reply.changed)
            raise _changed(self.shared.tree, entry.path if entry else "a file")
        if reply.error is not None:
            raise HostError(
                self.host.name,
                f"code push failed: {reply.error}",
                f"check free disk space and permissions of {self.host.workdir} on "
                f"{self.host.name}; 'orch gc' removes old snapshots",
            )
        return reply

    def _counted(self, frames: list[bytes], batch: Sequence[wire.Piece]) -> Iterator[bytes]:
        """The frames; each piece's counted as sent once the transport takes it, with a
        progress report every PROGRESS_EVERY_S."""
        reported = time.monotonic()
        for i, frame in enumerate(frames):
            yield frame
            if i < len(batch):
                piece = batch[i]
                self.files += piece.off + piece.length == piece.size
                self.bytes += piece.length
                if time.monotonic() - reported >= PROGRESS_EVERY_S:
                    self._report()
                    reported = time.monotonic()

    def _report(self, finished: bool = False) -> None:
        self.shared.progress(
            PushProgress(
                self.host.name,
                self.files,
                self.files_total,
                self.bytes,
                self.bytes_total,
                finished,
            )
        )


def _changed(tree: Tree, path: str) -> InfraError:
    return InfraError(
        f"{path} changed while it was being pushed (workdir {tree.root})",
        "submit again once nothing writes to it, or add it to the job's exclude: list",
    )
