"""Trying one thing on several hosts at once, again and again, until each has
succeeded or the time is up: stopping a job on nodes that were lost.

Each host has its own thread, so a host whose every try waits out a connect timeout
(3 s behind a partition) never delays another's: with three lost hosts, each is
tried from the first second, and again a pause after each failed try, until the
deadline. A try that started before the deadline may end after it; none starts after.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

from orchestrator.models.errors import OrchError

log = logging.getLogger(__name__)
RETRY_PAUSE_S = 1.0  # after a failed try, before the next one on that host
POLL_S = 0.2  # how often the caller's thread looks up: keeps Ctrl-C responsive


@dataclass(frozen=True)
class Tried:
    """One host's try that succeeded, or the last error of a host given up on."""

    name: str
    error: OrchError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def retry_each(
    names: Iterable[str],
    attempt: Callable[[str], None],
    within_s: float,
    pause_s: float = RETRY_PAUSE_S,
    clock: Callable[[], float] = time.monotonic,
) -> Generator[Tried, None, None]:
    """Try `attempt(name)` for every name at once, each again `pause_s` after it
    failed (raised OrchError), until it succeeds or `within_s` is over.

    Yields:
        Each host once, as it ends: succeeded, or given up with its last error.
        Closing the iterator (or Ctrl-C in the caller) stops every host's tries; a try
        already running ends in its thread, unseen.
    """
    names = list(dict.fromkeys(names))
    deadline = clock() + within_s
    stopped = threading.Event()
    done: queue.Queue[Tried] = queue.Queue()

    def tries(name: str) -> None:
        error: OrchError | None = None
        while not stopped.is_set() and clock() < deadline:
            try:
                attempt(name)
            except OrchError as exc:
                log.debug("[host=%s] try failed: %s", name, exc.message)
                error = exc
                stopped.wait(pause_s)
                continue
            except Exception as exc:  # any surprise ends this host's tries, reported
                log.debug("[host=%s] try failed", name, exc_info=True)
                error = OrchError(f"{name}: unexpected error: {exc!r}")
                break
            done.put(Tried(name))
            return
        done.put(Tried(name, error or OrchError(f"{name}: not tried before the deadline")))

    for name in names:
        threading.Thread(target=tries, args=(name,), name=f"retry-{name}", daemon=True).start()
    try:
        for _ in names:
            while True:
                try:
                    yield done.get(timeout=POLL_S)
                    break
                except queue.Empty:
                    continue
    finally:
        stopped.set()
