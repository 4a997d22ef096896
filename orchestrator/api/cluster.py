"""orch from Python, the verbs of the inventory's hosts rather than of one job: what
they hold (`hosts`), what would keep a job from running (`check`), a command on each
(`exec_command`), disk freed (`gc`), warm interpreters (`warm_start`, `warm_list`,
`warm_stop`) and the all_reduce sweep (`bench_allreduce`). The `orch` CLI calls these.

```python
from orchestrator.api import cluster

found = cluster.check("job.yaml", "cluster.yaml", cluster.CheckOptions(bandwidth=True))
print(found.failed, [str(line) for line in found.lines])
for row in cluster.hosts("cluster.yaml").units:    # UnitRow(host, kind, unit, state, ...)
    ...
```

Each goes through the inventory's backend; a verb the backend cannot do raises
`Unsupported` (exit 2), naming the verb and the backend, before any host is contacted.
Results are frozen dataclasses; what a host says meanwhile goes to `reporter`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator import backends
from orchestrator.agent.kernel.lease_wire import printable
from orchestrator.api import PathLike, _owner_only, _path
from orchestrator.api.lines import QuietReporter
from orchestrator.backends import Backend, CheckOptions, ExecOptions, GcOptions
from orchestrator.bench.allreduce import (
    BENCH_HEADER,
    AllreduceOptions,
    BenchListener,
    BenchSpec,
    SizeResult,
    average_busbw,
    format_row,
)
from orchestrator.models.inventory import Inventory, resolve_inventory
from orchestrator.models.job import load_job
from orchestrator.nodes.execute import HostRun
from orchestrator.reporting.check import Cell, CheckLine, CheckResult, CheckTable, Column, Mark
from orchestrator.reporting.hosts import (
    Environment,
    HostsView,
    PerHost,
    QueueRow,
    UnitRow,
    WarmInterpreter,
)
from orchestrator.reporting.outcomes import GcOutcome, WarmStart
from orchestrator.reporting.reporter import Reporter

__all__ = [
    "BENCH_HEADER",
    "AllreduceOptions",
    "BenchListener",
    "BenchSpec",
    "Cell",
    "CheckLine",
    "CheckOptions",
    "CheckResult",
    "CheckTable",
    "Column",
    "Environment",
    "ExecOptions",
    "GcOptions",
    "GcOutcome",
    "HostRun",
    "HostsView",
    "Mark",
    "PerHost",
    "QueueRow",
    "SizeResult",
    "UnitRow",
    "WarmInterpreter",
    "WarmStart",
    "average_busbw",
    "bench_allreduce",
    "check",
    "exec_command",
    "format_row",
    "gc",
    "hosts",
    "printable",
    "warm_list",
    "warm_start",
    "warm_stop",
]


def _chosen(inventory: PathLike | None) -> tuple[Inventory, Backend]:
    """The inventory (`inventory`, else $ORCH_INVENTORY, else localhost) and its backend.

    Raises:
        InputError: a bad inventory.
    """
    found = resolve_inventory(_path(inventory), None)
    return found, backends.for_inventory(found)


def hosts(inventory: PathLike | None = None, reporter: Reporter | None = None) -> HostsView:
    """`orch status --hosts`: each host's GPUs (or slots), free or held by which job and
    user since when, the jobs waiting in each host's line, this user's warm
    interpreters, and the errors of the hosts that did not answer.

    Raises:
        InputError: a bad inventory.
    """
    with _owner_only():
        found, backend = _chosen(inventory)
        return backend.hosts(found, reporter or QuietReporter())


def check(
    job: PathLike | None = None,
    inventory: PathLike | None = None,
    options: CheckOptions | None = None,
    reporter: Reporter | None = None,
) -> CheckResult:
    """`orch check`: what would keep a job (or any job, without one) from running on
    the inventory's hosts; `.failed` when it found an error, what submit would refuse.

    Raises:
        InputError: a bad job file or inventory.
    """
    with _owner_only():
        spec = load_job(Path(job)) if job is not None else None
        found = resolve_inventory(_path(inventory), spec.inventory if spec else None)
        backend = backends.for_inventory(found)
        return backend.check(found, spec, options or CheckOptions(), reporter or QuietReporter())


def exec_command(
    command: Sequence[str],
    inventory: PathLike | None = None,
    *,
    hosts: Sequence[str] = (),
    labels: Sequence[str] = (),
    reporter: Reporter | None = None,
) -> list[HostRun]:
    """`orch exec`: run `command` (one shell line, or a program and its args) on the
    chosen hosts at once; each output line goes to `reporter.output(host, None, line)`.

    Returns:
        Each host's run, in host order.

    Raises:
        InputError: no command, or hosts the inventory does not have.
        ExecFailed: it failed on some host (its exit code is the worst host's).
        Unsupported: the backend runs no command on its hosts (Slurm).
    """
    options = ExecOptions(tuple(command), tuple(hosts), tuple(labels))
    with _owner_only():
        found, backend = _chosen(inventory)
        return backend.exec(found, options, reporter or QuietReporter())


def gc(
    inventory: PathLike | None = None,
    options: GcOptions | None = None,
    reporter: Reporter | None = None,
) -> dict[str, GcOutcome]:
    """`orch gc`: free disk on the inventory's hosts (old code snapshots, content no
    snapshot uses; outputs too with `options.outputs`), and end the warm interpreters.

    Raises:
        HostError / MultiHostError: hosts that could not be reached or collected.
        Unsupported: the backend keeps nothing to collect on its hosts (Slurm).
    """
    with _owner_only():
        found, backend = _chosen(inventory)
        return backend.gc(found, options or GcOptions(), reporter or QuietReporter())


def envs(
    inventory: PathLike | None = None, reporter: Reporter | None = None
) -> PerHost[tuple[Environment, ...]]:
    """`orch env`: this user's environments on each host (docs/ENVIRONMENTS.md), most
    recently used first, with their size and last use.

    Returns:
        Per host that answered, its environments; the errors of the hosts that did not.

    Raises:
        Unsupported: the backend builds no environment (Slurm).
    """
    with _owner_only():
        found, backend = _chosen(inventory)
        return backend.envs(found, reporter or QuietReporter())


def warm_start(
    job: PathLike, inventory: PathLike | None = None, reporter: Reporter | None = None
) -> PerHost[WarmStart]:
    """`orch warm JOB`: start the warm interpreters the job's ranks would be forked from
    on its hosts, before its first submit.

    Raises:
        InputError: a bad job file or inventory.
        Unsupported: the backend keeps no interpreter warm (Slurm).
    """
    with _owner_only():
        chosen = backends.load(Path(job), _path(inventory))
        reporter = reporter or QuietReporter()
        return chosen.backend.warm_start(chosen.job, chosen.inventory, reporter)


def warm_list(
    inventory: PathLike | None = None, reporter: Reporter | None = None
) -> PerHost[tuple[WarmInterpreter, ...]]:
    """`orch warm`: this user's warm interpreters on each host, with their memory.

    Returns:
        Per host that answered, its warm interpreters (none: an empty tuple); the
        errors of the hosts that did not.

    Raises:
        Unsupported: the backend keeps no interpreter warm (Slurm).
    """
    with _owner_only():
        found, backend = _chosen(inventory)
        return backend.warm_list(found, reporter or QuietReporter())


def warm_stop(
    inventory: PathLike | None = None, reporter: Reporter | None = None
) -> PerHost[tuple[int, ...]]:
    """`orch warm --stop`: end this user's warm interpreters on the inventory's hosts
    (a job's next ranks then start cold), and say which pids ended where.

    Raises:
        Unsupported: on a Slurm inventory, where none is kept between jobs.
    """
    reporter = reporter or QuietReporter()
    with _owner_only():
        found, backend = _chosen(inventory)
        return backend.warm_stop(found, reporter)


def bench_allreduce(
    options: AllreduceOptions, listener: BenchListener, inventory: PathLike | None = None
) -> list[SizeResult]:
    """`orch bench allreduce`: an all_reduce sweep across the chosen hosts, run as a
    job; each row goes to `listener` as it comes, and all of them are returned.

    Raises:
        InputError: bad options, or hosts the inventory does not have.
        JobFailed: a rank failed; the sweep was stopped on every host.
        Unsupported: the backend cannot pick hosts by name for it (Slurm).
    """
    with _owner_only():
        found, backend = _chosen(inventory)
        return backend.bench_allreduce(found, options, listener)
