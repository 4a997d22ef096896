"""An attached job's word (`notify:`), sent from the laptop by the submit that is the
job's controller; a detached job's keeper sends its own, on its host
(agent/keeper/notify.py). Both send through agent/kernel/notify.py.

1. `restarted` and `stalled` go while the job runs, from a thread of their own: a
   hook that hangs holds up neither the restart nor the teardown.
2. `ended` (`failed` where the job failed) is told once the job's outcome is decided
   and written: after its teardown and its outputs, before the submit exits, which
   waits for it (kernel/notify.FINISH_WAIT_S at most).
3. A try that failed is a notice, `warning: notify: ...`, naming no more of a
   webhook than its scheme and host; it never changes the job's exit code.
"""

from __future__ import annotations

import logging

from orchestrator.agent.kernel import notify
from orchestrator.reporting.reporter import Reporter

log = logging.getLogger(__name__)


class JobNotify:
    """The events of one attached job, told to its `notify:` target (module docstring).

    Args:
        target: the job's notify target.
        job_id: the job.
        reporter: where a failed try is told (a warning notice).
    """

    def __init__(self, target: str, job_id: str, reporter: Reporter) -> None:
        self.job_id = job_id
        self.courier = notify.Courier(
            target, lambda line: reporter.notice(f"warning: {line}"), log.info
        )
        self.ended_as: str | None = None

    def restarted(self, reason: str, attempt: int) -> None:
        """The job starts again, as `attempt` (counted from 1), because of `reason`."""
        self._tell(notify.RESTARTED, "restarting", None, [f"{reason}; attempt {attempt} starts"])

    def stalled(self, detail: list[str]) -> None:
        """The stall watchdog took every rank's stack: `detail` says what it found."""
        self._tell(notify.STALLED, "running", None, detail)

    def ended(self, state: str, exit_code: int, detail: list[str]) -> None:
        """The job ended as `state`, `orch submit` exiting with `exit_code`: tell it
        (once) and wait for every send."""
        if self.ended_as is None:
            self.ended_as = state
            event = notify.FAILED if state == "failed" else notify.ENDED
            self._tell(event, state, exit_code, detail)
        self.courier.finish()

    def _tell(self, event: str, state: str, code: int | None, detail: list[str]) -> None:
        head = notify.message(self.job_id, event, state, code)
        more = f"more: orch status {self.job_id}; orch logs {self.job_id}"
        text = "\n".join([head, *detail, more])
        self.courier.tell(notify.Event(self.job_id, event, state, code, text))
