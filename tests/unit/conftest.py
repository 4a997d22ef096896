"""Helpers for the unit tests: YAML files written to tmp_path, and the error checks
every bad input must pass (an InputError, exit code 2)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.models.errors import EXIT_BAD_INPUT, InputError, SpecError

WriteFile = Callable[[str, str], Path]


def dedent(text: str) -> str:
    """The YAML as written in a test, so that line 1 is the first line after the quotes."""
    return textwrap.dedent(text).lstrip("\n")


@pytest.fixture
def write(tmp_path: Path) -> WriteFile:
    """write("sub/job.yaml", '''...''') -> the path, with parents created."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dedent(text), encoding="utf-8")
        return path

    return _write


def expect_input_error(load: Callable[[], object]) -> SpecError:
    """Run a loader that must reject its input; return the SpecError after checking
    that the CLI would exit 2 for it."""
    with pytest.raises(SpecError) as info:
        load()
    error = info.value
    assert isinstance(error, InputError)
    assert error.exit_code == EXIT_BAD_INPUT
    return error
