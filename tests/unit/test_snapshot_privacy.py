"""The host side of a job's code snapshot: as root, files no other job's writes can
reach (modes stop root, so shared hard links would not do): a fresh object lent to
one snapshot, else a private copy, and the store checks a lent object's hash before
it trusts it again; otherwise hard links to read-only objects; and gc that judges an
object by the manifests of the snapshots it keeps, not by its link count."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from orchestrator.agent.host import proc
from orchestrator.agent.kernel.requests import SnapshotRequest
from orchestrator.agent.store import gc as agent_gc
from orchestrator.agent.store.content import ContentStore, remove_tree
from orchestrator.agent.store.sync import build_tree, copy_private, make_snapshot
from tests.unit.snapshot_support import as_root, ended, key, snapshot, store_tree

CONFIG = b"lr = 0.1\n"
RUN = b"#!/bin/sh\necho run\n"


@pytest.fixture
def store(tmp_path: Path) -> ContentStore:
    return ContentStore(str(tmp_path / "store"))


@as_root
def test_as_root_writing_into_one_snapshot_changes_no_other_and_the_store_notices(
    store: ContentStore, tmp_path: Path
) -> None:
    digest = store_tree(store, {"config.txt": CONFIG, "run.sh": RUN}, executable=("run.sh",))
    a = snapshot(store, digest, tmp_path / "jobs" / "a" / "here")  # lent the fresh objects
    b = snapshot(store, digest, tmp_path / "jobs" / "b" / "here")  # copies
    assert (a / "config.txt").stat().st_ino != (b / "config.txt").stat().st_ino

    with open(a / "config.txt", "r+b") as f:  # same length: sizes still match
        f.write(b"lr = 9.9\n")

    assert (a / "config.txt").read_bytes() == b"lr = 9.9\n"
    assert (b / "config.txt").read_bytes() == CONFIG
    # The next job: the store checks what it lent, drops what changed, asks for it again.
    reply = make_snapshot(
        store, SnapshotRequest(digest=digest, job_dir=str(tmp_path / "jobs" / "c"))
    )
    assert reply == {"missing": [key(CONFIG)]}
    assert not os.path.exists(store.object_path(key(CONFIG)))
    store_tree(store, {"config.txt": CONFIG, "run.sh": RUN}, executable=("run.sh",))
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert (c / "config.txt").read_bytes() == CONFIG and (c / "run.sh").read_bytes() == RUN


@as_root
def test_as_root_a_fresh_object_is_lent_once_and_copied_after(
    store: ContentStore, tmp_path: Path
) -> None:
    digest = store_tree(store, {"config.txt": CONFIG})
    source = Path(store.object_path(key(CONFIG)))
    a = snapshot(store, digest, tmp_path / "jobs" / "a" / "here")
    assert (a / "config.txt").stat().st_ino == source.stat().st_ino, "lent: no copy made"
    b = snapshot(store, digest, tmp_path / "jobs" / "b" / "here")
    assert (b / "config.txt").stat().st_nlink == 1, "a copy: a holds the object"
    # Once nothing holds it, the store checks it, takes it back, and may lend it again.
    for job in ("a", "b"):
        remove_tree(str(tmp_path / "jobs" / job))
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert (c / "config.txt").stat().st_ino == source.stat().st_ino
    assert stat.S_IMODE(source.stat().st_mode) == 0o600 and source.read_bytes() == CONFIG


@as_root
def test_as_root_snapshot_files_are_their_owners_alone_and_keep_the_x_bit(
    store: ContentStore, tmp_path: Path
) -> None:
    digest = store_tree(
        store, {"config.txt": CONFIG, "bin/run.sh": RUN}, executable=("bin/run.sh",)
    )
    code = snapshot(store, digest, tmp_path / "jobs" / "a" / "here")
    assert stat.S_IMODE((code / "config.txt").stat().st_mode) == 0o600
    assert stat.S_IMODE((code / "bin" / "run.sh").stat().st_mode) == 0o700
    assert (code / "config.txt").stat().st_nlink <= 2  # no other snapshot's inode


def test_a_private_copy_is_owner_only_whatever_the_umask(
    store: ContentStore, tmp_path: Path
) -> None:
    store_tree(store, {"run.sh": RUN}, executable=("run.sh",))
    old = os.umask(0o377)  # would take every bit but the owner's read
    try:
        copy_private(store.object_path(key(RUN, True)), str(tmp_path / "run.sh"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run.sh").stat().st_mode) == 0o700
    assert (tmp_path / "run.sh").read_bytes() == RUN


def test_without_copies_snapshots_link_to_read_only_objects(
    store: ContentStore, tmp_path: Path
) -> None:
    digest = store_tree(store, {"config.txt": CONFIG})
    entries = store.manifest(digest)
    assert entries is not None
    for job in ("a", "b"):
        build_tree(store, entries, str(tmp_path / job), copy=False)
    a, b = (tmp_path / "a" / "config.txt").stat(), (tmp_path / "b" / "config.txt").stat()
    assert a.st_ino == b.st_ino == os.stat(store.object_path(key(CONFIG))).st_ino
    assert stat.S_IMODE(a.st_mode) == 0o400


def old(path: str) -> None:
    """Make a store file older than gc's grace period."""
    os.utime(path, (time.time() - 3600, time.time() - 3600))


@as_root
def test_as_root_a_resubmit_takes_over_the_files_of_an_ended_jobs_snapshot(
    store: ContentStore, tmp_path: Path
) -> None:
    digest = store_tree(store, {"config.txt": CONFIG, "run.sh": RUN}, executable=("run.sh",))
    a = snapshot(store, digest, tmp_path / "jobs" / "a" / "here")
    b = snapshot(store, digest, tmp_path / "jobs" / "b" / "here")  # copies: a runs
    inodes = {name: (b / name).stat().st_ino for name in ("config.txt", "run.sh")}
    ended(a)
    ended(b)
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")  # b's files, no copy
    assert {name: (c / name).stat().st_ino for name in inodes} == inodes
    assert (c / "config.txt").read_bytes() == CONFIG and (c / "run.sh").read_bytes() == RUN
    assert os.access(c / "run.sh", os.X_OK)
    assert not b.exists() and not (b.parent / "snapshot.json").exists(), "b is no snapshot now"
    assert a.exists(), "the newest ended snapshot gives, one per build"


@as_root
def test_as_root_a_file_written_since_its_snapshot_was_built_is_not_taken_over(
    store: ContentStore, tmp_path: Path
) -> None:
    digest = store_tree(store, {"config.txt": CONFIG, "run.sh": RUN})
    snapshot(store, digest, tmp_path / "jobs" / "a" / "here")  # holds the lent objects
    b = snapshot(store, digest, tmp_path / "jobs" / "b" / "here")
    written = (b / "config.txt").stat().st_ino
    with open(b / "config.txt", "r+b") as f:  # the job wrote into it (same length)
        f.write(b"lr = 9.9\n")
    ended(b)
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert (c / "config.txt").stat().st_ino != written  # a fresh copy instead
    assert (c / "config.txt").read_bytes() == CONFIG and (c / "run.sh").read_bytes() == RUN


@as_root
def test_as_root_a_running_jobs_snapshot_gives_nothing(store: ContentStore, tmp_path: Path) -> None:
    digest = store_tree(store, {"config.txt": CONFIG})
    snapshot(store, digest, tmp_path / "jobs" / "a" / "here")
    b = snapshot(store, digest, tmp_path / "jobs" / "b" / "here")
    pids = {"pid": os.getpid(), "supervisor": os.getpid(), "host": proc.host_id()}
    (b.parent / "pid.json").write_text(json.dumps(pids))  # b's node runs
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert (c / "config.txt").stat().st_ino != (b / "config.txt").stat().st_ino
    assert (b / "config.txt").read_bytes() == CONFIG and (b.parent / "snapshot.json").exists()


def test_gc_keeps_what_kept_snapshots_list_though_they_hold_copies(
    store: ContentStore, tmp_path: Path
) -> None:
    shared, gone, new = b"shared\n", b"only the finished job's\n", b"only the running job's\n"
    finished = snapshot(
        store, store_tree(store, {"a.py": shared, "b.py": gone}), tmp_path / "jobs" / "1" / "here"
    )
    running = snapshot(
        store, store_tree(store, {"a.py": shared, "c.py": new}), tmp_path / "jobs" / "2" / "here"
    )
    (finished.parent / "exit.json").write_text("{}")  # after: no donor to the running one
    pids = {"pid": os.getpid(), "supervisor": os.getpid(), "host": proc.host_id()}
    (running.parent / "pid.json").write_text(json.dumps(pids))
    leftover = f"{store.objects}/{key(b'cut short')}.push-9.part"
    Path(leftover).write_bytes(b"cut")
    for name in os.listdir(store.objects):
        old(f"{store.objects}/{name}")

    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=60, sweep=True)

    assert report["snapshots_removed"] == 1 and report["running"] == 1
    assert not finished.exists() and (running / "c.py").read_bytes() == new
    assert sorted(os.listdir(store.objects)) == sorted([key(shared), key(new)])
    assert report["objects_removed"] == 2  # the finished job's own object, the leftover


def test_gc_leaves_young_objects_no_manifest_lists_to_the_push_in_flight(
    store: ContentStore,
) -> None:
    store_tree(store, {"a.py": b"being pushed\n"})
    report = agent_gc.sweep_store(store, set(), time.time() - 60)
    assert report["objects_removed"] == 0 and os.listdir(store.objects) == [key(b"being pushed\n")]


def test_gc_keeps_linked_objects_when_a_kept_manifest_cannot_be_read(
    store: ContentStore, tmp_path: Path
) -> None:
    listed, linked, orphan = b"listed\n", b"linked\n", b"orphan\n"
    readable = store_tree(store, {"a.py": listed})
    lost = store_tree(store, {"b.py": linked})
    entries = store.manifest(lost)
    assert entries is not None
    build_tree(store, entries, str(tmp_path / "code"), copy=False)  # links b.py's object
    os.unlink(store.path("manifests", lost))
    store_tree(store, {"c.py": orphan})
    for name in os.listdir(store.objects):
        old(f"{store.objects}/{name}")

    report = agent_gc.sweep_store(store, {readable, lost, "None"}, time.time() - 60)

    assert sorted(os.listdir(store.objects)) == sorted([key(listed), key(linked)])
    assert report["objects_removed"] == 1
