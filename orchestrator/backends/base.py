"""The Backend protocol: where orch runs jobs, behind one set of verbs.

Two implementations: `SshBackend` (backends/ssh.py: the inventory's hosts, over SSH;
the code in ssh/) and `SlurmBackend` (backends/slurm.py: a Slurm cluster through its
login node; the code in slurm/). The backend is chosen once, where the inventory is
read (`backends.for_inventory`) or from a job's record (`backends.for_record`); the
CLI and the Python API call these verbs and never ask which backend it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.reporting.pull import Progress, PullReport

if TYPE_CHECKING:  # names for the signatures only: `orch kill` need not import ssh/check/
    from orchestrator.models.errors import OrchError
    from orchestrator.models.inventory import Inventory
    from orchestrator.models.job import JobSpec
    from orchestrator.records.db import JobDB, JobRecord
    from orchestrator.reporting.filters import LogFilter
    from orchestrator.reporting.outcomes import KillOutcome, WarmStart
    from orchestrator.reporting.reporter import Reporter
    from orchestrator.reporting.top import TopView
    from orchestrator.ssh.check.run import CheckReport
    from orchestrator.ssh.plan import LaunchPlan

# Runs a pull, handing it a progress callback (or None): the caller draws the bars.
PullBars = Callable[[Callable[[Progress | None], list[PullReport]]], list[PullReport]]


class CheckView(Protocol):
    """What `orch check` shows, drawn by the caller (the CLI) as the backend finds it.

    1. `notice()` is a diagnostic for stderr (host keys, say), as a Reporter's.
    2. `probing(message)` is held while hosts are probed (a spinner on a terminal).
    3. `report()` shows the SSH hosts' table: a row per host, then each problem.
    4. `findings()` shows what was found, a line each, then each error with its hint.
    """

    def notice(self, message: str) -> None: ...

    def probing(self, message: str) -> AbstractContextManager[None]: ...

    def report(self, report: CheckReport) -> None: ...

    def findings(self, lines: Sequence[str], errors: Sequence[OrchError]) -> None: ...


@dataclass
class HostsView:
    """`orch status --hosts`: each host's units (GPUs or slots), free or held by whom,
    the jobs waiting in each host's line, and the hosts that did not answer."""

    units: list[dict[str, Any]] = field(default_factory=list)
    queue: list[dict[str, Any]] = field(default_factory=list)
    errors: list[OrchError] = field(default_factory=list)
    warm: list[dict[str, Any]] = field(default_factory=list)  # this user's warm interpreters


class Backend(Protocol):
    """Where jobs run, and the verbs that manage them there.

    1. `name` is what a job record's `backend` holds for the jobs it ran.
    2. `submit()` checks everything that needs no host first (InputError: nothing
       started), records the job and calls `reporter.job_started(id)` before the job
       runs anywhere; attached it returns once the job succeeded, and raises JobFailed
       (the job stopped everywhere) or Interrupted (Ctrl-C; stopped everywhere);
       detached it returns once the job runs on by itself. It returns the job's id.
    3. `dry_run()` is what `orch submit --dry-run` prints, a line each; `plan()` the
       launch plan; neither touches a host.
    4. `status()` brings one job's record up to date with where it runs, and returns
       it; `thorough`: the job was asked for by name, and a backend may look further
       (SSH: whether a lost node still runs there, and then it stops it). `note()` is
       what `orch status` adds to the job's state, "" for nothing. `places()` says
       where each pending job of this backend stands in line ("queued, 2nd in line on
       node1"), one look for all of them; a job it has nothing to say of is left out.
    5. `logs()` hands the job's output to `reporter` as it comes, from where it runs
       (else the local copy); with `follow`, on until the job ends, stopping the job
       when a node fails (and, SSH, a lost node found still running at the end). It
       returns 0, or with `follow` the job's exit code.
    6. `kill()` stops the job wherever it runs and says what it did; a job that had
       ended is left alone. Hosts that could not be reached are in its outcome, not
       raised.
    7. `pull()` copies the job's outputs here, through `bars`; `top()` yields
       refreshes of a running job, until it ends.
    8. `check()` shows what would keep a job from running through `view`, and says
       whether any error was found. `hosts()` is what `orch status --hosts` shows.
       `warm()` starts, before a job's first submit, the warm interpreters its ranks
       would be forked from (`orch warm JOB`): each host's, and the hosts' errors.
    9. What a backend cannot do yet it refuses with one error, `Unsupported`
       (exit 2), raised from its one list of what it lacks; never an `if` above it.
    """

    @property
    def name(self) -> str: ...

    def submit(
        self,
        job: JobSpec,
        inventory: Inventory,
        reporter: Reporter,
        *,
        detach: bool = False,
        outputs_dir: Path | None = None,
        no_wait: bool = False,
    ) -> str: ...

    def dry_run(self, job: JobSpec, inventory: Inventory) -> list[str]: ...

    def plan(self, job: JobSpec, inventory: Inventory) -> LaunchPlan: ...

    def status(
        self, record: JobRecord, store: JobDB, reporter: Reporter, thorough: bool = False
    ) -> JobRecord: ...

    def note(self, record: JobRecord) -> str: ...

    def places(self, records: Sequence[JobRecord], store: JobDB) -> dict[str, str]: ...

    def logs(
        self, record: JobRecord, store: JobDB, want: LogFilter, follow: bool, reporter: Reporter
    ) -> int: ...

    def kill(self, record: JobRecord, store: JobDB, reporter: Reporter) -> KillOutcome: ...

    def pull(
        self,
        record: JobRecord,
        target: Path,
        paths: Sequence[str],
        every_node: bool | None,
        reporter: Reporter,
        bars: PullBars,
    ) -> list[PullReport]: ...

    def top(
        self,
        record: JobRecord,
        store: JobDB,
        reporter: Reporter,
        interval_s: float,
        silent_s: float,
    ) -> Iterator[TopView]: ...

    def check(
        self,
        inventory: Inventory,
        job: JobSpec | None,
        view: CheckView,
        *,
        bandwidth: bool = False,
        compute: bool = False,
    ) -> bool: ...

    def hosts(self, inventory: Inventory, reporter: Reporter) -> HostsView: ...

    def warm(
        self, job: JobSpec, inventory: Inventory, reporter: Reporter
    ) -> tuple[dict[str, WarmStart], list[OrchError]]: ...
