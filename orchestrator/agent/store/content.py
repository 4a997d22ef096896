"""The host's content store, WORKDIR/store: objects/<sha256>[.x] (read-only; `.x` is
executable; one flat directory, as every mkdir and rename costs a journal commit on a
busy disk), manifests/<digest> and setup/<key> (done markers). Content is addressed by
its sha256 and written whole or not at all."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zlib
from typing import Any

from ..kernel.fileio import write_bytes
from ..kernel.layout import DIGEST_RE, KEY_RE, setup_marker

OBJECT_MODE, OBJECT_MODE_X = 0o400, 0o500
# The mtime of an object as the push stored it, verified by its hash: no snapshot ever
# had a link to write through. Lending it to a snapshot (root, sync.py) or a write
# through one changes it, and the store verifies the object before it trusts it again.
PRISTINE_NS = 946684800 * 10**9  # 2000-01-01


class Mismatch(ValueError):
    """Received bytes whose hash is not their key: the file changed during the push."""

    def __init__(self, key: str) -> None:
        super().__init__(f"content of object {key} does not match its hash")
        self.key = key


class Missing(Exception):
    """A snapshot needs objects the store lacks."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"{len(keys)} objects missing")
        self.keys = keys


class ContentStore:
    """WORKDIR/store: content addressed by sha256, written whole or not at all."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.objects = os.path.join(root, "objects")
        self._made: set[str] = set()

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def made(self, path: str) -> str:
        """`path`, created if need be (once per command: a push makes thousands of calls)."""
        if path not in self._made:
            os.makedirs(path, exist_ok=True)
            self._made.add(path)
        return path

    def object_path(self, key: str) -> str:
        """Where an object lives. Keys from the wire are checked here; keys from a
        stored manifest were checked when it was stored."""
        if not KEY_RE.fullmatch(key):
            raise ValueError(f"bad object key {key!r}")
        return f"{self.objects}/{key}"

    def info(self, key: str) -> os.stat_result | None:
        """The object's attributes; None when the store lacks it."""
        try:
            return os.stat(f"{self.objects}/{key}")
        except OSError:
            return None

    def pristine(self, key: str) -> bool:
        """Whether the object is as the push stored it: never lent, never written."""
        try:
            return os.stat(f"{self.objects}/{key}").st_mtime_ns == PRISTINE_NS
        except OSError:
            return False

    @staticmethod
    def unlent(info: os.stat_result) -> bool:
        """Whether the object (its `info`) was lent and nothing links it any more: no
        snapshot can write into it now, and `vouch` makes it lendable again if it is
        intact."""
        return info.st_mtime_ns != PRISTINE_NS and info.st_nlink == 1

    def vouch(self, key: str) -> bool:
        """Check an object that was lent by its hash: True, and pristine again when
        nothing links it any more, if it holds its content; else it goes, for the
        push to send it again (a job wrote into its snapshot's file)."""
        path = f"{self.objects}/{key}"
        try:
            if file_hash(path).hexdigest() != key[:64]:
                os.unlink(path)
                return False
            if os.stat(path).st_nlink == 1:  # nothing can write into it any more
                os.chmod(path, OBJECT_MODE_X if key.endswith(".x") else OBJECT_MODE)
                os.utime(path, ns=(PRISTINE_NS, PRISTINE_NS))
            return True
        except OSError:
            return False

    def put_piece(self, meta: dict[str, Any], data: bytes, push: str) -> bool:
        """Write one piece of an object; True when it completed (and was verified)."""
        key, size, off = str(meta["k"]), int(meta["size"]), int(meta["off"])
        final = self.object_path(key)
        if off < 0 or off > size:
            raise ValueError(f"piece of {key} out of bounds")
        if meta.get("z"):  # never more than the object has room for: no bombs
            data = inflate(data, size - off, f"piece of {key}")
        end = off + len(data)
        if end > size:
            raise ValueError(f"piece of {key} out of bounds")
        # Beside its final name: the rename then touches one directory only.
        tmp = f"{self.made(self.objects)}/{key}.{push}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if off == 0 else 0), 0o600)
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(fd, memoryview(data)[written:], off + written)
            if end == size:
                digest = hashlib.sha256(data) if off == 0 else file_hash(tmp)
                if digest.hexdigest() != key[:64]:
                    os.unlink(tmp)
                    raise Mismatch(key)
                # Read-only: the object is shared by every snapshot that links to it;
                # and the owner's only: what was pushed is nobody else's business.
                os.fchmod(fd, OBJECT_MODE_X if key.endswith(".x") else OBJECT_MODE)
                os.utime(fd, ns=(PRISTINE_NS, PRISTINE_NS))
        finally:
            os.close(fd)
        if end < size:
            return False
        publish(tmp, final)
        return True

    def add_manifest(self, body: bytes) -> str:
        parse_manifest(body)
        digest = hashlib.sha256(body).hexdigest()
        write_bytes(os.path.join(self.made(self.path("manifests")), digest), body, 0o600)
        return digest

    def manifest(self, digest: str) -> list[list[Any]] | None:
        if not DIGEST_RE.fullmatch(digest):
            raise ValueError(f"bad manifest digest {digest!r}")
        try:
            with open(self.path("manifests", digest), "rb") as f:
                entries: list[list[Any]] = json.loads(f.read())["entries"]
                return entries  # checked by parse_manifest before it was stored
        except FileNotFoundError:
            return None

    def setup_marker(self, key: str) -> str:
        return setup_marker(self.root, key)


def inflate(data: bytes, limit: int, what: str) -> bytes:
    """zlib-decompress `data`, refusing it once it would exceed `limit` bytes."""
    inflater = zlib.decompressobj()
    out = inflater.decompress(data, limit + 1)
    if len(out) > limit or not inflater.eof:
        raise ValueError(f"{what}: compressed data larger than announced, or cut short")
    return out


def publish(tmp: str, final: str) -> None:
    """Give a verified object its final name, never replacing one already there: two
    writers of one object (hosts sharing the store, two pushes at once) wrote the same
    bytes, and snapshots may link to the first. A hard link is atomic on NFS too;
    a retransmitted one may say EEXIST although it made the link, which is as good."""
    try:
        os.link(tmp, final)
    except FileExistsError:
        if os.stat(final).st_size != os.stat(tmp).st_size:  # not an object: replace it
            os.replace(tmp, final)
            return
    except OSError:  # a filesystem without hard links
        os.replace(tmp, final)
        return
    os.unlink(tmp)


def file_hash(path: str) -> Any:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest


def parse_manifest(body: bytes) -> list[list[Any]]:
    """The entries [path, kind, value, size] of a manifest, refused unless every path
    stays inside the snapshot: relative, no `..`, and never below a file or symlink."""
    entries: list[list[Any]] = json.loads(body)["entries"]
    if not all(isinstance(e, list) and len(e) == 4 and isinstance(e[0], str) for e in entries):
        raise ValueError("malformed manifest")
    leaves = {path for path, kind, _, _ in entries if kind != "d"}
    for path, kind, value, size in entries:
        parts = path.split("/")
        if (
            "\0" in path
            or any(p in ("", ".", "..") for p in parts)
            or any("/".join(parts[:i]) in leaves for i in range(1, len(parts)))
            or kind not in ("f", "x", "l", "d")
            or not isinstance(value, str)
            or (kind in ("f", "x") and not DIGEST_RE.fullmatch(value))
            or not isinstance(size, int)
        ):
            raise ValueError(f"unsafe manifest entry {path!r}")
    return entries


def remove_tree(path: str) -> None:
    import shutil

    def writable(function: Any, failed: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            function(failed)

    shutil.rmtree(path, onerror=writable)
