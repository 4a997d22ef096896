"""What a running command shows the user: rank lines on stdout, notices and push
progress on stderr."""

from __future__ import annotations

import sys
import threading

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)

from orchestrator.sync.push import PushProgress


class ConsoleReporter:
    """Prints a running job: prefixed rank lines on stdout, notices on stderr."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._out = sys.stdout.buffer
        self._push_lock = threading.Lock()
        self._pushes: dict[str, PushProgress] = {}
        self._push_timer: threading.Timer | None = None
        self._push_bar: Progress | None = None
        self._push_tasks: dict[str, TaskID] = {}

    def job_started(self, job_id: str) -> None:
        self._write(f"job {job_id}\n".encode())

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        if not data:
            return
        prefix = (f"[{host} r{rank}] " if rank is not None else f"[{host}] ").encode()
        if not data.isascii():  # ASCII is valid UTF-8: no decoding pass for most logs
            try:
                data.decode("utf-8")  # valid text goes through untouched
            except UnicodeDecodeError:  # invalid bytes from a rank become U+FFFD
                data = data.decode("utf-8", "replace").encode()
        # One copy of the data (the replace), however big: logs run to hundreds of MB.
        lines = memoryview(data.replace(b"\n", b"\n" + prefix))
        whole = data.endswith(b"\n")
        with self._lock:
            self._out.write(prefix)
            self._out.write(lines[: -len(prefix)] if whole else lines)
            if not whole:
                self._out.write(b"\n")
            self._out.flush()

    def notice(self, message: str) -> None:
        with self._lock:
            self._out.flush()
            sys.stderr.write(f"orch: {message}\n")
            sys.stderr.flush()

    def _write(self, data: bytes) -> None:
        with self._lock:
            self._out.write(data)
            self._out.flush()

    def progress(self, update: PushProgress) -> None:
        """A bar per host (files, bytes) on stderr for a code push still going after a
        second; none when stdout is not a terminal."""
        if not (sys.stdout.isatty() and sys.stderr.isatty()):
            return
        with self._push_lock:
            self._pushes[update.host] = update
            if self._push_bar is not None:
                self._show_push(update)
            elif self._push_timer is None:
                self._push_timer = threading.Timer(1.0, self._start_push_bar)
                self._push_timer.daemon = True
                self._push_timer.start()
            if all(p.finished for p in self._pushes.values()):
                if self._push_timer is not None:
                    self._push_timer.cancel()
                if self._push_bar is not None:
                    self._push_bar.stop()
                self._pushes, self._push_tasks = {}, {}
                self._push_timer = self._push_bar = None

    def _start_push_bar(self) -> None:
        with self._push_lock:
            if self._push_timer is None:  # the push ended meanwhile
                return
            self._push_bar = Progress(
                TextColumn("pushing code to {task.description}"),
                BarColumn(),
                TextColumn("{task.fields[files]} files"),
                DownloadColumn(),
                TransferSpeedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._push_bar.start()
            for update in self._pushes.values():
                self._show_push(update)

    def _show_push(self, update: PushProgress) -> None:
        assert self._push_bar is not None
        task = self._push_tasks.get(update.host)
        if task is None:
            task = self._push_bar.add_task(update.host, total=None, files="?")
            self._push_tasks[update.host] = task
        self._push_bar.update(
            task,
            completed=update.bytes_done,
            total=update.bytes_total or None,  # None until the host said what it lacks
            files=f"{update.files_done}/{update.files_total}" if update.bytes_total else "?",
        )
