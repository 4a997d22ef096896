"""Helpers for the unit tests: YAML files written to tmp_path, the error checks every
bad input must pass (an InputError, exit code 2), and `orch` run in this process."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cli import main
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


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str


Orch = Callable[..., Run]


@pytest.fixture
def orch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Orch:
    """`orch(*args, cwd=..., env=...)` through `cli.main` in this process (fast): the
    same argument parsing, error mapping and exit codes as the installed command."""

    def run(*args: str | Path, cwd: Path = tmp_path, env: dict[str, str] | None = None) -> Run:
        with monkeypatch.context() as m:
            m.delenv("ORCH_INVENTORY", raising=False)
            m.setenv("HOME", str(tmp_path / "home"))
            m.setenv("ORCH_HOME", str(tmp_path / "state"))
            for key, value in (env or {}).items():
                m.setenv(key, value)
            m.chdir(cwd)
            m.setattr(sys, "argv", ["orch", *map(str, args)])
            capsys.readouterr()
            umask = os.umask(0o077)  # main() sets it for the whole process: put it back
            try:
                with pytest.raises(SystemExit) as exit_info:
                    main()
            finally:
                os.umask(umask)
        out = capsys.readouterr()
        code = exit_info.value.code
        return Run(code if isinstance(code, int) else 1, out.out, out.err)

    return run
