"""orch from Python: submit jobs, follow them, stop them. The `orch` CLI calls this too,
and only this: every verb of the CLI is here or in a module beside it (`cluster`: the
inventory's hosts; `watch`: pull and top; `onboard`: init and keys), with typed results,
so that a notebook or a web page calls what the CLI calls.

```python
from orchestrator import api

runs = [
    api.submit("job.yaml", "cluster.yaml", detach=True,
               overrides=api.Overrides(name=f"lr-{lr}", env={"LR": lr}))
    for lr in ("0.1", "0.01")
]
for run in runs:
    for line in run.logs(follow=True):   # LogLine(host, rank, kind, text)
        ...
    print(run.id, run.wait().state)      # JobStatus: succeeded, failed, killed, lost
```

Nothing here prints or exits: what a running job says goes to a `Reporter` (the CLI
passes its console; by default notices go to `logging`, logger `orchestrator`), and
every failure is an `OrchError` subclass (InputError: a bad job file, inventory or
argument; InfraError: a host; JobFailed: the job). Files and directories it creates are
the user's alone, as the CLI's are: each call runs with umask 077.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import backends
from orchestrator.agent.kernel.limits import raise_open_files
from orchestrator.api.lines import LineQueue, LineReporter, QuietReporter
from orchestrator.api.types import (
    EarlierAttempt,
    JobStatus,
    KilledProcess,
    KillResult,
    LineKind,
    LogLine,
    NodeStatus,
    WaitTimeout,
)
from orchestrator.models.job import JobSpec, Overrides
from orchestrator.models.states import JobState
from orchestrator.records.db import JobDB, JobRecord
from orchestrator.reporting.filters import LogFilter
from orchestrator.reporting.reporter import Reporter

if TYPE_CHECKING:  # a launch plan's module is for `plan` and `submit` to import
    from orchestrator.backends import LaunchPlan

__all__ = [
    "EarlierAttempt",
    "Job",
    "JobSpec",
    "JobState",
    "JobStatus",
    "KillResult",
    "KilledProcess",
    "LineKind",
    "LineReporter",
    "LogLine",
    "NodeStatus",
    "Overrides",
    "QuietReporter",
    "Reporter",
    "WaitTimeout",
    "dry_run",
    "job",
    "jobs",
    "kill_all",
    "plan",
    "raise_open_files",
    "statuses",
    "submit",
]

# A library never prints: without a handler of the caller's, Python's last resort
# would write orch's (and paramiko's) warnings to stderr.
for _name in ("orchestrator", "paramiko"):
    logging.getLogger(_name).addHandler(logging.NullHandler())

PathLike = str | os.PathLike[str]


@contextmanager
def _owner_only() -> Iterator[None]:
    """umask 077 for the call, as the CLI has for its whole run: job records, log
    copies and caches are the user's alone."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _path(value: PathLike | None) -> Path | None:
    return None if value is None else Path(value)


def submit(
    job: PathLike | JobSpec,
    inventory: PathLike | None = None,
    *,
    detach: bool = False,
    overrides: Overrides | None = None,
    outputs_dir: PathLike | None = None,
    reporter: Reporter | None = None,
) -> Job:
    """Run a job on its hosts: `orch submit`, `orch submit -d` with `detach`.

    Attached (the default), this call is the job's controller and returns when the job
    has ended, as `orch submit` does: it streams the output to `reporter`, stops the
    job on every host when a node fails, starts it again as its `restarts:` allow,
    brings its `outputs:` back, and Ctrl-C stops it everywhere. That is why it does not
    return while the job runs: those duties need a caller that stays (Ctrl-C reaches
    only the main thread), and a job whose controller returned early would lose its
    restarts to a `.wait()` that may never come. The handle's `.wait()` then answers at
    once. Detached, it returns as soon as every node has started and the job runs on
    by itself: what a sweep of jobs at once needs. `.wait()` or `.logs(follow=True)`
    follow it, and stop it on every host when a node fails (as `orch logs -f` does).

    Args:
        job: a job file, or a JobSpec loaded from one (`models.job.load_job`).
        inventory: the inventory file (else $ORCH_INVENTORY, the job's `inventory:`,
            then localhost).
        detach: return once every node has started.
        overrides: what `orch submit --env/--nodes/--name/--nproc-per-node/-- ARGS`
            change, checked as the job file's own keys are.
        outputs_dir: where the job's `outputs:` go when it ends (default
            ./orch-outputs/ID).
        reporter: what the job says while this call runs: its id, output (attached),
            notices. Default: notices to `logging`, output only to the job's logs.

    Returns:
        The job's handle.

    Raises:
        InputError: a bad job file, inventory or override (nothing started).
        InfraError: a host unreachable or unusable (nothing started anywhere).
        JobFailed: attached, the job failed or was killed; it was stopped on every host.
        Interrupted: attached, Ctrl-C; the job was stopped on every host.
    """
    out = reporter or QuietReporter()
    with _owner_only():
        chosen = backends.load(_spec(job), _path(inventory), overrides)
        job_id = chosen.backend.submit(
            chosen.job,
            chosen.inventory,
            out,
            detach=detach,
            outputs_dir=_path(outputs_dir),
            no_wait=overrides is not None and overrides.no_wait,
        )
    return Job(job_id, reporter)


def plan(
    job: PathLike | JobSpec,
    inventory: PathLike | None = None,
    *,
    overrides: Overrides | None = None,
) -> LaunchPlan:
    """What `submit` would start, as far as it is known without touching any host
    (`orch submit --dry-run`): node ranks, master, each host's command and env.

    Raises:
        InputError: a bad job file, inventory or override.
    """
    chosen = backends.load(_spec(job), _path(inventory), overrides)
    return chosen.backend.plan(chosen.job, chosen.inventory)


def dry_run(
    job: PathLike | JobSpec,
    inventory: PathLike | None = None,
    *,
    overrides: Overrides | None = None,
) -> list[str]:
    """What `orch submit --dry-run` prints, a line each, touching no host: each host's
    command and env (SSH), or the batch script and the sbatch command (Slurm).

    Raises:
        InputError: a bad job file, inventory or override.
    """
    chosen = backends.load(_spec(job), _path(inventory), overrides)
    return chosen.backend.dry_run(chosen.job, chosen.inventory)


def _spec(job: PathLike | JobSpec) -> Path | JobSpec:
    return job if isinstance(job, JobSpec) else Path(job)


def job(job_id: str, reporter: Reporter | None = None) -> Job:
    """The handle of a recorded job.

    Args:
        job_id: its id, or a unique prefix of it.
        reporter: where the handle's notices go (default: `logging`).

    Raises:
        InputError: no such job, or a prefix of several.
    """
    with _owner_only():
        return Job(JobDB().get(job_id).id, reporter)


def jobs(reporter: Reporter | None = None) -> list[Job]:
    """The handles of every recorded job, newest first."""
    with _owner_only():
        return [Job(record.id, reporter) for record in JobDB().jobs()]


def statuses(
    job_id: str | None = None, reporter: Reporter | None = None, *, ask_hosts: bool = True
) -> list[JobStatus]:
    """`orch status`: every job (or the one named), brought up to date with its hosts
    where it has not ended. A node that failed while others ran gets the job stopped.

    Args:
        ask_hosts: False: as the records say, no host asked (a page that polls each
            second; what follows a job keeps its record up to date meanwhile).

    Raises:
        InputError: no such job.
    """
    reporter = reporter or QuietReporter()
    with _owner_only():
        store = JobDB()
        records = [store.get(job_id)] if job_id else store.jobs()
        if not ask_hosts:
            return [JobStatus.of(r, note=backends.for_record(r).note(r)) for r in records]
        return [_status(store, r, reporter, thorough=job_id is not None) for r in records]


def places(job_ids: Sequence[str]) -> dict[str, str]:
    """Where each of these jobs that has not started stands in line: {job id: "queued,
    2nd in line on node1"}; jobs not waiting are left out."""
    with _owner_only():
        store = JobDB()
        pending = [r for r in map(store.get, job_ids) if r.state is JobState.PENDING]
        found: dict[str, str] = {}
        for name in sorted({r.backend for r in pending}):
            of_backend = [r for r in pending if r.backend == name]
            found.update(backends.for_record(of_backend[0]).places(of_backend, store))
        return found


def _status(store: JobDB, record: JobRecord, reporter: Reporter, thorough: bool) -> JobStatus:
    backend = backends.for_record(record)
    record = backend.status(record, store, reporter, thorough)
    return JobStatus.of(record, note=backend.note(record))


def kill_all(reporter: Reporter | None = None) -> list[KillResult]:
    """`orch kill --all`: stop every job that has not ended, on every host."""
    reporter = reporter or QuietReporter()
    with _owner_only():
        store = JobDB()
        records = store.jobs()
        running = [r for r in records if not r.state.is_terminal()]
        killed = [KillResult.of(backends.for_record(r).kill(r, store, reporter)) for r in running]
        # And the warm interpreters the jobs left on their hosts, and those `orch warm
        # JOB` started before any job ran there: each backend ends its own.
        for name in backends.BACKENDS:
            ran = [r for r in records if r.backend == name]
            backends.backend(name).end_warm(ran, store, reporter)
        return killed


def _relay_logs(job_id: str, want: LogFilter, follow: bool, reporter: Reporter) -> int:
    """`orch logs` of any job, from wherever it runs."""
    store = JobDB()
    record = store.get(job_id)
    return backends.for_record(record).logs(record, store, want, follow, reporter)


class Job:
    """A handle on one recorded job: it holds the id only, and asks the job store and
    the job's hosts afresh on each call. Handles are cheap: `job(id)` makes another.

    Args:
        job_id: the job's full id.
        reporter: where notices go (default: `logging`).
    """

    def __init__(self, job_id: str, reporter: Reporter | None = None) -> None:
        self.id = job_id
        self._reporter: Reporter = reporter or QuietReporter()
        self._lock = threading.Lock()
        self._follower: _Follower | None = None

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> JobStatus:
        """`orch status ID`: the job and its nodes, asked of its hosts where it has not
        ended (a node that failed while others ran gets the job stopped)."""
        return statuses(self.id, self._reporter)[0]

    def logs(
        self,
        follow: bool = False,
        *,
        node: str | None = None,
        rank: int | None = None,
        tail: int | None = None,
    ) -> Iterator[LogLine]:
        """The job's output, as `orch logs` prints it: each rank's lines in order, from
        its hosts (else the local copy); with `follow`, on until the job ends.

        Lines of a restarted job's earlier attempts come first. Following stops the
        job on every host when a node fails. An iterator left before its end stops
        following at the job's next line (or its end).

        Args:
            follow: go on until the job ends.
            node: only this host's lines. rank: only this global rank's.
            tail: only the last N lines of each rank.

        Raises:
            InputError: no such job, node or rank (at once, before any line).
            InfraError: a host could not be read, after every line that could be.
        """
        want = LogFilter(node=node, rank=rank, tail=tail)
        with _owner_only():
            want.nodes(JobDB().get(self.id))  # a wrong node or rank fails here, not later
        return _lines(self.id, want, follow, self._reporter.notice)

    def logs_to(
        self,
        reporter: Reporter,
        follow: bool = False,
        *,
        node: str | None = None,
        rank: int | None = None,
        tail: int | None = None,
    ) -> int:
        """`orch logs`: as `logs()`, but the output goes to `reporter` as the chunks
        come (a console draws progress bars from them), in this thread.

        Returns:
            0, or with `follow` the job's exit code (0 succeeded, 1 otherwise).
        """
        want = LogFilter(node=node, rank=rank, tail=tail)
        with _owner_only():
            return _relay_logs(self.id, want, follow, reporter)

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Wait until the job has ended; its final status (`.state`, `.exit_code`).

        A job that has not ended is followed, as `orch logs -f` does, in a thread of
        this handle that stays until the job ends (a later `wait` goes on with it):
        when a node fails, the job is stopped on every host. The job's failure is its
        state, not an exception.

        Args:
            timeout: seconds to wait at most (None: until it ends).

        Raises:
            WaitTimeout: (a TimeoutError) the job still runs after `timeout`.
            InfraError: a host of the job could not be reached to follow it.
        """
        with _owner_only():
            ended = JobDB().get(self.id).state.is_terminal()
        if ended:
            return self.status()
        with self._lock:
            if self._follower is None or self._follower.done_with_error():
                self._follower = _Follower(self.id, self._reporter.notice)
                self._follower.start()
            follower = self._follower
        follower.join(timeout)
        if follower.is_alive():
            raise WaitTimeout(
                f"job {self.id} still runs after {timeout} s", "wait again, or stop it: .kill()"
            )
        if follower.error is not None:
            raise follower.error
        return self.status()

    def kill(self) -> KillResult:
        """`orch kill ID`: stop the job on every host (its process groups, then anything
        carrying its tag), bring its `outputs:` back, and say what was stopped where.
        A job that had ended is left alone (`already`); hosts that could not be
        reached are in `unreachable`."""
        with _owner_only():
            store = JobDB()
            record = store.get(self.id)
            return KillResult.of(backends.for_record(record).kill(record, store, self._reporter))


def _lines(
    job_id: str, want: LogFilter, follow: bool, notice: Callable[[str], None]
) -> Iterator[LogLine]:
    """The lines of `orch logs`, read in a thread from the first `next()` on; once the
    iterator is left (closed, or garbage), the thread stops at its next line."""
    lines = LineQueue(notice)

    def work() -> None:
        try:
            _relay_logs(job_id, want, follow, lines.reporter)
        except BaseException as exc:  # raised to the caller, in its thread
            lines.finish(exc)
        else:
            lines.finish()

    threading.Thread(target=work, name=f"orch-logs-{job_id}", daemon=True).start()
    try:
        yield from lines
    finally:
        lines.close()


class _Follower(threading.Thread):
    """Follows a job to its end, as `orch logs -f` does; its lines go only to the
    job's log copy."""

    def __init__(self, job_id: str, notice: Callable[[str], None]) -> None:
        super().__init__(name=f"orch-wait-{job_id}", daemon=True)
        self.job_id = job_id
        self.error: BaseException | None = None
        self._reporter = QuietReporter(notice)

    def run(self) -> None:
        try:
            _relay_logs(self.job_id, LogFilter(), True, self._reporter)
        except BaseException as exc:  # raised by wait(), in the caller's thread
            self.error = exc

    def done_with_error(self) -> bool:
        """Ended on an error: a later wait tries again (the host may be back)."""
        return not self.is_alive() and self.error is not None
