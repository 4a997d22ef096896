"""As root, a resubmit's snapshot takes over an ended job's (agent/store/takeover.py):
whole directories by one rename where nothing in them changed, file by file where
something did, and nothing the ended job wrote."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from orchestrator.agent.store.content import ContentStore
from tests.unit.test_snapshot_privacy import as_root, ended, snapshot, store_tree

TREE = {
    "train.py": b"print('train')\n",
    "pkg/model.py": b"W = 1\n",
    "pkg/deep/util.py": b"U = 2\n",
    "data/config.txt": b"lr = 0.1\n",
    "data/more/labels.txt": b"cat\ndog\n",
}


@pytest.fixture
def store(tmp_path: Path) -> ContentStore:
    return ContentStore(str(tmp_path / "store"))


def inodes(code: Path) -> dict[str, int]:
    """Every file's and directory's inode under `code`, by relative path ("." the root)."""
    found = {".": code.stat().st_ino}
    for path in code.rglob("*"):
        found[str(path.relative_to(code))] = path.lstat().st_ino
    return found


def contents(code: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(code)): p.read_bytes() for p in sorted(code.rglob("*")) if p.is_file()
    }


def ended_donor(store: ContentStore, tmp_path: Path) -> tuple[str, Path, dict[str, int]]:
    """TREE's digest, an ended job's snapshot of it whose files are all its own
    (copies, not lent objects), and its inodes."""
    digest = store_tree(store, TREE)
    snapshot(store, digest, tmp_path / "jobs" / "a" / "here")  # holds the lent objects
    b = snapshot(store, digest, tmp_path / "jobs" / "b" / "here")
    ended(b)
    return digest, b, inodes(b)


@as_root
def test_an_unchanged_resubmit_moves_the_whole_tree_and_seals_it_for_the_next(
    store: ContentStore, tmp_path: Path
) -> None:
    digest, _, before = ended_donor(store, tmp_path)
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert inodes(c) == before, "every directory and file moved over, none made anew"
    assert contents(c) == TREE
    seal = json.loads((c.parent / "seal.json").read_text())
    assert {"/", "pkg/", "pkg/deep/", "data/", "data/more/"} <= seal.keys()
    ended(c)
    d = snapshot(store, digest, tmp_path / "jobs" / "d" / "here")
    assert inodes(d) == before, "the new seal holds: the next one moves it again"


@as_root
def test_a_directory_the_job_wrote_into_is_taken_file_by_file_and_its_siblings_whole(
    store: ContentStore, tmp_path: Path
) -> None:
    digest, b, before = ended_donor(store, tmp_path)
    (b / "pkg/deep/__pycache__").mkdir()  # the job imported pkg.deep.util
    (b / "pkg/deep/__pycache__/util.cpython-311.pyc").write_bytes(b"\0")
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    after = inodes(c)
    assert contents(c) == TREE, "nothing the job wrote comes along"
    for same in ("data", "pkg/deep/util.py", "pkg/model.py", "train.py"):
        assert after[same] == before[same], same
    for anew in (".", "pkg", "pkg/deep"):  # the written one and those above it
        assert after[anew] != before[anew], anew


@as_root
def test_a_changed_file_spoils_its_directories_only(store: ContentStore, tmp_path: Path) -> None:
    _, _, before = ended_donor(store, tmp_path)
    changed = {**TREE, "data/more/labels.txt": b"cat\ndog\nbird\n"}
    del changed["pkg/deep/util.py"]
    c = snapshot(store, store_tree(store, changed), tmp_path / "jobs" / "c" / "here")
    after = inodes(c)
    assert contents(c) == changed
    assert after["data/config.txt"] == before["data/config.txt"], "its file taken over"
    assert after["data"] != before["data"] and after["pkg"] != before["pkg"]
    assert after["data/more/labels.txt"] != before["data/more/labels.txt"]
    assert not (c / "pkg/deep").exists()


@as_root
def test_a_directory_whose_mode_changed_is_not_moved(store: ContentStore, tmp_path: Path) -> None:
    digest, b, before = ended_donor(store, tmp_path)
    os.chmod(b / "data/more", 0o777)
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    after = inodes(c)
    assert after["data/more"] != before["data/more"]
    assert (c / "data/more").stat().st_mode & 0o777 != 0o777
    assert after["data/more/labels.txt"] == before["data/more/labels.txt"]
    assert after["pkg"] == before["pkg"]


@as_root
def test_a_seal_without_directories_still_gives_its_files(
    store: ContentStore, tmp_path: Path
) -> None:
    """An older agent's seal: files only."""
    digest, b, before = ended_donor(store, tmp_path)
    seal_file = b.parent / "seal.json"
    seal = json.loads(seal_file.read_text())
    seal_file.write_text(json.dumps({p: v for p, v in seal.items() if not p.endswith("/")}))
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    after = inodes(c)
    assert contents(c) == TREE
    assert all(after[p] == before[p] for p in TREE) and after["pkg"] != before["pkg"]


def store_with_links(store: ContentStore) -> str:
    """TREE, a symlink `data/latest` -> `config.txt` and an empty directory `logs`."""
    store_tree(store, TREE)
    entries = [
        [path, "f", hashlib.sha256(data).hexdigest(), len(data)] for path, data in TREE.items()
    ]
    entries += [["data/latest", "l", "config.txt", 0], ["logs", "d", "", 0]]
    return store.add_manifest(json.dumps({"v": 1, "entries": entries}).encode())


@as_root
def test_links_and_empty_directories_move_with_their_tree_and_a_replaced_link_spoils_it(
    store: ContentStore, tmp_path: Path
) -> None:
    digest = store_with_links(store)
    snapshot(store, digest, tmp_path / "jobs" / "a" / "here")
    b = snapshot(store, digest, tmp_path / "jobs" / "b" / "here")
    ended(b)
    before = inodes(b)
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert inodes(c) == before
    assert os.readlink(c / "data/latest") == "config.txt" and (c / "logs").is_dir()
    ended(c)
    (c / "data/latest").unlink()  # the job pointed the link elsewhere
    (c / "data/latest").symlink_to("more/labels.txt")
    d = snapshot(store, digest, tmp_path / "jobs" / "d" / "here")
    after = inodes(d)
    assert os.readlink(d / "data/latest") == "config.txt", "the manifest's link, made anew"
    assert after["data"] != before["data"] and after["pkg"] == before["pkg"]
    assert after["logs"] == before["logs"]
