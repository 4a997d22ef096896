"""What `orch check` found, as both backends say it: tables of cells (a row per host),
lines (what was found, each problem with its fix, the tally), and the errors that the
backend could not even look past. Each cell and line carries its mark (error,
warning, passed) and no colour: the CLI colours by mark on a terminal, a web page
would in its own way. Every problem is spelled out in the lines, so nothing depends
on colour."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from orchestrator.models.errors import OrchError


class Mark(StrEnum):
    """How a cell, or a line's head, stands out."""

    ERROR = "error"  # what would keep a job from running
    WARNING = "warning"  # what may make it slow or fail later
    PASSED = "passed"  # every check passed


@dataclass(frozen=True)
class Cell:
    text: str
    mark: Mark | None = None


@dataclass(frozen=True)
class Column:
    title: str
    right: bool = False  # numbers: aligned right
    no_wrap: bool = False


@dataclass(frozen=True)
class CheckTable:
    """A table of the check (the hosts, the bandwidth with the master), under its
    title ("" for none)."""

    columns: tuple[Column, ...]
    rows: tuple[tuple[Cell, ...], ...]
    title: str = ""


@dataclass(frozen=True)
class CheckLine:
    """A line under the tables. With a `head` ("error", "warning"), the line reads
    `head: text`, the head marked; else the whole line carries `mark`."""

    text: str
    mark: Mark | None = None
    head: str = ""

    def __str__(self) -> str:
        return f"{self.head}: {self.text}" if self.head else self.text


@dataclass(frozen=True)
class CheckResult:
    """What `orch check` shows: `tables`, then `lines` (results, on stdout), then
    `errors`, each as `error:` and `hint:` (diagnostics, on stderr). `failed`: an
    error was found, what submit would refuse (exit 3)."""

    tables: tuple[CheckTable, ...] = ()
    lines: tuple[CheckLine, ...] = ()
    errors: tuple[OrchError, ...] = ()
    failed: bool = False
