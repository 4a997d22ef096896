"""Which files of a workdir a push takes: `.gitignore` and `.orchignore` at any depth
(deeper files winning, with negation), the job's `exclude:` patterns, never `.git/`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pathspec

from orchestrator.models.errors import InputError
from orchestrator.models.job_run import pattern_error

IGNORE_FILES = (".gitignore", ".orchignore")


ALWAYS_EXCLUDED = (".git/",)


@dataclass(frozen=True)
class _Rules:
    """Ignore patterns of one directory level, relative to `base` (posix, '' = root)."""

    base: str
    spec: pathspec.GitIgnoreSpec
    negates: bool = False  # has `!pattern` lines, which may re-include files below an ignored dir

    def verdict(self, rel: str) -> bool | None:
        if self.base:
            if not rel.startswith(self.base + "/"):
                return None
            rel = rel[len(self.base) + 1 :]
        verdict: bool | None = self.spec.check_file(rel).include
        return verdict


def _read_rules(directory: Path, base: str) -> _Rules | None:
    lines: list[str] = []
    for name in IGNORE_FILES:
        try:
            text = (directory / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            check_pattern(line, f"{directory / name}:{number}")
            lines.append(line)
    if not lines:
        return None
    negates = any(line.lstrip().startswith("!") for line in lines)
    return _Rules(base, pathspec.GitIgnoreSpec.from_lines(lines), negates)


def check_pattern(pattern: str, where: str) -> None:
    """Refuse a line no gitignore matcher can read, naming where it is.

    Raises:
        InputError: the pattern is malformed (`!` alone, a lone backslash, `[z-a]`).
    """
    if (why := pattern_error(pattern)) is not None:
        raise InputError(
            f"bad ignore pattern {pattern!r} at {where}: {why}",
            "fix or remove the pattern (gitignore syntax)",
        )


def _ignored(rel: str, rules: Iterable[_Rules]) -> bool:
    result = False
    for rule in rules:  # root first: the deepest definite answer wins
        verdict = rule.verdict(rel)
        if verdict is not None:
            result = verdict
    return result


def _skip_dir(rel: str, hard: pathspec.GitIgnoreSpec, rules: list[_Rules]) -> bool:
    """Whether nothing below a directory can be pushed, so it need not be walked.

    An ignored directory is still walked when a negation pattern is active: with `*`,
    `!*/`, `!*.py` the `.py` files below it are wanted, and each file is decided alone.
    """
    if hard.match_file(rel + "/"):
        return True
    return _ignored(rel + "/", rules) and not any(r.negates for r in rules)


def collect_files(root: Path, exclude: Iterable[str] = ()) -> list[str]:
    """Relative posix paths of the files, symlinks and empty dirs to push, sorted.

    Symlinks are kept as links and never followed, so nothing outside the tree is read.
    """
    # .git/ and the job's exclude: patterns are final: no ignore file can bring them back.
    hard = pathspec.GitIgnoreSpec.from_lines([*ALWAYS_EXCLUDED, *exclude])
    found: list[str] = []
    stack: list[tuple[Path, str, list[_Rules]]] = [(root, "", [])]
    while stack:
        directory, base, active = stack.pop()
        own = _read_rules(directory, base)
        active = [*active, own] if own else active
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        if not entries and base and not _ignored(base + "/", active):
            found.append(base + "/")
        for entry in entries:
            rel = f"{base}/{entry.name}" if base else entry.name
            if entry.is_dir(follow_symlinks=False):
                if not _skip_dir(rel, hard, active):
                    stack.append((Path(entry.path), rel, active))
            elif not hard.match_file(rel) and not _ignored(rel, active):
                found.append(rel)
    return sorted(found)
