"""The workdir manifest: hashes, the stat cache, the digest, and the per-host diff."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from orchestrator.sync.ignore import collect_files
from orchestrator.sync.manifest import HostMemory, Tree, scan
from orchestrator.sync.push import ASK_FIRST_BYTES, HostPlan

OLD = time.time() - 3600  # an mtime well outside the racy window


def write(root: Path, rel: str, data: bytes, mtime: float | None = OLD) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def tree_of(root: Path, cache: Path) -> Tree:
    return scan(root, collect_files(root), cache_dir=cache)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_unchanged_size_and_mtime_reuse_the_cached_hash(tmp_path: Path) -> None:
    root, cache = tmp_path / "w", tmp_path / "cache"
    path = write(root, "a.py", b"one")
    assert tree_of(root, cache).entries[0].value == sha(b"one")
    # Same size, same mtime: the cache answers without reading the file (which is why
    # the racy window below exists).
    write(root, "a.py", b"two")
    assert tree_of(root, cache).entries[0].value == sha(b"one")
    os.utime(path, (OLD + 1, OLD + 1))
    assert tree_of(root, cache).entries[0].value == sha(b"two")


def test_a_size_change_is_rehashed_even_with_the_same_mtime(tmp_path: Path) -> None:
    root, cache = tmp_path / "w", tmp_path / "cache"
    write(root, "a.py", b"one")
    tree_of(root, cache)
    write(root, "a.py", b"three")
    assert tree_of(root, cache).entries[0].value == sha(b"three")


def test_a_file_modified_just_now_is_never_trusted_to_the_cache(tmp_path: Path) -> None:
    root, cache = tmp_path / "w", tmp_path / "cache"
    now = time.time()
    write(root, "a.py", b"one", mtime=now)
    tree_of(root, cache)
    write(root, "a.py", b"two", mtime=now)  # within the same timestamp as the hashing
    assert tree_of(root, cache).entries[0].value == sha(b"two")


def test_the_digest_names_the_content_not_the_scan(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root, mtime in ((a, OLD), (b, OLD - 100)):
        write(root, "x/1.py", b"1", mtime)
        write(root, "2.py", b"2", mtime)
    first = tree_of(a, tmp_path / "c1")
    assert first.digest == tree_of(b, tmp_path / "c2").digest  # mtimes do not matter
    assert first.digest == tree_of(a, tmp_path / "c1").digest


def test_the_digest_changes_with_content_mode_links_and_deletions(tmp_path: Path) -> None:
    root, cache = tmp_path / "w", tmp_path / "cache"
    write(root, "a.py", b"a")
    write(root, "b.py", b"b")
    (root / "link").symlink_to("a.py")
    seen = {tree_of(root, cache).digest}
    write(root, "a.py", b"AA")
    seen.add(tree_of(root, cache).digest)
    (root / "a.py").chmod(0o755)
    seen.add(tree_of(root, cache).digest)
    (root / "link").unlink()
    (root / "link").symlink_to("b.py")
    seen.add(tree_of(root, cache).digest)
    (root / "b.py").unlink()
    seen.add(tree_of(root, cache).digest)
    (root / "empty").mkdir()
    seen.add(tree_of(root, cache).digest)
    assert len(seen) == 6


def test_identical_files_are_one_object_but_executable_copies_are_another(
    tmp_path: Path,
) -> None:
    root = tmp_path / "w"
    write(root, "a/__init__.py", b"")
    write(root, "b/__init__.py", b"")
    write(root, "run.sh", b"")
    (root / "run.sh").chmod(0o755)
    tree = tree_of(root, tmp_path / "cache")
    assert sorted(tree.objects) == [sha(b""), sha(b"") + ".x"]


def test_memory_keeps_the_last_three_manifests_of_a_host(tmp_path: Path) -> None:
    memory = HostMemory(tmp_path)
    for n in range(5):
        memory.remember("root@10.0.0.1:22:~/.orch", f"d{n}", [f"k{n}", "shared"])
    memory.remember("root@10.0.0.1:22:~/.orch", "d3", ["k3", "shared"])  # d3 again: newest
    recalled = memory.recall("root@10.0.0.1:22:~/.orch")
    assert [digest for digest, _ in recalled] == ["d3", "d4", "d2"]
    assert memory.recall("root@10.0.0.2:22:~/.orch") == []


def test_diff_against_a_known_host_sends_only_what_changed(tmp_path: Path) -> None:
    root, cache = tmp_path / "w", tmp_path / "cache"
    write(root, "a.py", b"a")
    write(root, "b.py", b"b")
    before = tree_of(root, cache)
    recalled = [(before.digest, list(before.objects))]
    assert HostPlan.of(before, recalled) == HostPlan((), False)  # unchanged: only the check

    write(root, "a.py", b"edited")
    edited = tree_of(root, cache)
    assert HostPlan.of(edited, recalled) == HostPlan((sha(b"edited"),), True)

    (root / "b.py").unlink()
    write(root, "a.py", b"a", OLD + 5)
    deleted = tree_of(root, cache)
    assert HostPlan.of(deleted, recalled) == HostPlan((), True)  # a new manifest, no content


def test_a_host_nothing_is_known_of_is_asked_unless_the_tree_is_small(tmp_path: Path) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    write(small, "a.py", b"a")
    write(big, "data.bin", os.urandom(ASK_FIRST_BYTES + 1))
    small_tree = tree_of(small, tmp_path / "c1")
    assert HostPlan.of(small_tree, []) == HostPlan(tuple(small_tree.objects), True)
    assert HostPlan.of(tree_of(big, tmp_path / "c2"), []) == HostPlan(None, True)


def test_special_files_are_left_out_rather_than_read(tmp_path: Path) -> None:
    root = tmp_path / "w"
    write(root, "a.py", b"a")
    os.mkfifo(root / "pipe")  # reading it would block the scan forever
    assert [e.path for e in tree_of(root, tmp_path / "cache").entries] == ["a.py"]
