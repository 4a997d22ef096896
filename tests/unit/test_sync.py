"""Which files are pushed, and the manifest that describes them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.nodes import agent
from orchestrator.sync.ignore import collect_files
from orchestrator.sync.manifest import Entry, Tree, scan_workdir
from tests.hostile_names import TEXT_NAMES


@pytest.fixture(autouse=True)
def _orch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stat cache goes to a fresh $ORCH_HOME, never the user's."""
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "orch-home"))


def make_tree(root: Path, files: dict[str, str]) -> Path:
    """Create `files` (relative path -> content; a trailing / makes a directory)."""
    for rel, content in files.items():
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def entries(tree: Tree) -> dict[str, Entry]:
    return {e.path: e for e in tree.entries}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_gitignore_at_the_root_excludes_matching_files(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            ".gitignore": "*.log\n__pycache__/\n",
            "train.py": "",
            "run.log": "",
            "sub/deep.log": "",
            "sub/model.py": "",
            "__pycache__/train.cpython-311.pyc": "",
        },
    )
    assert collect_files(tmp_path) == [".gitignore", "sub/model.py", "train.py"]


def test_negation_brings_a_file_back(tmp_path: Path) -> None:
    make_tree(
        tmp_path, {".gitignore": "*.log\n!keep.log\n", "a.log": "", "keep.log": "", "x.py": ""}
    )
    assert collect_files(tmp_path) == [".gitignore", "keep.log", "x.py"]


def test_directory_pattern_excludes_directories_but_not_files_of_that_name(
    tmp_path: Path,
) -> None:
    make_tree(
        tmp_path,
        {
            ".gitignore": "build/\n",
            "build/out.o": "",
            "sub/build/out.o": "",
            "src/build": "a file, not a directory",
        },
    )
    assert collect_files(tmp_path) == [".gitignore", "src/build"]


def test_orchignore_excludes_like_gitignore(tmp_path: Path) -> None:
    make_tree(tmp_path, {".orchignore": "data/\n*.pt\n", "data/x.bin": "", "m.pt": "", "t.py": ""})
    assert collect_files(tmp_path) == [".orchignore", "t.py"]


def test_orchignore_negation_wins_over_gitignore_in_the_same_directory(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {".gitignore": "*.pt\n", ".orchignore": "!init.pt\n", "init.pt": "", "ckpt.pt": ""},
    )
    assert collect_files(tmp_path) == [".gitignore", ".orchignore", "init.pt"]


def test_nested_ignore_file_applies_only_below_its_directory(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            "sub/.gitignore": "*.csv\n/only_here.txt\n",
            "top.csv": "",
            "only_here.txt": "",
            "sub/a.csv": "",
            "sub/only_here.txt": "",
            "sub/deeper/b.csv": "",
            "sub/deeper/only_here.txt": "",
        },
    )
    assert collect_files(tmp_path) == [
        "only_here.txt",
        "sub/.gitignore",
        "sub/deeper/only_here.txt",
        "top.csv",
    ]


def test_deeper_ignore_file_overrides_the_root(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            ".gitignore": "*.log\n",
            "sub/.orchignore": "!wanted.log\n",
            "sub/wanted.log": "",
            "sub/other.log": "",
            "wanted.log": "",
        },
    )
    assert collect_files(tmp_path) == [".gitignore", "sub/.orchignore", "sub/wanted.log"]


def test_job_exclude_patterns_are_applied(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {"train.py": "", "ckpt/a.pt": "", "notes.md": "", "sub/notes.md": "", "w.pt": ""},
    )
    assert collect_files(tmp_path, exclude=["ckpt/", "*.md", "/w.pt"]) == ["train.py"]


def test_git_directory_is_always_excluded(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            ".git/config": "",
            ".git/objects/ab/cdef": "",
            "vendor/lib/.git/HEAD": "",
            "vendor/lib/lib.py": "",
            "train.py": "",
        },
    )
    assert collect_files(tmp_path) == ["train.py", "vendor/lib/lib.py"]


def test_whitelist_ignore_file_keeps_what_git_would_keep(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            # ignore everything, then bring back directories and Python files
            ".orchignore": "*\n!*/\n!*.py\n",
            "train.py": "",
            "data.bin": "",
            "pkg/model.py": "",
            "pkg/weights.pt": "",
        },
    )
    assert collect_files(tmp_path) == ["pkg/model.py", "train.py"]


def test_git_directory_stays_excluded_despite_a_negation(tmp_path: Path) -> None:
    make_tree(tmp_path, {".gitignore": "!.git/\n", ".git/config": "", "train.py": ""})
    assert collect_files(tmp_path) == [".gitignore", "train.py"]


def test_job_exclude_wins_over_a_gitignore_negation(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        {
            ".gitignore": "*.pt\n!pretrained.pt\n",  # the repo commits its pretrained weights
            "pretrained.pt": "",
            "train.py": "",
        },
    )
    assert collect_files(tmp_path, exclude=["*.pt"]) == [".gitignore", "train.py"]


def test_symlink_to_a_directory_outside_is_one_entry_and_not_followed(tmp_path: Path) -> None:
    outside = make_tree(tmp_path / "outside", {"secret.txt": "s", "nested/more.txt": "m"})
    root = make_tree(tmp_path / "root", {"train.py": ""})
    (root / "data").symlink_to(outside, target_is_directory=True)
    (root / "link.py").symlink_to("train.py")
    files = collect_files(root)
    assert files == ["data", "link.py", "train.py"]

    found = entries(scan_workdir(root))
    assert (found["data"].kind, found["data"].value) == ("l", str(outside))
    assert (found["link.py"].kind, found["link.py"].value) == ("l", "train.py")
    assert not [name for name in found if "secret" in name or "more" in name]


def test_dangling_symlink_is_kept_as_a_link(tmp_path: Path) -> None:
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    files = collect_files(tmp_path)
    assert files == ["gone"]
    assert entries(scan_workdir(tmp_path))["gone"].kind == "l"


def test_empty_directories_are_kept(tmp_path: Path) -> None:
    make_tree(tmp_path, {"outputs/": "", "a/b/c/": "", "train.py": ""})
    files = collect_files(tmp_path)
    assert files == ["a/b/c/", "outputs/", "train.py"]
    found = entries(scan_workdir(tmp_path))
    assert found["outputs"].kind == "d"
    assert found["a/b/c"].kind == "d"


def test_manifest_holds_each_file_with_its_hash_size_and_executable_bit(tmp_path: Path) -> None:
    make_tree(tmp_path, {"train.py": "print('hi')\n", "pkg/model.py": "X = 1\n"})
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    tree = scan_workdir(tmp_path)
    found = entries(tree)
    assert sorted(found) == ["pkg/model.py", "run.sh", "train.py"]
    assert found["train.py"] == Entry("train.py", "f", sha(b"print('hi')\n"), 12)
    assert found["pkg/model.py"].value == sha(b"X = 1\n")
    assert found["run.sh"].kind == "x"  # executables stay executable
    assert found["run.sh"].key == sha(b"#!/bin/sh\n") + ".x"
    assert tree.total_bytes == 12 + 6 + 10


def test_agent_archive_is_deterministic_and_its_hash_is_the_version() -> None:
    files = json.loads(agent.archive())
    assert list(files) == sorted(files)
    assert {"orch_agent/main.py", "orch_agent/kernel/messages.py", "run.py"} <= set(files)
    package = Path(agent.__file__).parents[1] / "agent"
    every = {f"orch_agent/{p.relative_to(package)}" for p in package.rglob("*.py")}
    assert set(files) - {"run.py"} == every  # subpackages too, and nothing else
    assert agent.version() == hashlib.sha256(agent.archive()).hexdigest()[:16]
    agent.archive.cache_clear()
    agent.version.cache_clear()
    assert json.loads(agent.archive()) == files  # the same bytes, read again


@pytest.mark.parametrize("name", TEXT_NAMES)
def test_awkward_file_names_survive_into_the_manifest(tmp_path: Path, name: str) -> None:
    make_tree(tmp_path, {name: f"content of {name}"})
    files = collect_files(tmp_path)
    assert files == [name]
    found = entries(scan_workdir(tmp_path))
    assert found[name].value == sha(f"content of {name}".encode())
