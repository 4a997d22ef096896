"""What `orch pull` reports, whatever the backend: each node's files and bytes, the
progress callback, and where outputs go by default. The copying is
reporting/receive.py, for either backend."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DIR = "orch-outputs"
Progress = Callable[[str, int], None]  # host, bytes received so far (all files)


@dataclass
class PullReport:
    """What one node's pull brought: files written, their bytes, files already here."""

    host: str
    target: Path
    files: int = 0
    bytes: int = 0
    unchanged: int = 0
    errors: list[str] = field(default_factory=list)


def default_target(job_id: str) -> Path:
    return Path(DEFAULT_DIR) / job_id
