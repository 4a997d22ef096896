"""Where the controller keeps its records: $ORCH_HOME."""

from __future__ import annotations

import os
from pathlib import Path


def orch_home() -> Path:
    """Where the controller keeps its state: $ORCH_HOME, else ~/.local/state/orch."""
    return Path(os.environ.get("ORCH_HOME") or Path.home() / ".local" / "state" / "orch")


def private_dir(path: Path) -> Path:
    """`path`, created owner-only (0700), or made so if it exists more open: the job
    records hold the inventory's env, the log mirror what the ranks printed."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path
