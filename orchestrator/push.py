"""The push itself: each host gets what it lacks and builds the job's snapshot.

Per host, in parallel (see sync.py for the whole design):

1. The controller recalls which objects it pushed to the host before. A host it knows
   nothing of is first asked what it lacks (one round trip with the manifest alone),
   unless the tree is small enough to just send.
2. The missing objects go in round trips of a size that takes about a second, so
   that progress moves; the last round trip also carries the manifest (when the
   host may lack it) and the snapshot request.
3. The host answers with the objects it still lacks (the controller's memory was
   stale: a gc ran, another controller pushed, the disk was wiped); those go next.
   Unchanged code is one round trip that sends nothing but the check.
"""

from __future__ import annotations

import logging
import secrets
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from orchestrator import wire
from orchestrator.hosts import HostGroup
from orchestrator.manifest import HostMemory, Tree
from orchestrator.models.errors import (
    HostError,
    InfraError,
    InputError,
    MultiHostError,
    RemoteCommandError,
)
from orchestrator.models.inventory import Host
from orchestrator.sync import (
    SHELL_NOT_FOUND,
    host_key,
    last_json,
    packed_supervisor,
    snapshot_retention,
    store_dir,
    supervisor_command,
)
from orchestrator.transport import Transport

ROUND_TRIP_TIMEOUT_S = 600.0
FIRST_BATCH_BYTES = 4 << 20
MAX_BATCH_BYTES = 64 << 20
MIN_BATCH_BYTES = 16 << 20
BATCH_SECONDS = 1.0  # later round trips are sized to take about this long
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


Progress = Callable[[PushProgress], None]


def push(
    group: HostGroup,
    tree: Tree,
    job_dirs: Mapping[str, str],
    setup_keys: Mapping[str, str] | None = None,
    progress: Progress | None = None,
    keep: int | None = None,
    memory: HostMemory | None = None,
) -> dict[str, PushResult]:
    """Push `tree` to every host named in `job_dirs`, in parallel, and build each one's
    snapshot at `<job dir>/code` (with the supervisor beside it).

    Args:
        group: connected hosts.
        tree: the manifest to push (`scan_workdir`).
        job_dirs: host name -> the job's directory there.
        setup_keys: host name -> `setup_key(...)`, to learn whether setup ran there.
        progress: called from the hosts' threads as each host's push moves on.
        keep: finished snapshots to keep per host (default: `snapshot_retention()`).
        memory: what was pushed to which host before (default: under $ORCH_HOME).

    Returns:
        Each host's PushResult.

    Raises:
        HostError / MultiHostError: naming each host whose push failed.
        InfraError: a file changed while it was being pushed.
    """
    memory = memory or HostMemory()
    hosts = [h for h in group.hosts if h.name in job_dirs]
    plans = {h.name: HostPlan.of(tree, memory.recall(host_key(h))) for h in hosts}
    cache = wire.PieceCache(tree.root)
    for plan in plans.values():  # a host that will be asked most likely lacks everything
        cache.expect(_pieces(tree, tree.objects if plan.missing is None else plan.missing))
    shared = _Shared(
        tree,
        cache,
        packed_supervisor(),
        keep if keep is not None else snapshot_retention(),
        progress or (lambda _: None),
    )

    def one(host: Host, transport: Transport) -> PushResult:
        key = (setup_keys or {}).get(host.name)
        return _HostPush(shared, host, transport, job_dirs[host.name], key).run(plans[host.name])

    results, failures = group.try_each(one, only=job_dirs)
    for host in hosts:  # in this thread: two names of one store share a memory file
        if host.name in results:
            memory.remember(host_key(host), tree.digest, tree.objects)
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
        known = {key for _, keys in recalled for key in keys}
        missing = tuple(key for key in tree.objects if key not in known)
        if not recalled and tree.total_bytes > ASK_FIRST_BYTES:
            return HostPlan(None, True)
        return HostPlan(missing, tree.digest not in {digest for digest, _ in recalled})


def _pieces(tree: Tree, keys: Iterable[str]) -> list[wire.Piece]:
    objects = tree.objects
    return [p for k in keys for p in wire.pieces(k, objects[k].path, objects[k].size)]


@dataclass
class _Shared:
    """What every host's push of one tree shares."""

    tree: Tree
    cache: wire.PieceCache
    source: bytes
    keep: int
    progress: Progress


class _HostPush:
    """The push to one host: round trips until its snapshot is built."""

    def __init__(
        self, shared: _Shared, host: Host, transport: Transport, job_dir: str, setup: str | None
    ) -> None:
        self.shared = shared
        self.host = host
        self.transport = transport
        self.job_dir = job_dir
        self.setup = setup
        self.files = self.bytes = self.wire_bytes = self.round_trips = 0
        self.files_total = self.bytes_total = 0
        self.command = supervisor_command(host, "sync")
        self.token = secrets.token_hex(8)

    def run(self, plan: HostPlan) -> PushResult:
        tree = self.shared.tree
        missing, send_manifest = plan.missing, plan.send_manifest
        self._report()
        for _ in range(MAX_ATTEMPTS):
            asked = missing is None
            if missing is None:  # ask: the manifest and the snapshot request alone
                reply, send_manifest = self._send([], manifest=True), False
            else:
                self._expect(missing)
                reply = self._send(_pieces(tree, missing), manifest=send_manifest)
            lacking = tuple(k for k in reply.get("missing", ()) if k in tree.objects)
            if asked:  # push() counted on it needing every object; hand back the rest
                self.shared.cache.forgo(_pieces(tree, set(tree.objects) - set(lacking)))
            else:
                self.shared.cache.expect(_pieces(tree, lacking))
            if reply.get("snapshot"):
                self._report(finished=True)
                return PushResult(
                    self.host.name,
                    self.files,
                    self.bytes,
                    self.wire_bytes,
                    self.round_trips,
                    bool(reply.get("setup_done")),
                )
            send_manifest, missing = bool(reply.get("need_manifest")), lacking
        raise HostError(
            self.host.name,
            f"the content store in {store_dir(self.host)} kept losing files during the push",
            "is another 'orch gc' or a cleanup job running there? submit again",
        )

    def _expect(self, keys: Iterable[str]) -> None:
        objects = self.shared.tree.objects
        for key in keys:
            self.files_total += 1
            self.bytes_total += objects[key].size

    def _send(self, todo: list[wire.Piece], manifest: bool) -> dict[str, Any]:
        """Send the pieces in round trips sized by the throughput seen; the last one
        also carries the manifest (if asked for) and the snapshot request."""
        limit = _BatchLimit()
        start = 0
        while True:
            end = wire.batch_end(todo, start, limit.next)
            batch = todo[start:end]
            frames = [self._encode(p) for p in batch]
            if end == len(todo):
                if manifest:
                    frames.append(wire.frame(b"M", zlib.compress(self.shared.tree.body)))
                frames.append(wire.json_frame(b"S", self._snapshot_request()))
            started = time.monotonic()
            reply = self._round_trip(frames)
            limit.observe(sum(p.length for p in batch), time.monotonic() - started)
            self.files += sum(p.off + p.length == p.size for p in batch)
            self.bytes += sum(p.length for p in batch)
            self._report()
            if end == len(todo):
                return reply
            start = end

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

    def _snapshot_request(self) -> dict[str, Any]:
        return {
            "digest": self.shared.tree.digest,
            "job_dir": self.job_dir,
            "setup": self.setup,
            "keep": self.shared.keep,
        }

    def _round_trip(self, frames: list[bytes]) -> dict[str, Any]:
        header = wire.json_frame(b"H", {"store": store_dir(self.host), "push": self.token})
        stream = b"".join([self.shared.source, header, *frames, wire.frame(b"Z")])
        self.round_trips += 1
        self.wire_bytes += len(stream)
        # paramiko's sendall copies what is left of a bytes object on every packet,
        # which is quadratic in the size; slicing a memoryview copies nothing.
        stdin = cast(bytes, memoryview(stream))
        started = time.monotonic()
        result = self.transport.run(self.command, stdin=stdin, timeout=ROUND_TRIP_TIMEOUT_S)
        log.debug(
            "[host=%s] round trip %d: %d bytes in %.3f s",
            self.host.name,
            self.round_trips,
            len(stream),
            time.monotonic() - started,
        )
        reply = last_json(result.stdout)
        if reply is None:
            if result.exit_code in SHELL_NOT_FOUND:
                raise HostError(
                    self.host.name,
                    f"python not found at {self.host.python}",
                    f"set 'python:' for {self.host.name} in the inventory",
                )
            raise RemoteCommandError(
                self.host.name, "orch_supervisor.py sync", result.exit_code, result.stderr
            )
        if "changed" in reply:
            path = next(
                (e.path for k, e in self.shared.tree.objects.items() if k == reply["changed"]), "?"
            )
            raise _changed(self.shared.tree, path)
        if "error" in reply:
            raise HostError(
                self.host.name,
                f"code push failed: {reply['error']}",
                f"check free disk space and permissions of {self.host.workdir} on "
                f"{self.host.name}; 'orch gc' removes old snapshots",
            )
        return reply

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


class _BatchLimit:
    """Round-trip sizes: small at first, then about BATCH_SECONDS of what the link does,
    so that the progress moves and no round trip holds much in memory."""

    def __init__(self) -> None:
        self.next = FIRST_BATCH_BYTES

    def observe(self, sent: int, seconds: float) -> None:
        if sent >= FIRST_BATCH_BYTES // 2 and seconds > 0:
            rate = sent / seconds
            self.next = int(min(MAX_BATCH_BYTES, max(MIN_BATCH_BYTES, rate * BATCH_SECONDS)))


def _changed(tree: Tree, path: str) -> InfraError:
    return InfraError(
        f"{path} changed while it was being pushed (workdir {tree.root})",
        "submit again once nothing writes to it, or add it to the job's exclude: list",
    )
