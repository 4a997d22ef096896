"""The manifest of a workdir: every pushed path with its kind and content hash.

A manifest is what a job's code snapshot is built from on each host. Its canonical
encoding (sorted entries, compact ASCII JSON) has a sha256, the manifest digest, which
names the code version: the same tree gives the same digest on every controller.

Hashing 50 MB costs a noticeable fraction of a second, so the controller keeps a stat
cache per workdir under $ORCH_HOME: a file is hashed again only when its size or mtime
changed, or when its mtime is so recent that a later write could share it (git's
"racily clean" problem).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from orchestrator.models.errors import InputError
from orchestrator.records.home import orch_home
from orchestrator.sync.ignore import collect_files

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# A cached hash is trusted only for files last modified this long before it was taken.
RACY_WINDOW_NS = 2_000_000_000
KIND_FILE, KIND_EXEC, KIND_LINK, KIND_DIR = "f", "x", "l", "d"


@dataclass(frozen=True)
class Entry:
    """One path of the tree.

    `value` is the sha256 of a file's bytes (kinds f and x), a symlink's target
    (kind l), or empty for an empty directory (kind d).
    """

    path: str
    kind: str
    value: str
    size: int = 0

    @property
    def key(self) -> str | None:
        """The content-store key of a file: its hash, marked when executable.

        Hard links share their mode, so the same bytes with and without the
        executable bit are two objects.
        """
        if self.kind == KIND_FILE:
            return self.value
        if self.kind == KIND_EXEC:
            return self.value + ".x"
        return None


@dataclass(frozen=True)
class Tree:
    """A scanned workdir: its entries, their canonical encoding and its digest.

    `sources`: the files of entries that are not under `root` (wheels carried beside
    the code: `graft`), by entry path; every other entry is read at root/path.
    """

    root: Path
    entries: tuple[Entry, ...]
    body: bytes = field(repr=False)
    digest: str
    sources: dict[str, str] = field(default_factory=dict, repr=False)

    def source(self, path: str) -> str:
        """Where the controller reads the entry `path`: under the root, or its source."""
        return self.sources.get(path, path)

    @cached_property
    def objects(self) -> dict[str, Entry]:
        """The distinct content objects, first entry per key, in path order."""
        found: dict[str, Entry] = {}
        for entry in self.entries:
            key = entry.key
            if key is not None and key not in found:
                found[key] = entry
        return found

    @property
    def total_bytes(self) -> int:
        """Bytes of distinct content: what a push to an empty host sends, uncompressed."""
        return sum(entry.size for entry in self.objects.values())


def encode(entries: Iterable[Entry]) -> tuple[bytes, str]:
    """The canonical bytes of a manifest and their sha256 (the digest).

    ASCII-only JSON: names that are not valid UTF-8 travel as surrogate escapes,
    which Python on the host turns back into the same bytes.
    """
    rows = [[e.path, e.kind, e.value, e.size] for e in sorted(entries, key=lambda e: e.path)]
    body = json.dumps(
        {"v": FORMAT_VERSION, "entries": rows}, ensure_ascii=True, separators=(",", ":")
    ).encode()
    return body, hashlib.sha256(body).hexdigest()


def scan(root: Path, paths: Iterable[str], cache_dir: Path | None = None) -> Tree:
    """Build the manifest of `paths` (from sync.collect_files) under `root`.

    Args:
        root: the workdir.
        paths: relative posix paths; a trailing `/` marks an empty directory.
        cache_dir: where the stat cache lives (default: $ORCH_HOME/sync/trees).

    Returns:
        The Tree, with every file hashed or its hash taken from the stat cache.

    Raises:
        InputError: a file cannot be read.
    """
    cache = StatCache(cache_dir or orch_home() / "sync" / "trees", root)
    entries: list[Entry] = []
    unhashed: list[tuple[str, os.stat_result]] = []
    for rel in paths:
        found = _entry(str(root), rel, cache)
        if isinstance(found, Entry):
            entries.append(found)
        elif found is not None:
            unhashed.append(found)
    # Hashed in this thread: most files are small, and handing each to a pool costs
    # more than the hashing (measured: 0.14 s against 0.06 s for 2,000 files, 50 MB).
    for rel, st in unhashed:
        entries.append(_file_entry(rel, st, cache.store(rel, st, _hash_file(str(root), rel))))
    cache.save()
    body, digest = encode(entries)
    return Tree(root, tuple(sorted(entries, key=lambda e: e.path)), body, digest)


def _entry(root: str, rel: str, cache: StatCache) -> Entry | tuple[str, os.stat_result] | None:
    """The entry of `rel`; (rel, stat) when its file must be hashed; None to skip it."""
    if rel.endswith("/"):
        return Entry(rel.rstrip("/"), KIND_DIR, "")
    path = os.path.join(root, rel)  # str, not Path: this runs for every file
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return Entry(rel, KIND_LINK, os.readlink(path))
    except OSError as exc:
        raise _unreadable(root, rel, exc) from None
    if not stat.S_ISREG(st.st_mode):
        log.debug("skipping %s: not a regular file", rel)  # a FIFO would block the read
        return None
    digest = cache.lookup(rel, st)
    return (rel, st) if digest is None else _file_entry(rel, st, digest)


def _file_entry(rel: str, st: os.stat_result, digest: str) -> Entry:
    kind = KIND_EXEC if st.st_mode & stat.S_IXUSR else KIND_FILE
    return Entry(rel, kind, digest, st.st_size)


def _hash_file(root: str, rel: str) -> str:
    try:
        with open(os.path.join(root, rel), "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        raise _unreadable(root, rel, exc) from None


def _unreadable(root: str, rel: str, exc: OSError) -> InputError:
    return InputError(
        f"cannot read {rel}: {exc.strerror} (workdir {root})",
        "fix its permissions, or add it to the job's exclude: list",
    )


class StatCache:
    """(size, mtime) -> sha256 per path of one workdir, kept between runs."""

    def __init__(self, directory: Path, root: Path) -> None:
        name = hashlib.sha256(str(root.resolve()).encode("utf-8", "surrogateescape")).hexdigest()
        self.path = directory / f"{name[:32]}.json"
        self.started_ns = time.time_ns()
        self._old: dict[str, list[object]] = {}
        self._trusted_before_ns = 0
        self._new: dict[str, list[object]] = {}
        try:
            data = json.loads(self.path.read_text())
            if data.get("v") == FORMAT_VERSION:
                self._old = data["files"]
                self._trusted_before_ns = int(data["scanned_ns"]) - RACY_WINDOW_NS
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no cache, or an unreadable one: hash everything

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        """The cached hash, if the file is unchanged since it was taken."""
        row = self._old.get(rel)
        if (
            row is None
            or row[0] != st.st_size
            or row[1] != st.st_mtime_ns
            or st.st_mtime_ns >= self._trusted_before_ns
        ):
            return None
        self._new[rel] = row
        return str(row[2])

    def store(self, rel: str, st: os.stat_result, digest: str) -> str:
        self._new[rel] = [st.st_size, st.st_mtime_ns, digest]
        return digest

    def save(self) -> None:
        """Write the cache atomically; a failure only costs hashing again next time."""
        data = {"v": FORMAT_VERSION, "scanned_ns": self.started_ns, "files": self._new}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(data, separators=(",", ":")))
            tmp.replace(self.path)
        except OSError as exc:
            log.debug("cannot write the stat cache %s: %s", self.path, exc)


class HostMemory:
    """What the controller remembers each host's store to hold, under $ORCH_HOME.

    Keyed by user, address, port and workdir: two inventory names for one machine and
    workdir share a store. The keys of the last few manifests pushed are kept, so that
    switching back to a recent version sends nothing it already sent. The memory is
    only a guess: the host confirms it on every push.
    """

    KEEP_MANIFESTS = 3

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or orch_home() / "sync" / "hosts"

    def _path(self, host_key: str) -> Path:
        return self.directory / f"{hashlib.sha256(host_key.encode()).hexdigest()[:32]}.json"

    def recall(self, host_key: str) -> list[tuple[str, list[str]]]:
        """(manifest digest, object keys) pushed to the host, newest first."""
        try:
            data = json.loads(self._path(host_key).read_text())
            return [(str(d), [str(k) for k in keys]) for d, keys in data["recent"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def remember(self, host_key: str, digest: str, keys: Iterable[str]) -> None:
        recent = [(d, k) for d, k in self.recall(host_key) if d != digest]
        recent = [(digest, sorted(set(keys))), *recent][: self.KEEP_MANIFESTS]
        path = self._path(host_key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"host": host_key, "recent": recent}))
            tmp.replace(path)
        except OSError as exc:
            log.debug("cannot remember the store of %s: %s", host_key, exc)


def scan_workdir(root: Path, exclude: Iterable[str] = ()) -> Tree:
    """The manifest of what a job pushes from `root` (hashes from the stat cache).

    Raises:
        InputError: a file cannot be read.
    """
    return scan(root, collect_files(root, exclude))


def graft(tree: Tree, prefix: str, files: Tree) -> Tree:
    """`tree` with the files of `files` (scanned from another directory) added under
    `prefix`: they travel with the code as any file of it does (by hash, once), and
    are read from where they are.

    Raises:
        InputError: the workdir has a path of its own under `prefix`.
    """
    taken = [e.path for e in tree.entries if e.path == prefix or e.path.startswith(prefix + "/")]
    if taken:
        raise InputError(
            f"{taken[0]} is in the workdir, where orch puts the wheels it carries "
            f"(workdir {tree.root})",
            f"rename or exclude {prefix} in the workdir",
        )
    added = [replace(e, path=f"{prefix}/{e.path}") for e in files.entries if e.key is not None]
    sources = {**tree.sources}
    for entry in files.entries:
        if entry.key is not None:
            sources[f"{prefix}/{entry.path}"] = str(files.root / files.source(entry.path))
    entries = [*tree.entries, *added]
    body, digest = encode(entries)
    return Tree(tree.root, tuple(sorted(entries, key=lambda e: e.path)), body, digest, sources)
