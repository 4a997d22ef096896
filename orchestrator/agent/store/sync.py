"""`sync` (stdin: frames, see kernel/framing.py): store pushed content, then build a job's
code/ snapshot from it. A push never changes another job's files. Every name arrives
framed on stdin, never through a shell.

As another user, a snapshot is hard links into the store: the objects are read-only,
and the snapshots of ten jobs share every unchanged file. As root, modes stop nobody,
so each snapshot gets files of its own: those of an ended job's snapshot that still
hold what was built (takeover.py), else copies (reflinks where the filesystem has
them): a job that writes into one of its files changes no other job's, nor the store."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import time
import zlib
from collections.abc import Iterator
from typing import Any

from ..kernel.fileio import describe_error, read_json, write_bytes, write_json
from ..kernel.framing import read_frame, widen_pipe
from ..kernel.layout import AGENT, CODE, RESERVED_NAMES, SNAPSHOT, TOKEN_RE, entry_key
from ..kernel.messages import parse_message
from ..kernel.replies import SyncReply
from ..kernel.requests import PushHeader, RelayOrder, SnapshotRequest
from . import takeover
from .content import ContentStore, Mismatch, Missing, file_hash, inflate, remove_tree

GC_EVERY_S = 60.0
MAX_MANIFEST = 256 << 20  # a manifest's bytes, decompressed
FICLONE = 0x40049409  # linux/fs.h: share another file's extents, copy on write (btrfs, xfs)
PRIVATE_MODE, PRIVATE_MODE_X = 0o600, 0o700  # a snapshot's own copy: its owner's alone


def main(args: list[str]) -> int:
    """Take pieces of objects, manifests and snapshot requests; answer in one JSON line.

    Frames: H header {"store", "push"} first, then any of P {"k", "off", "size", "z"}
    followed by B (its bytes), R (fetch objects from a relay, relay.py), M (a
    zlib-compressed manifest), S (a snapshot request), and Z at the end.
    """
    widen_pipe(0)
    stream = sys.stdin.buffer
    reply: dict[str, Any] = {"stored": 0, "bytes": 0}
    after: SnapshotRequest | None = None
    store: ContentStore | None = None
    try:
        kind, payload = read_frame(stream)
        header = parse_message(PushHeader, json.loads(payload)) if kind == b"H" else None
        if header is None or not TOKEN_RE.fullmatch(header.push):
            raise ValueError("the stream does not start with a valid header")
        store = ContentStore(os.path.expanduser(header.store))
        after = receive(stream, store, header.push, reply)
    except Mismatch as exc:
        reply.update(error=str(exc), changed=exc.key)
    except (OSError, ValueError, KeyError, TypeError, EOFError, zlib.error, MemoryError) as exc:
        reply["error"] = describe_error(exc)
    if "error" in reply:
        with contextlib.suppress(OSError):
            while stream.read(1 << 20):  # take the rest, so that the reply gets through
                pass
    print(SyncReply(**reply).to_json(), flush=True)
    if after is not None and after.keep is not None and store is not None and gc_due(store):
        from .gc import collect_garbage

        in_background(collect_garbage, os.path.dirname(store.root), after.keep)
    return 1 if "error" in reply else 0


def receive(
    stream: Any, store: ContentStore, push: str, reply: dict[str, Any]
) -> SnapshotRequest | None:
    """Take the frames after the header into the store, counting into `reply`.

    Returns:
        The snapshot request, when a snapshot was built.
    """
    meta: dict[str, Any] = {}
    after = None
    while True:
        kind, payload = read_frame(stream)
        if kind == b"P":
            meta = json.loads(payload)
        elif kind == b"B":
            reply["stored"] += store.put_piece(meta, payload, push)
            reply["bytes"] += len(payload)
        elif kind == b"R":  # fetch from the seed host's relay (relay.py)
            from .relay import fetch

            reply.update(fetch(store, parse_message(RelayOrder, json.loads(payload)), push))
        elif kind == b"M":
            store.add_manifest(inflate(payload, MAX_MANIFEST, "manifest"))
        elif kind == b"S":
            request = parse_message(SnapshotRequest, json.loads(payload))
            reply.update(make_snapshot(store, request))
            after = request if reply.get("snapshot") else None
        elif kind == b"Z":
            return after
        else:
            raise ValueError(f"unknown frame {kind!r}")


def make_snapshot(store: ContentStore, request: SnapshotRequest) -> dict[str, Any]:
    """Build JOB_DIR/code from a stored manifest, if the store holds all of its objects."""
    digest = request.digest
    entries = store.manifest(digest)
    if entries is None:
        return {"need_manifest": True}
    sizes = {key: s for _, k, v, s in entries if (key := entry_key(k, v)) is not None}
    infos = {key: store.info(key) for key in sizes}
    missing = sorted(k for k, info in infos.items() if info is None or info.st_size != sizes[k])
    owned = os.geteuid() == 0  # root writes through any mode: see place_owned
    if owned and not missing:  # objects once lent, now lent no more: lendable if intact
        missing = sorted(
            k for k, info in infos.items() if info and store.unlent(info) and not store.vouch(k)
        )
    if missing:
        return {"missing": missing}
    job_dir = os.path.expanduser(request.job_dir)
    os.makedirs(job_dir, exist_ok=True)
    with store_lock(store) if owned else contextlib.nullcontext():
        built = read_json(os.path.join(job_dir, SNAPSHOT)) or {}
        if built.get("manifest") != digest or not os.path.isdir(os.path.join(job_dir, CODE)):
            try:
                build_snapshot(store, entries, job_dir, digest, owned)
            except Missing as exc:  # collected by a concurrent gc since the check above
                return {"missing": exc.keys}
    # else: a restarted job's shared snapshot, built by its first attempt
    link_nodes(job_dir, list(request.nodes))
    setup = request.setup
    done = setup is not None and os.path.exists(store.setup_marker(setup))
    reply: dict[str, Any] = {"snapshot": True, "setup_done": done}
    if request.env is not None and request.envs is not None:
        from ..host.envs import ready_python

        reply["env_python"] = ready_python(request.envs, request.env)
    return reply


def build_snapshot(
    store: ContentStore, entries: list[list[Any]], job_dir: str, digest: str, owned: bool
) -> None:
    """JOB_DIR/code and its snapshot.json. As root, the files of an ended job's
    snapshot are taken over where they still hold their content (takeover.py), and the
    new snapshot is sealed for the next one.

    Raises:
        Missing: an object went from the store.
    """
    code = os.path.join(job_dir, CODE)
    donor = takeover.Donor.find(os.path.dirname(store.root), store) if owned else None
    try:
        moved = build_tree(store, entries, code, copy=owned, donor=donor)
    finally:
        if donor is not None:
            donor.dismantle()
    if owned:
        known = donor.seals_within(moved) if donor is not None else {}
        takeover.record(job_dir, code, entries, known)
    meta = {"manifest": digest, "created": time.time(), "agent": pin_agent(job_dir)}
    write_json(os.path.join(job_dir, SNAPSHOT), meta)


@contextlib.contextmanager
def store_lock(store: ContentStore) -> Iterator[None]:
    """gc's lock on the store: one root snapshot build at a time, and no gc meanwhile
    (it would remove a donor's files while they are taken over)."""
    os.makedirs(store.root, exist_ok=True)
    with open(store.path("gc.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def pin_agent(job_dir: str) -> str:
    """Link the job directory to the agent version that runs this command: the job's
    later commands (start, follow, setup, each rank's entry) run that version, whatever
    a newer controller sends meanwhile. Returns the version.

    The link is relative: hosts that share the workdir may mount it at other paths.
    """
    # VERSION_DIR/orch_agent/store/sync.py
    version_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    relink(os.path.relpath(version_dir, os.path.abspath(job_dir)), os.path.join(job_dir, AGENT))
    return os.path.basename(version_dir)


def link_nodes(job_dir: str, names: list[str]) -> None:
    """Give each node of a shared snapshot its own directory, linking to the snapshot
    and the job's agent: hosts sharing this filesystem then find them as on a host of
    their own. The names come from the controller: host names, one path component."""
    for name in names:
        if not isinstance(name, str) or "/" in name or "\0" in name or name in RESERVED_NAMES:
            raise ValueError(f"bad node name {name!r}")
        node = os.path.join(job_dir, name)
        os.makedirs(node, exist_ok=True)
        for entry in (CODE, AGENT):
            relink(os.path.join(os.pardir, entry), os.path.join(node, entry))


def relink(target: str, link: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)
    os.symlink(target, link)


def build_tree(
    store: ContentStore,
    entries: list[list[Any]],
    code: str,
    copy: bool,
    donor: takeover.Donor | None = None,
) -> set[str]:
    """Create `code` from the entries, all at once: it appears complete or not at all.

    Symlinks come last, so that no path is ever created through one.

    Args:
        store: holds every object the entries name.
        entries: a manifest's [path, kind, value, size] entries.
        code: the snapshot directory to create; it must not exist.
        copy: give each file a private copy of its object, rather than a hard link.
        donor: an ended snapshot whose sealed directories and files are taken over
            first.

    Returns:
        The directories ("" for the root) that the donor's moved over whole.

    Raises:
        Missing: an object went from the store (a concurrent gc).
    """
    if os.path.lexists(code):
        raise ValueError(f"{code} exists already")
    tmp = f"{code}.part{os.getpid()}"
    whole = donor.whole(entries) if donor else set()
    moved = set()
    if "" in whole and donor and donor.take_dir("", tmp):
        moved.add("")
    else:
        os.makedirs(tmp)
    try:
        if not moved:
            _fill(store, entries, tmp, copy, donor, whole, moved)
        os.rename(tmp, code)
    except BaseException:
        remove_tree(tmp)
        raise
    return moved


def _fill(
    store: ContentStore,
    entries: list[list[Any]],
    tmp: str,
    copy: bool,
    donor: takeover.Donor | None,
    whole: set[str],
    moved: set[str],
) -> None:
    """build_tree's directories, files and links in `tmp`, where no directory of the
    donor's moved (adding to `moved` those that do)."""

    def within_moved(path: str) -> bool:
        return any(d in moved for d in takeover.above(path))

    for path in sorted(takeover.tree_dirs(entries), key=lambda d: d.count("/")):  # parents first
        if within_moved(path):
            continue
        if path in whole and donor and donor.take_dir(path, f"{tmp}/{path}"):
            moved.add(path)
        else:
            os.mkdir(f"{tmp}/{path}")
    for path, kind, value, _ in entries:
        key = entry_key(kind, value)
        if key is None or (moved and within_moved(path)):
            continue
        if not (donor and donor.take(path, key, f"{tmp}/{path}")):
            place(store, key, f"{tmp}/{path}", copy)
    for path, kind, value, _ in entries:
        if kind == "l" and not (moved and within_moved(path)):
            os.symlink(value, f"{tmp}/{path}")


def place(store: ContentStore, key: str, target: str, copy: bool) -> None:
    """Put the object `key` at `target`: a hard link into the store, or with `copy`
    (or where the filesystem refuses the link) a private copy.

    Raises:
        Missing: the store has no such object.
    """
    source = f"{store.objects}/{key}"
    try:
        if copy:
            place_owned(store, key, target)
        else:
            os.link(source, target)
    except FileNotFoundError:
        if not os.path.exists(source):
            raise Missing([key]) from None
        raise
    except OSError as exc:  # too many links, another filesystem, or no hard links at all
        if copy or exc.errno not in (errno.EMLINK, errno.EXDEV, errno.EPERM, errno.ENOTSUP):
            raise
        copy_private(source, target)


def place_owned(store: ContentStore, key: str, target: str) -> None:
    """Put the object at `target` for a root job, whose writes no mode stops: a file
    no other snapshot shares.

    An object no snapshot has yet (as the push just stored it) is lent: linked, and
    marked (its mtime) so that the store checks its hash before it trusts it again.
    Else a private copy, checked by its hash too: a job that holds the object may
    have written into it.

    Raises:
        Missing: the object went, or did not hold its content (it is dropped: the
            push sends it again).
    """
    source = f"{store.objects}/{key}"
    if store.pristine(key) and os.stat(source).st_nlink == 1:
        os.link(source, target)
        if os.stat(target).st_nlink == 2:  # this snapshot's alone, with the store
            os.chmod(target, PRIVATE_MODE_X if key.endswith(".x") else PRIVATE_MODE)
            os.utime(target)
            return
        os.unlink(target)  # another snapshot took it at the same moment
    copy_private(source, target)
    if file_hash(target).hexdigest() != key[:64]:
        with contextlib.suppress(OSError):
            os.unlink(source)
        raise Missing([key])


def copy_private(source: str, target: str) -> None:
    """Create `target` as a copy of the object `source` that is its owner's alone and
    writable (0600, 0700 for an `.x` object): writing into it changes nothing else.

    A reflink where the filesystem shares extents (btrfs, xfs: no bytes move until one
    side writes); else the kernel copies (copy_file_range); else through a buffer.
    """
    mode = PRIVATE_MODE_X if source.endswith(".x") else PRIVATE_MODE
    with open(source, "rb", buffering=0) as src:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(dst, mode)  # whatever the umask took away
            try:
                fcntl.ioctl(dst, FICLONE, src.fileno())
            except OSError:  # no shared extents here (ext4, tmpfs, NFS, across filesystems)
                copy_bytes(src.fileno(), dst)
        finally:
            os.close(dst)


def copy_bytes(src: int, dst: int) -> None:
    """Copy the rest of `src` to `dst`, in the kernel where it can."""
    try:
        while os.copy_file_range(src, dst, 1 << 30):
            pass
    except OSError:  # not on this kernel or between these filesystems: both offsets hold
        while data := os.read(src, 1 << 20):
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view) :]


def in_background(function: Any, *args: Any) -> None:
    """Run `function` in a detached grandchild, after this command answered."""
    sys.stdout.flush()
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # let go of the SSH channel
            os.dup2(devnull, fd)
        function(*args)
    finally:
        os._exit(0)


def gc_due(store: ContentStore) -> bool:
    """Whether a push should collect in the background: at most once a minute, since
    a finished job's snapshot may wait that long, and pushes come in bursts."""
    stamp = store.path("gc.last")
    try:
        if time.time() - os.path.getmtime(stamp) < GC_EVERY_S:
            return False
    except OSError:
        pass
    with contextlib.suppress(OSError):
        write_bytes(stamp, b"", 0o600)
    return True
