"""The Backend protocol: where orch runs jobs, behind one set of verbs.

Two implementations: `SshBackend` (backends/ssh.py: the inventory's hosts, over SSH;
the code in ssh/) and `SlurmBackend` (backends/slurm.py: a Slurm cluster through its
login node; the code in slurm/). The backend is chosen once, where the inventory is
read (`backends.for_inventory`) or from a job's record (`backends.for_record`); the
CLI and the Python API call these verbs and never ask which backend it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from orchestrator.reporting.pull import Progress, PullReport

if TYPE_CHECKING:  # names for the signatures only: `orch kill` need not import ssh/check/
    from orchestrator.bench.allreduce import AllreduceOptions, BenchListener, SizeResult
    from orchestrator.models.inventory import Inventory
    from orchestrator.models.job import JobSpec
    from orchestrator.nodes.execute import HostRun
    from orchestrator.nodes.into import Forwarding, ForwardOptions, ShellOptions
    from orchestrator.records.db import JobDB, JobRecord
    from orchestrator.reporting.check import CheckResult
    from orchestrator.reporting.filters import LogFilter
    from orchestrator.reporting.hosts import Environment, HostsView, PerHost, WarmInterpreter
    from orchestrator.reporting.outcomes import GcOutcome, KillOutcome, WarmStart
    from orchestrator.reporting.reporter import Reporter
    from orchestrator.reporting.stacks import StackOptions, StackView
    from orchestrator.reporting.top import TopView
    from orchestrator.ssh.plan import LaunchPlan

# Runs a pull, handing it a progress callback (or None): the caller draws the bars.
PullBars = Callable[[Callable[[Progress | None], list[PullReport]]], list[PullReport]]


@dataclass(frozen=True)
class CheckOptions:
    """`orch check`: what to look at beyond what every check does. A backend looks at
    what it can of them and passes over the rest."""

    bandwidth: bool = False  # SSH: TCP throughput between each host and the master
    compute: bool = False  # Slurm: a compute node probed through srun


@dataclass(frozen=True)
class ExecOptions:
    """`orch exec`: the command (one shell line, or a program and its args) and the
    hosts it runs on (names, labels; none of either: every host)."""

    command: tuple[str, ...]
    hosts: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class GcOptions:
    """`orch gc`: finished jobs per host that keep their code (None: the default),
    and whether ended jobs' output directories go too."""

    keep: int | None = None
    outputs: bool = False


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
    8. `check()` finds what would keep a job from running (`options`: what more to
       look at) and returns it as one CheckResult, whatever the backend: tables,
       lines, errors, and whether any error was found. `hosts()` is what `orch status
       --hosts` shows: typed rows, and the hosts that did not answer.
    9. `warm_start()` starts, before a job's first submit, the warm interpreters its
       ranks would be forked from (`orch warm JOB`); `warm_list()` lists this user's
       warm interpreters on the inventory's hosts, `warm_stop()` ends them. Each says
       what it did per host, and the errors of the hosts it could not do it on.
       `end_warm()` is what `orch kill --all` ends besides the jobs: the warm
       interpreters this backend's jobs (`records`) left on their hosts, and those
       `warm_start` started ahead; a backend that keeps none does nothing.
    10. `gc()` frees disk on the inventory's hosts (`orch gc`), one outcome per host;
       `envs()` lists this user's environments on them (`orch env`), per host, with
       the errors of the hosts that did not answer.
    11. `exec()` runs a command on the chosen hosts at once (`orch exec`): each output
       line to `reporter.output(host, None, line)`; it returns each host's run, and
       raises ExecFailed when any failed.
    12. `bench_allreduce()` runs the all_reduce sweep (`orch bench allreduce`) as a
       job of this backend, its rows to `listener` as they come.
    13. `stack()` takes the Python stack of each chosen rank of a running job, from
       every host at once, keeps the dump in the job's records and returns it grouped;
       a rank that cannot be read says why beside the others, a host that does not
       answer is named; an ended job is an InputError naming the dumps kept.
    14. What a backend cannot do it refuses with the one error `Unsupported` (exit 2;
       `Unsupported.verb` names the verb and the backend), raised from its one list
       of what it lacks before any host is contacted; never an `if` above it. Every
       verb here is implemented or refused by every backend in `backends.BACKENDS`.
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

    def stack(
        self, record: JobRecord, store: JobDB, options: StackOptions, reporter: Reporter
    ) -> StackView: ...

    def forward(
        self, record: JobRecord, options: ForwardOptions, reporter: Reporter
    ) -> Forwarding: ...

    def shell(self, record: JobRecord, options: ShellOptions, reporter: Reporter) -> int: ...

    def exec_in_job(
        self, record: JobRecord, options: ExecOptions, reporter: Reporter
    ) -> list[HostRun]: ...

    def check(
        self, inventory: Inventory, job: JobSpec | None, options: CheckOptions, reporter: Reporter
    ) -> CheckResult: ...

    def hosts(self, inventory: Inventory, reporter: Reporter) -> HostsView: ...

    def warm_start(
        self, job: JobSpec, inventory: Inventory, reporter: Reporter
    ) -> PerHost[WarmStart]: ...

    def warm_list(
        self, inventory: Inventory, reporter: Reporter
    ) -> PerHost[tuple[WarmInterpreter, ...]]: ...

    def warm_stop(self, inventory: Inventory, reporter: Reporter) -> PerHost[tuple[int, ...]]: ...

    def end_warm(self, records: Sequence[JobRecord], store: JobDB, reporter: Reporter) -> None: ...

    def gc(
        self, inventory: Inventory, options: GcOptions, reporter: Reporter
    ) -> dict[str, GcOutcome]: ...

    def envs(
        self, inventory: Inventory, reporter: Reporter
    ) -> PerHost[tuple[Environment, ...]]: ...

    def exec(
        self, inventory: Inventory, options: ExecOptions, reporter: Reporter
    ) -> list[HostRun]: ...

    def bench_allreduce(
        self, inventory: Inventory, options: AllreduceOptions, listener: BenchListener
    ) -> list[SizeResult]: ...
