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
from typing import Any, Dict  # noqa: UP035

from ..kernel.protocol import CODE, SEAL, SNAPSHOT, entry_key, read_json, write_json
from . import gc
from .content import remove_tree

RETIRED = "snapshot.retired.json"  # a donor's snapshot.json, while it is taken apart
Seal = Dict[str, Any]  # noqa: UP006 (run at import: hosts may have Python 3.8)


def seal(code: str, entries: list[list[Any]]) -> Seal:
    """Every regular file of the snapshot `code`: path -> [inode, ctime in ns]."""
    sealed: Seal = {}
    for path, kind, value, _ in entries:
        if entry_key(kind, value) is None:
            continue
        info = fresh_stat(f"{code}/{path}")
        if info is not None:
            sealed[path] = [info.st_ino, info.st_ctime_ns]
    return sealed


def fresh_stat(path: str) -> os.stat_result | None:
    """The regular file's attributes as its filesystem's server has them (see above);
    None for anything else, a link included."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    return info if stat.S_ISREG(info.st_mode) else None


class Donor:
    """An ended job's snapshot whose files a new one may take over."""

    def __init__(self, holder: str, sealed: Seal, entries: list[list[Any]]) -> None:
        self.holder = holder
        self.code = os.path.join(holder, CODE)
        self.seal = sealed
        self.keys = {p: entry_key(k, v) for p, k, v, _ in entries}

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
            return cls(holder, seal_of, entries)
        return None

    def take(self, path: str, key: str, target: str) -> bool:
        """Move the donor's file at `path` to `target` when it holds `key` and its seal
        still holds; False (nothing moved) otherwise."""
        sealed = self.seal.get(path)
        if sealed is None or self.keys.get(path) != key:
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

    def dismantle(self) -> None:
        """Remove what is left of the donor's snapshot: it is no snapshot any more."""
        remove_tree(self.code)
        for name in (SEAL, RETIRED):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.holder, name))


def record(job_dir: str, code: str, entries: list[list[Any]]) -> None:
    """Write the snapshot's seal (before its snapshot.json, which makes it one)."""
    write_json(os.path.join(job_dir, SEAL), seal(code, entries))
