"""`gc` (stdin: a header frame {"workdir", "keep", "grace"}): drop the code snapshots
of finished jobs but the newest `keep`, then content and manifests no kept snapshot uses.
Also run in the background after a push, at most once a minute."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from typing import Any

from ..host import proc
from ..kernel.fileio import describe_error, read_json, write_bytes
from ..kernel.framing import read_frame
from ..kernel.layout import (
    CODE,
    EXIT,
    HEARTBEAT_S,
    MEMBER_FILE,
    OUTPUTS,
    PIDS,
    RESERVED_NAMES,
    SEAL,
    SNAPSHOT,
    entry_key,
)
from ..kernel.messages import parse_message
from ..kernel.replies import GcReport
from ..kernel.requests import GcRequest
from .content import PRISTINE_NS, ContentStore, remove_tree

GC_GRACE_S = 600.0  # younger store files may belong to a push in flight
ABANDONED_S = 86400.0  # a snapshot never started (setup failed, say) this long is finished
SWEEP_EVERY_S = 86400.0
STALE_S = 10 * HEARTBEAT_S  # another host's node whose pid file is older has ended


def node_end(node_dir: str, created: float) -> float | None:
    """When a node that uses a snapshot ended; None while it runs (or may still).

    Its pids mean something only on the host that recorded them: a node of another
    host sharing this filesystem runs while its supervisor keeps touching its pid file.
    A node directory where a keeper's member lives is in use whatever its node did: the
    keeper may start the job's next attempt there, from this snapshot's content.
    """
    if member_lives(node_dir):
        return None
    with contextlib.suppress(OSError):
        return os.path.getmtime(os.path.join(node_dir, EXIT))
    pids = os.path.join(node_dir, PIDS)
    started = read_json(pids)
    if started is not None:
        if started.get("host", proc.host_id()) == proc.host_id():
            if proc.alive(int(started.get("supervisor", 0))):
                return None
            return float(started.get("started", created))
        with contextlib.suppress(OSError):
            touched = os.path.getmtime(pids)
            return None if time.time() - touched < STALE_S else touched
    return abandoned(created)


def member_lives(node_dir: str) -> bool:
    """Whether a keeper's member (member.py) lives in the node directory: on this host,
    its pid and start time; on another host sharing the filesystem, its touches."""
    path = os.path.join(node_dir, MEMBER_FILE)
    record = read_json(path)
    if record is None:
        return False
    if record.get("host") != proc.host_id():
        with contextlib.suppress(OSError):
            return time.time() - os.path.getmtime(path) < STALE_S
        return False
    pid = int(record.get("pid") or 0)
    return proc.alive(pid) and proc.start_time(pid) == record.get("start_time")


def abandoned(created: float) -> float | None:
    """A snapshot no node ever started from is finished once it is a day old."""
    return created if time.time() - created > ABANDONED_S else None


def snapshots(workdir: str) -> list[tuple[str, list[str]]]:
    """The code snapshots under WORKDIR/jobs, each with the node directories that use
    it: a job's shared one (WORKDIR/jobs/<id>/code) or a node's own."""
    import glob

    found = []
    for job in glob.glob(os.path.join(glob.escape(workdir), "jobs", "*")):
        nodes = [
            d
            for d in glob.glob(os.path.join(glob.escape(job), "*"))
            if os.path.basename(d) not in RESERVED_NAMES and not os.path.islink(d)
        ]
        for holder in (job, *nodes):
            code = os.path.join(holder, CODE)
            if os.path.isfile(os.path.join(holder, SNAPSHOT)) and not os.path.islink(code):
                found.append((holder, nodes if holder == job else [holder]))
    return found


def snapshot_end(nodes: list[str], created: float) -> float | None:
    """When the last node that uses a snapshot ended; None while any may still run."""
    if not nodes:
        return abandoned(created)
    ends = [node_end(node, created) for node in nodes]
    return None if None in ends else max(e for e in ends if e is not None)


def collect_garbage(
    workdir: str, keep: int, grace_s: float = GC_GRACE_S, sweep: bool = False
) -> dict[str, Any]:
    """Drop the snapshots of finished jobs but the newest `keep`, then content and
    manifests no snapshot uses (and older than `grace_s`: a push may be in flight).

    Without `sweep`, the store is swept only when a snapshot went, or once a day.
    """
    store = ContentStore(os.path.join(workdir, "store"))
    os.makedirs(store.root, exist_ok=True)
    with open(store.path("gc.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if sweep else fcntl.LOCK_NB))
        except OSError:
            return {"busy": True}  # another gc is at it
        finished, kept, running = [], set(), 0
        for holder, nodes in snapshots(workdir):
            meta = read_json(os.path.join(holder, SNAPSHOT))
            if meta is None or not os.path.isdir(os.path.join(holder, CODE)):
                continue
            ended = snapshot_end(nodes, float(meta.get("created", 0)))
            if ended is None:
                running += 1
                kept.add(str(meta.get("manifest")))
            else:
                finished.append((ended, holder, str(meta.get("manifest"))))
        finished.sort(reverse=True)
        kept.update(digest for _, _, digest in finished[:keep])
        for _, holder, _ in finished[keep:]:
            remove_tree(os.path.join(holder, CODE))
            os.unlink(os.path.join(holder, SNAPSHOT))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(holder, SEAL))
        report: dict[str, Any] = {
            "snapshots_removed": len(finished[keep:]),
            "snapshots_kept": min(len(finished), keep),
            "running": running,
            "objects_removed": 0,
            "bytes_freed": 0,
        }
        stamp = store.path("gc.stamp")
        due = not os.path.exists(stamp) or time.time() - os.path.getmtime(stamp) > SWEEP_EVERY_S
        if sweep or finished[keep:] or due:
            report.update(sweep_store(store, kept, time.time() - grace_s))
            write_bytes(stamp, b"", 0o600)
        return report


def sweep_store(store: ContentStore, kept: set[str], before: float) -> dict[str, int]:
    """Remove objects no kept manifest lists (and leftovers of pushes cut short), and
    manifests and markers none refers to, all when older than `before`.

    Snapshots may hold copies rather than links, so an object's link count says
    nothing of its use: the kept snapshots' manifests do. Where one of them cannot be
    read, objects that something still links to stay too.
    """
    import glob

    live, complete = listed_objects(store, kept)
    removed = freed = 0
    for path in glob.glob(store.path("objects", "*")):
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            used = os.path.basename(path) in live or (not complete and st.st_nlink > 1)
            # A pristine object's mtime is a mark (store.PRISTINE_NS): its ctime says
            # when the push stored it.
            age = st.st_ctime if st.st_mtime_ns == PRISTINE_NS else st.st_mtime
            if not used and age < before:
                os.unlink(path)
                removed, freed = removed + 1, freed + st.st_size
            elif st.st_mode & 0o077:  # stored by an orch that let others read it
                os.chmod(path, st.st_mode & 0o700)
    for path in glob.glob(store.path("manifests", "*")):
        with contextlib.suppress(OSError):
            if os.path.basename(path) not in kept and os.path.getmtime(path) < before:
                os.unlink(path)
    for path in glob.glob(store.path("setup", "*")):
        marker = read_json(path) or {}
        with contextlib.suppress(OSError):
            if marker.get("manifest") not in kept and os.path.getmtime(path) < before:
                os.unlink(path)
    return {"objects_removed": removed, "bytes_freed": freed}


def listed_objects(store: ContentStore, kept: set[str]) -> tuple[set[str], bool]:
    """The object keys that the manifests `kept` list, and whether every one of those
    manifests could be read."""
    keys: set[str] = set()
    complete = True
    for digest in kept:
        try:
            entries = store.manifest(digest)
        except (OSError, ValueError, KeyError, TypeError):  # a bad digest, a torn file
            entries = None
        if entries is None:
            complete = False
            continue
        keys.update(key for _, kind, value, _ in entries if (key := entry_key(kind, value)))
    return keys, complete


def drop_outputs(workdir: str) -> dict[str, int]:
    """Remove the output directories of jobs whose every node ended (`orch gc
    --outputs`): what `orch pull` has not fetched by then is gone."""
    import glob

    removed = freed = 0
    for job in glob.glob(os.path.join(glob.escape(workdir), "jobs", "*")):
        outputs = os.path.join(job, OUTPUTS)
        if not os.path.isdir(outputs) or os.path.islink(outputs):
            continue
        nodes = [
            d
            for d in glob.glob(os.path.join(glob.escape(job), "*"))
            if os.path.basename(d) not in RESERVED_NAMES and os.path.isdir(d)
        ]
        created = os.path.getmtime(outputs)
        if any(node_end(node, created) is None for node in nodes):
            continue  # a node may still write there
        for dirpath, _, files in os.walk(outputs):
            for name in files:
                with contextlib.suppress(OSError):
                    freed += os.lstat(os.path.join(dirpath, name)).st_size
        remove_tree(outputs)
        removed += 1
    return {"outputs_removed": removed, "outputs_bytes_freed": freed}


def main(args: list[str]) -> int:
    """`gc` with a header frame {"workdir", "keep", "grace", "outputs"} on stdin:
    collect now; with "outputs", ended jobs' output directories go too."""
    try:
        _, payload = read_frame(sys.stdin.buffer)
        options = parse_message(GcRequest, json.loads(payload))
        report = collect_garbage(
            os.path.expanduser(options.workdir),
            options.keep,
            options.grace if options.grace is not None else GC_GRACE_S,
            sweep=True,
        )
        if options.outputs:
            report.update(drop_outputs(os.path.expanduser(options.workdir)))
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:  # ValueError: MessageError
        report = {"error": describe_error(exc)}
    print(GcReport(**report).to_json())
    return 1 if "error" in report else 0
