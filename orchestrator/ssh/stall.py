"""The stall watchdog of an attached job (`stall_after:`): when no rank of the job has
printed a line for that long, take every rank's stack, show it, keep it, and stop the
job as failed, `stalled: no output for N s`, so that `restarts:` apply as for any
failure; with `on_stall: warn`, only show them, once per stall.

1. Silence is first judged here, from the output that arrives (a progress bar's
   redraw counts); then confirmed on the hosts, each on its own clock (the `stack`
   command's `if_idle`): output that is slow to arrive is never a stall.
2. The stacks are taken in that same round trip, and shown through the reporter's
   notices (stderr), the grouped view, and the path of the dump kept.
3. `fire` is called once, with the reason, to stop the job (watch.py tears it down
   and fails it); the watchdog then stops watching. `told` (notify: `stalled`) hears
   what it found, each time it took the stacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from orchestrator.models.errors import OrchError
from orchestrator.records.db import JobRecord
from orchestrator.reporting import stacks
from orchestrator.reporting.reporter import Reporter
from orchestrator.ssh import stack

log = logging.getLogger(__name__)
CHECK_EVERY_S = 1.0


def stalled_reason(seconds: float) -> str:
    return f"stalled: no output for {seconds:.0f} s"


class StallWatch:
    """Watches one attached job's output for silence (module docstring)."""

    def __init__(
        self,
        record: JobRecord,
        stall_after: float,
        warn_only: bool,
        reporter: Reporter,
        fire: Callable[[str], None],
        told: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.record, self.stall_after, self.warn_only = record, stall_after, warn_only
        self.reporter, self.fire, self.told = reporter, fire, told
        self.reason: str | None = None  # set once the job was stopped as stalled
        self.saved: str | None = None
        self._last = time.monotonic()
        self._warned = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-watch", daemon=True)
        self._thread.start()

    def heard(self) -> None:
        """A rank printed: the silence starts again (and a warning may come again)."""
        self._last = time.monotonic()
        self._warned = False

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closed.wait(CHECK_EVERY_S):
            silent = time.monotonic() - self._last
            if silent < self.stall_after or self._warned:
                continue
            try:
                found, idle = stack.take_if_stalled(self.record, self.stall_after, self.reporter)
            except OrchError as exc:  # no host answered: the follow judges them lost
                log.info("[job=%s] stall check: %s", self.record.id, exc.message)
                continue
            if found is None:  # a host saw output: count from the latest of them
                self._last = time.monotonic() - (idle or 0.0)
                continue
            quiet = max(idle or 0.0, self.stall_after)
            self._show(found, quiet)
            if self.told is not None:  # notify: `stalled`
                self.told(self._words(found, quiet))
            if self.warn_only:
                self._warned = True
                continue
            self.reason = stalled_reason(self.stall_after)
            self.fire(self.reason)
            return

    def _words(self, found: stacks.StackView, quiet: float) -> list[str]:
        what = "warning" if self.warn_only else "stopping the job"
        words = [f"no rank printed a line for {quiet:.0f} s: {what}"]
        return words + ([f"the stacks: {found.saved}"] if found.saved else [])

    def _show(self, found: stacks.StackView, quiet: float) -> None:
        what = "warning" if self.warn_only else "stopping the job"
        self.reporter.notice(
            f"job {self.record.id}: no rank printed a line for {quiet:.0f} s "
            f"(stall_after: {self.stall_after:.0f}): {what}; every rank's stack:"
        )
        for line in stacks.lines(found):
            self.reporter.notice(f"  {line}")
        self.saved = found.saved
        if found.saved:
            self.reporter.notice(f"stacks kept: {found.saved}")
