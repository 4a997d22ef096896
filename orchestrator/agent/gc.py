"""`gc` (stdin: a header frame {"workdir", "keep", "grace"}): drop the code snapshots
of finished jobs but the newest `keep`, then content and manifests no snapshot uses.
Also run in the background after a push, at most once a minute."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from typing import Any

from . import proc
from .protocol import CODE, EXIT, PIDS, SNAPSHOT, describe_error, read_frame, read_json, write_bytes
from .store import ContentStore, remove_tree

GC_GRACE_S = 600.0  # younger store files may belong to a push in flight
ABANDONED_S = 86400.0  # a snapshot never started (setup failed, say) this long is finished
SWEEP_EVERY_S = 86400.0


def snapshot_end(job_dir: str, created: float) -> float | None:
    """When the job that uses this snapshot ended; None while it runs (or may still)."""
    with contextlib.suppress(OSError):
        return os.path.getmtime(os.path.join(job_dir, EXIT))
    started = read_json(os.path.join(job_dir, PIDS))
    if started is not None:
        if proc.alive(int(started.get("supervisor", 0))):
            return None
        return float(started.get("started", created))
    return created if time.time() - created > ABANDONED_S else None


def collect_garbage(
    workdir: str, keep: int, grace_s: float = GC_GRACE_S, sweep: bool = False
) -> dict[str, Any]:
    """Drop the snapshots of finished jobs but the newest `keep`, then content and
    manifests no snapshot uses (and older than `grace_s`: a push may be in flight).

    Without `sweep`, the store is swept only when a snapshot went, or once a day.
    """
    import glob

    store = ContentStore(os.path.join(workdir, "store"))
    os.makedirs(store.root, exist_ok=True)
    with open(store.path("gc.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if sweep else fcntl.LOCK_NB))
        except OSError:
            return {"busy": True}  # another gc is at it
        finished, kept, running = [], set(), 0
        for job_dir in glob.glob(os.path.join(glob.escape(workdir), "jobs", "*", "*")):
            meta = read_json(os.path.join(job_dir, SNAPSHOT))
            if meta is None or not os.path.isdir(os.path.join(job_dir, CODE)):
                continue
            ended = snapshot_end(job_dir, float(meta.get("created", 0)))
            if ended is None:
                running += 1
                kept.add(str(meta.get("manifest")))
            else:
                finished.append((ended, job_dir, str(meta.get("manifest"))))
        finished.sort(reverse=True)
        kept.update(digest for _, _, digest in finished[:keep])
        for _, job_dir, _ in finished[keep:]:
            remove_tree(os.path.join(job_dir, CODE))
            os.unlink(os.path.join(job_dir, SNAPSHOT))
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
            write_bytes(stamp, b"", 0o644)
        return report


def sweep_store(store: ContentStore, kept: set[str], before: float) -> dict[str, int]:
    """Remove objects no snapshot links to, and manifests and markers none refers to."""
    import glob

    removed = freed = 0
    for path in glob.glob(store.path("objects", "*")):
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if st.st_nlink == 1 and st.st_mtime < before:  # also parts of pushes cut short
                os.unlink(path)
                removed, freed = removed + 1, freed + st.st_size
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


def main(args: list[str]) -> int:
    """`gc` with a header frame {"workdir", "keep", "grace"} on stdin: collect now."""
    try:
        _, payload = read_frame(sys.stdin.buffer)
        options = json.loads(payload)
        report = collect_garbage(
            os.path.expanduser(options["workdir"]),
            int(options["keep"]),
            float(options.get("grace", GC_GRACE_S)),
            sweep=True,
        )
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        report = {"error": describe_error(exc)}
    print(json.dumps(report))
    return 1 if "error" in report else 0
