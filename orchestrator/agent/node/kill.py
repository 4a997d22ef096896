"""`kill JOB_DIR [GRACE [JOB_ID [PORT]]]`: stop everything of a job on this host.

What is signalled, and in which order, is decided here: the process groups the job
directory records (torchrun's, and each rank's own session) and every process whose
environment carries the job's tag (those that escaped with setsid or a double fork).
Nothing else on the host is ever touched.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from ..host import proc
from ..kernel.fileio import read_json
from ..kernel.framing import send_record
from ..kernel.layout import EXIT, KILLED, LOGS, NODE_SPEC, PIDS
from ..kernel.notify import NOTIFY_MARK
from ..kernel.replies import KillReport

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

POLL_S = (0.005, 0.05)  # a wait looks again after 5 ms, then twice as late, up to 50


def main(args: list[str]) -> int:
    """kill JOB_DIR [GRACE [JOB_ID [PORT]]]: stop everything of the job on this host.

    TERM to torchrun's process group and each rank's (torchrun gives every rank its
    own session), and to every process carrying the job's tag in its environment
    (those that escaped with setsid or a double fork). Everything but torchrun itself
    gets up to GRACE seconds to clean up; torchrun has nothing of the user's to save,
    and its interpreter teardown costs ~0.4 s of CPU a node, so it is KILLed as soon
    as the rest is gone. What is left after GRACE is KILLed, again until it is gone.
    Prints a KillReport: what it killed, and whether PORT is free again.
    """
    began = time.monotonic()
    job_dir = os.path.expanduser(args[0])
    grace = float(args[1]) if len(args) > 1 else 3.0
    job = Victims(args[2] if len(args) > 2 else None)
    port = int(args[3]) if len(args) > 3 else None
    if os.path.isdir(job_dir):
        os.chdir(job_dir)
        job.read_job_dir()
    victims = {pid: proc.cmdline(pid) or "?" for pid in job.remaining()}
    for pgid in job.groups:
        proc.signal_group(pgid, signal.SIGTERM)
    for pid in victims:
        proc.signal_pid(pid, signal.SIGTERM)
    termed = time.monotonic()
    wait_until(lambda: not job.remaining(spare=job.torchrun), termed + grace)
    rest_gone = time.monotonic()
    forced = job.remaining(spare=job.torchrun)
    force(job, rest_gone + 5)
    all_gone = time.monotonic()
    # The supervisor records the exit status once torchrun is reaped.
    wait_until(lambda: not os.path.exists(PIDS) or os.path.exists(EXIT), rest_gone + 5)
    recorded = time.monotonic()
    if port is not None:
        wait_until(lambda: not proc.port_listening(port), rest_gone + 5)
    report = KillReport(
        killed=[[pid, cmd] for pid, cmd in sorted(victims.items())],
        forced=sorted(forced),
        remaining=sorted(job.remaining()),
        seconds={  # where the time went, for `orch -vv kill`
            "scan": round(termed - began, 3),
            "grace": round(rest_gone - termed, 3),
            "force": round(all_gone - rest_gone, 3),
            "exit": round(recorded - all_gone, 3),
            "port": round(time.monotonic() - recorded, 3),
        },
    )
    if port is not None:
        report.port_free = not proc.port_listening(port)
    send_record(sys.stdout.buffer, report.as_dict())
    return 0


class Victims:
    """The processes of one job on this host: in its groups, or carrying its tag."""

    def __init__(self, job_id: str | None) -> None:
        self.job_id = job_id
        self.groups: set[int] = set()
        self.torchrun: set[int] = set()
        # Processes (pid, start time) seen without the tag: an environment is the one
        # a process started with, so a wait that looks every few ms reads each once.
        self.untagged: set[tuple[int, str]] = set()

    def read_job_dir(self) -> None:
        """Learn the groups (and the job id, when not given) from the job directory,
        and mark the node killed, unless it had ended by itself already: a failure
        that came first must keep its time (the first failure is the cause)."""
        started = read_json(PIDS) or {}
        spec_env = (read_json(NODE_SPEC) or {}).get("env") or {}
        self.job_id = self.job_id or spec_env.get("ORCH_JOB_ID")
        if not os.path.exists(EXIT):
            open(KILLED, "a").close()
        self.groups = process_groups()
        self.torchrun = {int(started["pid"])} if "pid" in started else set()

    def remaining(self, spare: set[int] | frozenset[int] = frozenset()) -> set[int]:
        """The job's live processes but the `spare` pids."""
        left = set()
        for pid, fields in proc.stats():
            if pid in spare:
                continue
            if int(fields[2]) in self.groups or self.tagged(pid, fields[19]):
                left.add(pid)
        return left

    def tagged(self, pid: int, started: str) -> bool:
        """Whether the process's environment carries this job's tag (those that moved
        out of the job's groups: setsid, a double fork)."""
        if not self.job_id or pid == os.getpid() or (pid, started) in self.untagged:
            return False
        environ = proc.environ(pid)
        if f"ORCH_JOB_ID={self.job_id}".encode() in environ and NOTIFY_MARK not in environ:
            return True  # (a notify: command carries the id, but is no part of the job)
        self.untagged.add((pid, started))
        return False


def force(job: Victims, deadline: float) -> None:
    """KILL the job's groups, then whatever is left, until nothing is (or `deadline`)."""
    for pgid in job.groups:
        proc.signal_group(pgid, signal.SIGKILL)
    for pause in pauses():
        left = job.remaining()
        if not left or time.monotonic() >= deadline:
            return
        for pid in left:  # tagged strays, and anything forked since the last pass
            proc.signal_pid(pid, signal.SIGKILL)
        time.sleep(pause)


def wait_until(done: Callable[[], bool], deadline: float) -> None:
    for pause in pauses():
        if done() or time.monotonic() >= deadline:
            return
        time.sleep(pause)


def pauses() -> Iterator[float]:
    """How long each wait sleeps before it looks again: POLL_S[0], then twice as
    long each time, up to POLL_S[1]."""
    pause = POLL_S[0]
    while True:
        yield pause
        pause = min(pause * 2, POLL_S[1])


def process_groups() -> set[int]:
    """The process groups of the node that still are: torchrun's, and each rank's own
    session, whose leader runs with the start time recorded beside its pid. A group
    whose leader is gone, or whose pid now names another process (pids are reused:
    an ended job's may belong to anyone by now), is left out: what is left of it is
    found by the job's tag."""
    recorded: list[tuple[int, object]] = []
    started = read_json(PIDS)
    if started:
        recorded.append((int(started["pgid"]), started.get("start_time")))
    for name in os.listdir(LOGS) if os.path.isdir(LOGS) else []:
        if name.endswith(".pid"):
            try:
                with open(os.path.join(LOGS, name)) as f:
                    pid, _, when = f.read().partition(" ")
                recorded.append((int(pid), int(when) if when.strip().isdigit() else None))
            except (OSError, ValueError):
                continue
    return {pgid for pgid, when in recorded if when is not None and proc.start_time(pgid) == when}
