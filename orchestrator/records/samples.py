"""The samples `orch top` takes of a running job, kept in the job's records while a
page watches it (`orch ui`'s hosts over time): `$ORCH_HOME/samples/<job>.jsonl`, one
JSON object per host and sample, owner-only.

Only the last hour is read back; the file is cut back to it when it passes
`TRIM_BYTES`, so that a job watched for days keeps an hour, not days.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orchestrator.records.home import private_dir

KEEP_S = 3600.0
TRIM_BYTES = 4 << 20


class SampleLog:
    """One job's samples.

    Args:
        home: the controller's records ($ORCH_HOME).
        job_id: the job's full id.
    """

    _lock = threading.Lock()  # one writer at a time in this process

    def __init__(self, home: Path, job_id: str) -> None:
        self.path = home / "samples" / f"{job_id}.jsonl"

    def add(self, rows: Iterable[dict[str, Any]]) -> None:
        """Append rows, each with its `time` (seconds since the epoch)."""
        text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
        if not text:
            return
        with self._lock:
            private_dir(self.path.parent)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, text.encode())
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            if size > TRIM_BYTES:
                self._trim()

    def read(self, since: float | None = None) -> list[dict[str, Any]]:
        """The rows of the last hour (or since `since`, if later), oldest first; a line
        that is not whole (a write under way) is left out."""
        start = time.time() - KEEP_S
        if since is not None:
            start = max(start, since)
        try:
            raw = self.path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        rows = []
        for line in raw.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and float(row.get("time") or 0) > start:
                rows.append(row)
        return rows

    def _trim(self) -> None:
        kept = self.read()
        partial = self.path.with_suffix(".tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in kept)
        partial.replace(self.path)
