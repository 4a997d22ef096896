"""As root, a resubmit's snapshot takes over an ended job's (agent/store/takeover.py):
whole directories by one rename where nothing in them changed, file by file where
something did, and nothing the ended job wrote."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from orchestrator.agent.kernel.requests import SnapshotRequest
from orchestrator.agent.store import takeover
from orchestrator.agent.store.content import ContentStore
from orchestrator.agent.store.sync import make_snapshot
from tests.unit.snapshot_support import as_root, ended, snapshot, store_tree

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


def ended_donor(
    store: ContentStore, tmp_path: Path, digest: str = ""
) -> tuple[str, Path, dict[str, int]]:
    """The digest (TREE's unless given), an ended job's snapshot of it whose files
    are all its own (copies, not lent objects), and its inodes."""
    digest = digest or store_tree(store, TREE)
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
    digest, _, before = ended_donor(store, tmp_path, store_with_links(store))
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


def assert_sealed(code: Path) -> None:
    """Every value of the snapshot's seal is what a fresh look at its path gives."""
    seal = json.loads((code.parent / "seal.json").read_text())
    for path, value in seal.items():
        info = (code / path.rstrip("/")).lstat() if path != "/" else code.lstat()
        assert [info.st_ino, info.st_ctime_ns] == value, path


@as_root
def test_a_file_the_job_left_at_the_root_stays_behind(store: ContentStore, tmp_path: Path) -> None:
    digest, b, before = ended_donor(store, tmp_path)
    (b / "output.log").write_text("written by the job\n")
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    after = inodes(c)
    assert contents(c) == TREE
    assert after["."] != before["."] and after["pkg"] == before["pkg"]


@as_root
def test_a_file_that_became_executable_with_the_same_bytes_spoils_its_directory(
    store: ContentStore, tmp_path: Path
) -> None:
    _, _, before = ended_donor(store, tmp_path)
    digest = store_tree(store, TREE, executable=("pkg/deep/util.py",))
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert os.access(c / "pkg/deep/util.py", os.X_OK)
    assert not os.access(c / "pkg/model.py", os.X_OK)
    assert inodes(c)["pkg/deep"] != before["pkg/deep"] and contents(c) == TREE


@as_root
def test_a_nested_move_seals_the_next_snapshot_and_a_later_write_is_still_seen(
    store: ContentStore, tmp_path: Path
) -> None:
    digest, b, before = ended_donor(store, tmp_path)
    (b / "pkg/__pycache__").mkdir()  # spoils pkg and the root: data moves as a subtree
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert inodes(c)["data"] == before["data"] and inodes(c)["."] != before["."]
    assert_sealed(c)
    ended(c)
    with open(c / "data/more/labels.txt", "r+b") as f:  # the next run wrote into it
        f.write(b"cow")
    d = snapshot(store, digest, tmp_path / "jobs" / "d" / "here")
    assert contents(d) == TREE
    assert inodes(d)["data/more/labels.txt"] != before["data/more/labels.txt"]
    assert inodes(d)["data/config.txt"] == before["data/config.txt"]
    assert_sealed(d)


@as_root
def test_a_file_the_job_put_in_an_empty_directory_stays_behind(
    store: ContentStore, tmp_path: Path
) -> None:
    digest, b, _ = ended_donor(store, tmp_path, store_with_links(store))
    (b / "logs/run.log").write_text("written by the job\n")
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    assert list((c / "logs").iterdir()) == []
    assert contents(c) == {**TREE, "data/latest": TREE["data/config.txt"]}


@as_root
def test_nothing_is_taken_through_a_link_put_in_place_of_a_directory(
    store: ContentStore, tmp_path: Path
) -> None:
    digest, b, before = ended_donor(store, tmp_path)
    (b / "data").rename(b / "moved")  # the job moved it and linked the old name to it
    (b / "data").symlink_to("moved")
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    after = inodes(c)
    assert (c / "data").is_dir() and not (c / "data").is_symlink()
    assert contents(c) == TREE and not (c / "moved").exists()
    assert after["data/more"] != before["data/more"]
    assert after["data/config.txt"] != before["data/config.txt"]
    assert after["pkg"] == before["pkg"]


@as_root
def test_a_directory_that_cannot_move_is_built_file_by_file(
    store: ContentStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest, _, before = ended_donor(store, tmp_path)
    monkeypatch.setattr(takeover.Donor, "take_dir", lambda self, path, target: False)
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    after = inodes(c)
    assert contents(c) == TREE and after["."] != before["."] and after["pkg"] != before["pkg"]
    assert after["pkg/model.py"] == before["pkg/model.py"], "its files still taken over"
    assert_sealed(c)


@as_root
def test_a_snapshot_hosts_shared_gives_its_files_one_by_one(
    store: ContentStore, tmp_path: Path
) -> None:
    """On a shared filesystem another host's write into a directory may not show in its
    ctime here yet (the attribute cache): such a donor's directories never move whole."""
    digest = store_tree(store, TREE)
    snapshot(store, digest, tmp_path / "jobs" / "a" / "here")  # holds the lent objects
    shared = tmp_path / "jobs" / "b"
    reply = make_snapshot(
        store, SnapshotRequest(digest=digest, job_dir=str(shared), nodes=["h1", "h2"])
    )
    assert reply.get("snapshot") is True, reply
    for node in ("h1", "h2"):
        (shared / node / "exit.json").write_text("{}")
    before = inodes(shared / "code")
    c = snapshot(store, digest, tmp_path / "jobs" / "c" / "here")
    after = inodes(c)
    assert contents(c) == TREE
    assert after["."] != before["."] and after["pkg"] != before["pkg"]
    assert all(after[p] == before[p] for p in TREE), "its files still taken over"
