"""A root job's snapshot takes the files of an ended job's snapshot, rather than
copying every object again (sync.py's `place_owned`).

As root, each snapshot's files are its own (no mode stops root writing into a file
another job shares), so a resubmit of the same code would copy and hash all of it on
every host. But the files of a snapshot whose job ended on this host are nobody's any
more: a new snapshot may take them over, by a rename, where they still hold what was
placed there. That is known without reading them: each snapshot records, beside its
manifest, the inode and change time (ctime) of every file once it was built (its
seal). Any write, truncation, chmod, link or unlink since changes the ctime, which no
one can set back (utime sets it to now), so a file whose seal still holds is as it was
built, and was checked then. The seal is a file of its own (seal.json), read only
for the one snapshot chosen. Each file is opened to be looked at: on NFS, an open
fetches its attributes from the server (close-to-open), where a bare lstat may answer
from the client's cache, from before another host's job wrote into it.

Directories are sealed too (their path with a trailing `/`, the root as `/`): a
directory's ctime changes whenever an entry is added, removed or renamed in it. So a
directory whose seal holds, whose files' and subdirectories' seals all hold, and
whose manifest entries are the new snapshot's, holds exactly what the new one needs
there: it moves over whole, by one rename, rather than a rename per file (an unchanged
resubmit moves the whole tree: at 2,000 files, 20 ms a host rather than 90). A job
that wrote into a directory (a `__pycache__`, say) spoils that directory and those
above it, not its siblings. A seal without directories (an older agent's) gives files
only, and so does the snapshot of hosts that share a filesystem (`Donor.whole`).

The donor is then retired (its snapshot.json goes first, so that nothing starts from
it again: an attached restart of its job builds a new one) and what is left of it is
removed. Only snapshots of jobs that ended on this host qualify (gc.py's judgement;
never one that no node has used yet), one build at a time per store (gc's lock, which
also keeps gc off the donor).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import Any, Dict  # noqa: UP035

from ..kernel.fileio import read_json, write_json
from ..kernel.layout import CODE, SEAL, SNAPSHOT, entry_key
from . import gc
from .content import remove_tree

RETIRED = "snapshot.retired.json"  # a donor's snapshot.json, while it is taken apart
Seal = Dict[str, Any]  # noqa: UP006 (run at import: hosts may have Python 3.8)


def tree_dirs(entries: list[list[Any]]) -> set[str]:
    """Every directory a manifest's entries need, the root ("") left out."""
    dirs: set[str] = set()
    for path, kind, _, _ in entries:
        path = path if kind == "d" else path.rpartition("/")[0]
        while path and path not in dirs:
            dirs.add(path)
            path = path.rpartition("/")[0]
    return dirs


def above(path: str) -> Iterator[str]:
    """The directories that hold `path` (a snapshot's relative path), innermost
    first, the root ("") last; none for the root itself."""
    while path:
        path = path.rpartition("/")[0]
        yield path


def seal(code: str, entries: list[list[Any]], known: Seal | None = None) -> Seal:
    """Every regular file of the snapshot `code`: path -> [inode, ctime in ns]; and
    every directory, as `path/` (the root `/`). `known`: seals still true (the
    contents of a directory that moved over whole, checked just before), not looked
    at again."""
    known = known or {}
    sealed: Seal = {}
    paths = [p for p, kind, value, _ in entries if entry_key(kind, value) is not None]
    for path in paths + [d + "/" for d in tree_dirs(entries)] + ["/"]:
        if path in known:
            sealed[path] = known[path]
            continue
        info = fresh_stat(f"{code}/{path}".rstrip("/"), directory=path.endswith("/"))
        if info is not None:
            sealed[path] = [info.st_ino, info.st_ctime_ns]
    return sealed


def fresh_stat(path: str, directory: bool = False) -> os.stat_result | None:
    """The regular file's (or directory's) attributes as its filesystem's server has
    them (see above); None for anything else, a link included."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else os.O_NONBLOCK)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    wanted = stat.S_ISDIR if directory else stat.S_ISREG
    return info if wanted(info.st_mode) else None


class Donor:
    """An ended job's snapshot whose files a new one may take over."""

    def __init__(
        self, holder: str, sealed: Seal, entries: list[list[Any]], shared: bool = False
    ) -> None:
        self.holder = holder
        self.shared = shared  # the snapshot of several nodes (hosts sharing a filesystem)
        self.code = os.path.join(holder, CODE)
        self.seal = sealed
        self.keys = {p: entry_key(k, v) for p, k, v, _ in entries}
        self.entries = {p: (k, v) for p, k, v, _ in entries}
        self.dirs = tree_dirs(entries)
        self._dir_stats: dict[str, os.stat_result | None] = {}

    @classmethod
    def find(cls, workdir: str, store: Any) -> Donor | None:
        """The newest snapshot under WORKDIR/jobs whose job ended here and which has a
        seal, retired at once (the caller holds gc's lock); None when there is none."""
        sealed = []
        for holder, nodes in gc.snapshots(workdir):
            if not nodes:  # no node has it yet (a Slurm job still in its queue, say)
                continue
            with contextlib.suppress(OSError):  # its snapshot.json is written when it is built
                if os.path.isfile(os.path.join(holder, SEAL)):
                    sealed.append((os.path.getmtime(os.path.join(holder, SNAPSHOT)), holder, nodes))
        for created, holder, nodes in sorted(sealed, reverse=True):
            if gc.snapshot_end(nodes, created) is None:
                continue  # it runs, or may: its files are its job's
            meta, seal_of = (
                read_json(os.path.join(holder, SNAPSHOT)),
                read_json(os.path.join(holder, SEAL)),
            )
            entries = store.manifest(str(meta.get("manifest"))) if meta else None
            if entries is None or seal_of is None:
                return None
            try:
                os.rename(os.path.join(holder, SNAPSHOT), os.path.join(holder, RETIRED))
            except OSError:
                return None
            return cls(holder, seal_of, entries, shared=nodes != [holder])
        return None

    def take(self, path: str, key: str, target: str) -> bool:
        """Move the donor's file at `path` to `target` when it holds `key` and its seal
        still holds; False (nothing moved) otherwise."""
        sealed = self.seal.get(path)
        if sealed is None or self.keys.get(path) != key or not self.inside(path):
            return False
        source = f"{self.code}/{path}"
        info = fresh_stat(source)
        if info is None or [info.st_ino, info.st_ctime_ns] != sealed:
            return False
        try:
            os.rename(source, target)
        except OSError:
            return False
        return True

    def whole(self, entries: list[list[Any]]) -> set[str]:
        """The directories ("" for the root) that may move over whole: each holds what
        `entries` want there and nothing else, and every seal in it still holds. Only
        the outermost are named.

        None of a snapshot that several nodes used: they are hosts that share its
        filesystem (NFS), and a directory another host wrote into may show its new
        ctime here only once the attribute cache expires (acdirmin, 30 s by default),
        where opening a file fetches its attributes at once (close-to-open). Such a
        snapshot gives its files one by one, each checked afresh."""
        if self.shared:
            return set()
        spoiled: set[str] = set()

        def spoil(path: str) -> None:  # and every directory above it
            while path not in spoiled:
                spoiled.add(path)
                path = path.rpartition("/")[0]

        wanted = {p: (k, v) for p, k, v, _ in entries}
        for path in wanted.keys() | self.entries.keys():
            if wanted.get(path) != self.entries.get(path):
                spoil(path.rpartition("/")[0])
        dirs = tree_dirs(entries)
        for path in dirs ^ self.dirs:  # one side has it, the other does not
            spoil(path)
        for path in ["", *sorted(dirs, key=lambda d: d.count("/"))]:  # parents first
            if path not in spoiled and not (
                self.inside(path) and self.holds(path + "/", path, directory=True)
            ):
                spoil(path)
        for path, key in self.keys.items():
            parent = path.rpartition("/")[0]
            if key is not None and parent not in spoiled and not self.holds(path, path):
                spoil(parent)
        return {
            d
            for d in dirs | {""}
            if d not in spoiled and (not d or d.rpartition("/")[0] in spoiled)
        }

    def holds(self, sealed: str, path: str, directory: bool = False) -> bool:
        """Whether the donor's file (or directory) at `path` is as its seal says."""
        info = self.dir_stat(path) if directory else fresh_stat(f"{self.code}/{path}")
        return info is not None and [info.st_ino, info.st_ctime_ns] == self.seal.get(sealed)

    def inside(self, path: str) -> bool:
        """Whether every directory above `path` is the donor's own, not a link put in
        its place: the path leads where it did (a seal without directories, from an
        older agent, cannot tell: yes)."""
        for parent in above(path):
            sealed = self.seal.get(parent + "/")
            info = self.dir_stat(parent) if sealed is not None else None
            if sealed is not None and (info is None or info.st_ino != sealed[0]):
                return False
        return True

    def dir_stat(self, path: str) -> os.stat_result | None:
        """fresh_stat of the donor's directory at `path`, once per build."""
        if path not in self._dir_stats:
            self._dir_stats[path] = fresh_stat(f"{self.code}/{path}".rstrip("/"), True)
        return self._dir_stats[path]

    def take_dir(self, path: str, target: str) -> bool:
        """Move the donor's directory at `path` ("" for the root) to `target`, which
        must not exist: one that `whole` named."""
        try:
            os.rename(f"{self.code}/{path}".rstrip("/"), target)
        except OSError:
            return False
        return True

    def seals_within(self, moved: set[str]) -> Seal:
        """The seals of what is inside the directories moved over whole: unchanged by
        the move (a directory's own changes: it was renamed)."""
        if "" in moved:  # the whole tree: all but the root itself
            return {path: value for path, value in self.seal.items() if path != "/"}
        return {
            path: value
            for path, value in self.seal.items()
            if any(d in moved for d in above(path.rstrip("/")))
        }

    def dismantle(self) -> None:
        """Remove what is left of the donor's snapshot: it is no snapshot any more."""
        if os.path.lexists(self.code):
            remove_tree(self.code)
        for name in (SEAL, RETIRED):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.holder, name))


def record(job_dir: str, code: str, entries: list[list[Any]], known: Seal | None = None) -> None:
    """Write the snapshot's seal (before its snapshot.json, which makes it one);
    `known` as `seal`'s."""
    write_json(os.path.join(job_dir, SEAL), seal(code, entries, known))
