"""orch from Python, what a client watches of one job while it runs: its outputs copied
here (`pull`, `orch pull`), refreshes of how each node and rank is doing (`top`,
`orch top`) and every rank's Python stack (`stack`, `orch stack`), from wherever the
job runs.

```python
from orchestrator.api import watch

for view in watch.top("digits-ab12cd"):      # TopView: nodes, ranks, who is behind
    print([(n.host, n.behind) for n in view.nodes])
reports = watch.pull("digits-ab12cd")        # into ./orch-outputs/digits-ab12cd
for group in watch.stack("digits-ab12cd").groups:   # ranks with one stack, largest first
    print(group.ranks, [f.where for f in group.frames])
```
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from orchestrator import backends
from orchestrator.api import PathLike, _owner_only, _path
from orchestrator.api.lines import QuietReporter
from orchestrator.backends import ExecOptions, PullBars
from orchestrator.nodes.into import Forwarding, ForwardOptions, ShellOptions, parse_ports
from orchestrator.records.db import JobDB

if TYPE_CHECKING:
    from orchestrator.nodes.execute import HostRun
from orchestrator.records.samples import SampleLog
from orchestrator.reporting.pull import Progress, PullReport, default_target
from orchestrator.reporting.reporter import Reporter
from orchestrator.reporting.stacks import Frame, RankDump, StackGroup, StackOptions, StackView
from orchestrator.reporting.stacks import lines as stack_lines
from orchestrator.reporting.top import (
    INTERVAL_S,
    SILENT_S,
    GpuView,
    HostSample,
    NodeView,
    RankView,
    TopView,
    host_samples,
    pick_job,
)

__all__ = [
    "INTERVAL_S",
    "SILENT_S",
    "ForwardOptions",
    "Forwarding",
    "Frame",
    "GpuView",
    "HostSample",
    "NodeView",
    "Progress",
    "PullBars",
    "PullReport",
    "RankDump",
    "RankView",
    "ShellOptions",
    "StackGroup",
    "StackOptions",
    "StackView",
    "TopView",
    "exec_in_job",
    "forward",
    "parse_ports",
    "pull",
    "samples",
    "shell",
    "stack",
    "stack_lines",
    "top",
]


def _quietly(run: Callable[[Progress | None], list[PullReport]]) -> list[PullReport]:
    return run(None)


def pull(
    job_id: str,
    paths: Sequence[str] = (),
    target: PathLike | None = None,
    *,
    every_node: bool | None = None,
    reporter: Reporter | None = None,
    bars: PullBars = _quietly,
) -> list[PullReport]:
    """`orch pull`: copy a job's outputs (its ORCH_OUTPUT_DIR) here, also while it
    runs; a second pull moves only what changed.

    Args:
        job_id: the job's id, or a unique prefix of it.
        paths: paths or globs in its output directory (default: its `outputs:`, else all).
        target: where they go (default ./orch-outputs/JOB_ID).
        every_node: from every node (into HOST/ folders), or node rank 0's only
            (None: as the job's `outputs:` say).
        bars: runs the pull, handing it a progress callback (the CLI draws bars).

    Returns:
        A report per node: files, bytes, what was unchanged, where it went, errors.

    Raises:
        InputError: no such job.
        InfraError: its hosts could not be reached.
    """
    with _owner_only():
        record = JobDB().get(job_id)
        where = _path(target) or default_target(record.id)
        wanted = list(paths) or list(record.view.outputs)
        backend = backends.for_record(record)
        return backend.pull(record, where, wanted, every_node, reporter or QuietReporter(), bars)


def top(
    job_id: str | None = None,
    interval_s: float = INTERVAL_S,
    silent_s: float = SILENT_S,
    reporter: Reporter | None = None,
    *,
    keep: bool = False,
) -> Iterator[TopView]:
    """`orch top`: refreshes of a running job (default: the newest that has not
    ended), `interval_s` apart, until it ends (the last view says so) or the caller
    stops. The first has no rates yet: they need two samples. `silent_s`: how long a
    rank that prints may be silent before it is behind. `keep`: each refresh's hosts
    go into the job's records too (`samples` reads them back: a page's hosts over time).

    Raises:
        InputError: no such job, it has ended, or none runs.
        HostError / MultiHostError: no host of the job answers.
    """
    with _owner_only():
        store = JobDB()
        record = pick_job(store, job_id)
        backend = backends.for_record(record)
        views = backend.top(record, store, reporter or QuietReporter(), interval_s, silent_s)
        kept = SampleLog(store.home, record.id) if keep else None
    for view in views:
        if kept is not None:
            with _owner_only():
                kept.add(s.to_json() for s in host_samples(view))
        yield view


def samples(job_id: str, since: float | None = None) -> list[HostSample]:
    """What `top(keep=True)` kept of a job: each host at each refresh, of the last hour
    (or since `since`), oldest first.

    Raises:
        InputError: no such job.
    """
    with _owner_only():
        store = JobDB()
        record = store.get(job_id)
        rows = SampleLog(store.home, record.id).read(since)
    return [HostSample.from_json(row) for row in rows]


def stack(
    job_id: str,
    ranks: Sequence[int] = (),
    nodes: Sequence[str] = (),
    *,
    native: bool = False,
    reporter: Reporter | None = None,
) -> StackView:
    """`orch stack`: the Python stack of every rank of a running job (or of `ranks`
    on `nodes`), from every host at once, grouped by identical stacks, the largest
    group first; kept in the job's records too (`StackView.saved`).

    Args:
        job_id: the job's id, or a unique prefix of it.
        ranks: only these global ranks (default: all).
        nodes: only the ranks on these hosts (default: all).
        native: C frames too, where py-spy reads the rank.

    Returns:
        The groups, every rank's threads (or why it could not be read), the hosts
        that did not answer.

    Raises:
        InputError: no such job, it has ended (the error names its kept stacks), or
            no such rank or node.
        HostError / MultiHostError: no host of the job answered.
    """
    with _owner_only():
        store = JobDB()
        record = store.get(job_id)
        backend = backends.for_record(record)
        options = StackOptions(tuple(ranks), tuple(nodes), native)
        return backend.stack(record, store, options, reporter or QuietReporter())


def forward(
    job_id: str,
    port: int,
    local_port: int | None = None,
    node: str | None = None,
    *,
    reporter: Reporter | None = None,
) -> Forwarding:
    """`orch forward`: `port` on the host of a running job's node (default: its
    master), at 127.0.0.1:`local_port` on this machine (None: the same number; 0: any
    free one), through the job's SSH connection to that host: TensorBoard or Jupyter
    on the master, in the laptop's browser.

    Returns:
        The open forward: `.address`, then `.serve()` until `.close()` (a context
        manager closes it too).

    Raises:
        InputError: no such job, it has ended, no such node, the local port is taken.
        HostError: the host does not answer.
    """
    with _owner_only():
        record = JobDB().get(job_id)
        backend = backends.for_record(record)
        options = ForwardOptions(port, local_port, node)
        return backend.forward(record, options, reporter or QuietReporter())


def shell(
    job_id: str,
    node: str | None = None,
    command: Sequence[str] = (),
    *,
    reporter: Reporter | None = None,
) -> int:
    """`orch ssh`: a shell on the host of a running job's node (default: its master),
    in the job's code directory, with the job's environment (not what only its ranks
    get), on this process's terminal; or `command` there instead.

    Returns:
        The shell's (or the command's) exit status.

    Raises:
        InputError: no such job, it has ended (the hint says where its files are), no
            such node.
        HostError: the host does not answer.
    """
    with _owner_only():
        record = JobDB().get(job_id)
        backend = backends.for_record(record)
        options = ShellOptions(node, tuple(command))
        return backend.shell(record, options, reporter or QuietReporter())


def exec_in_job(
    job_id: str, command: Sequence[str], *, reporter: Reporter | None = None
) -> list[HostRun]:
    """`orch exec JOB -- COMMAND`: `command` on every node of a running job at once, each
    in its node's code directory with the job's environment (as `shell` gives it); each
    output line goes to `reporter.output(host, None, line)`.

    Returns:
        Each node's run, in node rank order.

    Raises:
        InputError: no such job, it has ended (the hint says where its files are), or
            no command.
        ExecFailed: it failed on some node (its exit code is the worst node's).
        Unsupported: the backend reaches no node of a running job (Slurm).
    """
    with _owner_only():
        record = JobDB().get(job_id)
        backend = backends.for_record(record)
        return backend.exec_in_job(record, ExecOptions(tuple(command)), reporter or QuietReporter())
