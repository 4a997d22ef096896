"""Helpers the unit tests of a host's content store and snapshots share
(test_snapshot_privacy.py, test_takeover.py): objects and manifests stored as a push
stores them, snapshots built as the agent's `sync` builds them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from orchestrator.agent.kernel.requests import SnapshotRequest
from orchestrator.agent.store.content import ContentStore
from orchestrator.agent.store.sync import make_snapshot

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the private copies are root's")


def key(data: bytes, executable: bool = False) -> str:
    return hashlib.sha256(data).hexdigest() + (".x" if executable else "")


def store_tree(
    store: ContentStore, files: dict[str, bytes], executable: tuple[str, ...] = ()
) -> str:
    """Put `files` (path -> content) into the store, as a push does, with a manifest
    that lists them; the paths in `executable` as such. Returns the manifest's digest."""
    entries = []
    for path, data in files.items():
        x = path in executable
        piece = {"k": key(data, x), "off": 0, "size": len(data), "z": 0}
        store.put_piece(piece, data, "push-0")
        entries.append([path, "x" if x else "f", hashlib.sha256(data).hexdigest(), len(data)])
    return store.add_manifest(json.dumps({"v": 1, "entries": entries}).encode())


def snapshot(store: ContentStore, digest: str, job_dir: Path) -> Path:
    """Build job_dir/code from a stored manifest, as the agent's `sync` does."""
    reply = make_snapshot(store, SnapshotRequest(digest=digest, job_dir=str(job_dir)))
    assert reply.get("snapshot") is True, reply
    return job_dir / "code"


def ended(code: Path) -> None:
    """Mark the node of the snapshot `code` ended, as its supervisor does."""
    (code.parent / "exit.json").write_text("{}")
