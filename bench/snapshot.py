"""Snapshot privacy's cost: a job's code/ snapshot built from private copies (what the
agent does as root) against hard links into the store (what it does for other users),
side by side in the same run, alternating which goes first.

No cluster: the agent's own `build_tree` on a local store, which is the whole of what
changes between the two (the push before it is the same). The tree is bench/sync.py's:
2,000 files, 50 MB of random data, stored once. Timed: `build_tree` alone, then the
`sync` that writes back what it left dirty (copies leave 50 MB; links, metadata).
Between runs, not timed: removing the snapshot, and a `sync`. The disk a snapshot
takes is the drop in the filesystem's free space once written back.

Copies are reflinks where the filesystem shares extents (btrfs, xfs); elsewhere
(ext4, tmpfs) the kernel copies the bytes. `--dir` picks the filesystem.

Usage:

    .venv/bin/python bench/snapshot.py [--repeat 7] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import machine, median, write_section
from bench.sync import FILES, TOTAL_BYTES, make_tree
from orchestrator.agent.store.content import ContentStore, remove_tree
from orchestrator.agent.store.sync import FICLONE, build_tree


def store_tree(root: Path, store: ContentStore) -> list[list[Any]]:
    """Put every file under root into the store, as a push would; its manifest entries."""
    entries: list[list[Any]] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        store.put_piece({"k": digest, "off": 0, "size": len(data), "z": 0}, data, "bench")
        entries.append([str(path.relative_to(root)), "f", digest, len(data)])
    return entries


def filesystem(path: Path) -> str:
    """The type of the filesystem that holds `path` (the longest mount point above it)."""
    best, kind = "", "?"
    for line in Path("/proc/mounts").read_text().splitlines():
        mount, fs = line.split()[1:3]
        if str(path).startswith(mount.rstrip("/") + "/") and len(mount) > len(best):
            best, kind = mount, fs
    return kind


def reflinks(directory: Path) -> bool:
    """Whether the filesystem at `directory` shares extents (FICLONE works)."""
    (directory / "probe-a").write_bytes(b"x" * 4096)
    with open(directory / "probe-a", "rb") as src, open(directory / "probe-b", "wb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
            return True
        except OSError:
            return False
        finally:
            os.unlink(directory / "probe-a")
            os.unlink(directory / "probe-b")


def free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def build(
    store: ContentStore, entries: list[list[Any]], code: Path, copy: bool
) -> tuple[float, float, int]:
    """Seconds for build_tree, seconds for the sync after it, and the disk it took."""
    os.sync()
    free = free_bytes(code.parent)
    started = time.perf_counter()
    build_tree(store, entries, str(code), copy=copy)
    built = time.perf_counter()
    os.sync()
    synced = time.perf_counter()
    used = free - free_bytes(code.parent)
    remove_tree(str(code))
    return built - started, synced - built, used


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--dir", type=Path, help="where the store goes (default: the temp dir)")
    parser.add_argument("--note", help="a sentence for the report: how --dir was made, say")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-bench-snapshot-", dir=args.dir))
    try:
        make_tree(work / "tree")
        store = ContentStore(str(work / "store"))
        entries = store_tree(work / "tree", store)
        shutil.rmtree(work / "tree")
        runs: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
        for n in range(args.repeat):
            for copy in (n % 2 == 0, n % 2 == 1):
                runs[copy].append(build(store, entries, work / "code", copy))
            print(
                f"run {n + 1}: "
                + "; ".join(
                    f"{'copy' if c else 'link'} {r[-1][0]:.3f} s (+{r[-1][1]:.3f} s sync)"
                    for c, r in runs.items()
                ),
                flush=True,
            )
        report(args, filesystem(work), reflinks(work), runs)
    finally:
        remove_tree(str(work))


def report(
    args: argparse.Namespace,
    fs: str,
    reflinked: bool,
    runs: dict[bool, list[tuple[float, float, int]]],
) -> None:
    link, copy = (
        {k: median([r[i] for r in runs[c]]) for i, k in enumerate(("build", "sync", "disk"))}
        for c in (False, True)
    )
    how = "reflinks" if reflinked else "copy_file_range (no reflink here)"
    rows = [
        "| snapshot of 2,000 files, 50 MB | build (s) | sync after (s) | build + sync (s) | disk per snapshot (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in (("hard links (non-root)", link), (f"private copies (root): {how}", copy)):
        rows.append(
            f"| {name} | {m['build']:.3f} | {m['sync']:.3f} | {m['build'] + m['sync']:.3f} "
            f"| {m['disk'] / 2**20:.1f} |"
        )
    ratio = copy["build"] / link["build"]
    total = (copy["build"] + copy["sync"]) / (link["build"] + link["sync"])
    body = "\n".join(
        [
            f"## Snapshot privacy: private copies against hard links ({fs})",
            "",
            f"A job's code/ snapshot of bench/sync.py's tree ({FILES:,} files, "
            f"{TOTAL_BYTES // 2**20} MB of random data) built by the agent's `build_tree` from "
            "a local store: as root, private copies (a job writing into its files then changes "
            "no other job's); for other users, hard links to the read-only objects. No cluster: "
            "the push before it is the same either way. Alternating which goes first; the "
            "`sync` after each build writes back what it left dirty, and the disk a snapshot "
            f"takes is the drop in free space once written. Median of {args.repeat} runs; "
            f"{machine()}; the store on {fs}.",
            "",
            *rows,
            "",
            f"Copies take {ratio:.1f}x the time of links to build, "
            f"{copy['build'] - link['build']:.2f} s more per snapshot (once per job and host), "
            f"{total:.1f}x with the write-back. {args.note or ''}".rstrip(),
            "",
            f"Reproduce: `sudo .venv/bin/python bench/snapshot.py --repeat {args.repeat}"
            + (f" --dir <a directory on {fs}>`" if args.dir else "`"),
        ]
    )
    write_section(f"snapshot-{fs}", body)
    print("\n".join(rows))
    print(f"copy / link: build {ratio:.2f}x, build + sync {total:.2f}x")


if __name__ == "__main__":
    main()
