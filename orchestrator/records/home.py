"""Where the controller keeps its records: $ORCH_HOME."""

from __future__ import annotations

import os
from pathlib import Path


def orch_home() -> Path:
    """Where the controller keeps its state: $ORCH_HOME, else ~/.local/state/orch."""
    return Path(os.environ.get("ORCH_HOME") or Path.home() / ".local" / "state" / "orch")
