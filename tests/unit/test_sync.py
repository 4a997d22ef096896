"""Which files are pushed, and the archive they travel in."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from orchestrator.sync import build_archive, collect_files, pack_workdir, supervisor_source


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


def members(archive: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: m for m in tar.getmembers()}


def read_member(archive: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        f = tar.extractfile(name)
        assert f is not None
        return f.read()


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

    archive = build_archive(root, files)
    found = members(archive)
    assert found["code/data"].issym()
    assert found["code/data"].linkname == str(outside)
    assert found["code/link.py"].issym()
    assert found["code/link.py"].linkname == "train.py"
    assert not [name for name in found if "secret" in name or "more" in name]


def test_dangling_symlink_is_kept_as_a_link(tmp_path: Path) -> None:
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    files = collect_files(tmp_path)
    assert files == ["gone"]
    assert members(build_archive(tmp_path, files))["code/gone"].issym()


def test_empty_directories_are_kept(tmp_path: Path) -> None:
    make_tree(tmp_path, {"outputs/": "", "a/b/c/": "", "train.py": ""})
    files = collect_files(tmp_path)
    assert files == ["a/b/c/", "outputs/", "train.py"]
    found = members(build_archive(tmp_path, files))
    assert found["code/outputs"].isdir()
    assert found["code/a/b/c"].isdir()


def test_archive_holds_the_supervisor_and_the_code(tmp_path: Path) -> None:
    make_tree(tmp_path, {"train.py": "print('hi')\n", "pkg/model.py": "X = 1\n"})
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    archive, count = pack_workdir(tmp_path)
    assert count == 3
    found = members(archive)
    assert sorted(found) == [
        "code",
        "code/pkg/model.py",
        "code/run.sh",
        "code/train.py",
        "orch_supervisor.py",
    ]
    assert read_member(archive, "orch_supervisor.py") == supervisor_source()
    assert found["orch_supervisor.py"].mode == 0o755
    assert found["code"].isdir()
    assert read_member(archive, "code/train.py") == b"print('hi')\n"
    assert read_member(archive, "code/pkg/model.py") == b"X = 1\n"
    assert found["code/run.sh"].mode & 0o111  # executables stay executable


def test_supervisor_source_is_the_remote_supervisor_script() -> None:
    source = supervisor_source().decode()
    assert "def cmd_start" in source
    assert 'if __name__ == "__main__":' in source


AWKWARD_NAMES = [
    "with space.py",
    "it's.py",
    'say "hi".txt',
    "new\nline.txt",
    "-leading-dash.py",
    "--help",
    "naïve-データ.py",
    "$(touch pwned).txt",
    "back\\slash",
    "star*.txt",
    "dir with space/inner 'q'.py",
]


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_awkward_file_names_survive_into_the_archive(tmp_path: Path, name: str) -> None:
    make_tree(tmp_path, {name: f"content of {name}"})
    files = collect_files(tmp_path)
    assert files == [name]
    archive = build_archive(tmp_path, files)
    assert f"code/{name}" in members(archive)
    assert read_member(archive, f"code/{name}") == f"content of {name}".encode()
