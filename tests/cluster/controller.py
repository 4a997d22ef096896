"""The controller's side of the cluster: this repository (its root, its ``orch`` CLI and
the interpreter the hosts run), a ``Controller`` (a machine running ``orch``, with its
own HOME, known_hosts and job state) and ``OrchRunner``, which runs the CLI as one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def repo_python() -> Path:
    """The interpreter the hosts use: the repository's venv, else the running one.

    Not resolved: the venv's symlink is what selects its site-packages (torch).
    """
    venv_python = REPO_ROOT / ".venv" / "bin" / "python"
    return venv_python if venv_python.exists() else Path(sys.executable)


def orch_command() -> list[str]:
    """The argv prefix that runs the real ``orch`` CLI of this repository."""
    script = REPO_ROOT / ".venv" / "bin" / "orch"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "orchestrator"]


@dataclass(frozen=True)
class Controller:
    """The machine that runs ``orch``: its own HOME, known_hosts and job state."""

    home: Path
    known_hosts: Path
    state_dir: Path

    def env(self, inventory: Path | None = None, **extra: str) -> dict[str, str]:
        """Environment for running the ``orch`` CLI as this controller.

        Inherits PATH and the rest, but not the caller's ORCH_* variables, SSH agent or
        config directory (XDG_CONFIG_HOME: its orch/notify.yaml),
        which would make results depend on who runs the tests.
        """
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith("ORCH_")
            and key not in ("SSH_AUTH_SOCK", "SSH_AGENT_PID", "XDG_CONFIG_HOME")
        }
        env.update(
            HOME=str(self.home),
            ORCH_KNOWN_HOSTS=str(self.known_hosts),
            ORCH_HOME=str(self.state_dir),
        )
        if inventory is not None:
            env["ORCH_INVENTORY"] = str(inventory)
        env.update(extra)
        return env


class OrchRunner:
    """Runs the real ``orch`` CLI as a subprocess on behalf of one controller."""

    def __init__(self, controller: Controller, cwd: Path = REPO_ROOT, timeout: float = 120) -> None:
        self.controller = controller
        self.cwd = cwd
        self.timeout = timeout

    def __call__(
        self,
        *args: str | os.PathLike[str],
        timeout: float | None = None,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``orch *args`` and return its exit code, stdout and stderr (text)."""
        return subprocess.run(
            [*orch_command(), *map(str, args)],
            cwd=cwd or self.cwd,
            env={**self.controller.env(), **(env or {})},
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout or self.timeout,
            check=False,
        )

    def popen(self, *args: str | os.PathLike[str]) -> subprocess.Popen[str]:
        """Start ``orch *args`` in a session of its own (``os.killpg`` reaches it and
        nothing else); ``communicate`` reads its output (text)."""
        return subprocess.Popen(
            [*orch_command(), *map(str, args)],
            cwd=self.cwd,
            env=self.controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
