"""The stacks taken of a job, kept with its records: `$ORCH_HOME/stacks/<job>/<when>.txt`
(what `orch stack -v` prints) and `<when>.json` (its `--json`), owner-only, so that
they can be read after the job has ended (`orch stack` on an ended job names them)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from orchestrator.records.home import orch_home, private_dir

STACKS = "stacks"


def stacks_dir(job_id: str, home: Path | None = None) -> Path:
    """Where a job's stacks are kept (not created)."""
    return (home or orch_home()) / STACKS / job_id


def stamp(taken: float) -> str:
    """A dump's name: its UTC time, to the millisecond, sortable."""
    whole = time.strftime("%Y%m%dT%H%M%S", time.gmtime(taken))
    return f"{whole}.{int(taken * 1000) % 1000:03d}Z"


def save(job_id: str, taken: float, text: str, data: dict[str, Any]) -> Path:
    """Keep one dump; returns the text's path."""
    folder = private_dir(stacks_dir(job_id))
    name = stamp(taken)
    for suffix, content in ((".json", json.dumps(data, indent=1)), (".txt", text)):
        path = folder / f"{name}{suffix}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(content)
    return folder / f"{name}.txt"


def saved(job_id: str) -> list[Path]:
    """A job's kept dumps (their text), oldest first."""
    folder = stacks_dir(job_id)
    return sorted(folder.glob("*.txt")) if folder.is_dir() else []
