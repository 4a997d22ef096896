"""The `orch` command line: parse, print, exit. The only module that does any of those.

Results go to stdout (the job id, the ranks' lines), diagnostics to stderr. Every
OrchError is caught in `main` and shown as `error: ...` and `hint: ...` with its exit
code; no traceback ever reaches the user.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from orchestrator import jobs, service
from orchestrator.allreduce_bench import (
    BENCH_HEADER,
    DEFAULT_SIZES,
    BenchSpec,
    SizeResult,
    average_busbw,
    choose_backend,
    format_row,
    parse_sizes,
    run_allreduce,
)
from orchestrator.check import run_check
from orchestrator.check_view import bandwidth_table, bandwidth_title, host_table, summary_lines
from orchestrator.execute import ExecFailed, pick_hosts, run_everywhere
from orchestrator.models.errors import (
    EXIT_INFRA,
    EXIT_INTERRUPTED,
    InputError,
    MultiHostError,
    OrchError,
)
from orchestrator.models.job import load_job
from orchestrator.models.states import JobState
from orchestrator.plan import describe
from orchestrator.push import PushProgress
from orchestrator.state import JobRecord, Store
from orchestrator.transport import ConnectOptions

app = typer.Typer(
    name="orch",
    help="Launch PyTorch distributed training on machines you can reach over SSH.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

InventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "-i", "--inventory", help="Inventory file (else $ORCH_INVENTORY, the job's, localhost)."
    ),
]


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


@app.callback()
def _root(
    verbose: Annotated[
        int, typer.Option("-v", "--verbose", count=True, help="More diagnostics on stderr.")
    ] = 0,
) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(relativeCreated)6.0fms %(levelname)s %(name)s: %(message)s",
    )
    if verbose < 2:
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)


@app.command()
def submit(
    job: Annotated[Path, typer.Argument(help="Job file (YAML).")],
    inventory: InventoryOpt = None,
    detach: Annotated[
        bool, typer.Option("-d", "--detach", help="Return once every node has started.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each host's command; touch no host.")
    ] = False,
) -> None:
    """Run a job on its hosts and stream every rank's output."""
    sub = service.prepare(job, inventory)
    if dry_run:
        for line in describe(service.dry_run(sub)):
            typer.echo(line)
        return
    code = service.submit(sub, ConsoleReporter(), detach=detach)
    raise typer.Exit(code)


@app.command()
def status(
    job_id: Annotated[str | None, typer.Argument(help="A job id (or a unique prefix).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Table of jobs, or one job's nodes; reconciled with the hosts."""
    records = jobs.status(Store(), job_id, ConsoleReporter())
    if as_json:
        typer.echo(json.dumps([_job_json(r) for r in records], indent=2))
        return
    console = Console()
    if job_id:
        console.print(_nodes_table(records[0]))
        return
    table = Table("id", "name", "state", "nodes", "started", "duration", "exit", box=None)
    for r in records:
        table.add_row(
            r.id,
            r.name,
            _state(r.state),
            str(len(r.nodes)),
            _when(r.started or r.created),
            _duration(r.duration),
            "" if r.exit_code is None else str(r.exit_code),
        )
    console.print(table if records else "no jobs yet: orch submit JOB.yaml")


def _state(state: JobState) -> str:
    color = {"succeeded": "green", "failed": "red", "lost": "red", "killed": "yellow"}.get(
        state.value, "cyan"
    )
    return f"[{color}]{state.value}[/{color}]"


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return ""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return str(code)


def _nodes_table(record: JobRecord) -> Table:
    table = Table(
        "host",
        "node rank",
        "ranks",
        "state",
        "exit",
        box=None,
        title=f"job {record.id} ({record.name}): {record.state.value}",
        title_justify="left",
    )
    for n in record.nodes:
        ranks = str(n.first_rank) if n.nproc == 1 else f"{n.ranks.start}-{n.ranks.stop - 1}"
        table.add_row(
            n.host.name, str(n.node_rank), ranks, _state(n.state), _exit_text(n.exit_code)
        )
    return table


def _job_json(r: JobRecord) -> dict[str, object]:
    return {
        "id": r.id,
        "name": r.name,
        "state": r.state.value,
        "created": r.created,
        "started": r.started,
        "ended": r.ended,
        "duration": r.duration,
        "exit_code": r.exit_code,
        "master_addr": r.master_addr,
        "master_port": r.master_port,
        "spec": r.spec,
        "nodes": [
            {
                "host": n.host.name,
                "address": n.host.address,
                "node_rank": n.node_rank,
                "ranks": list(n.ranks),
                "state": n.state.value,
                "exit_code": n.exit_code,
                "signal": _exit_text(n.exit_code) if (n.exit_code or 0) < 0 else None,
                "error": n.error,
            }
            for n in r.nodes
        ],
    }


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument(help="A job id (or a unique prefix).")],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Go on until the job ends.")
    ] = False,
    node: Annotated[str | None, typer.Option("--node", help="Only this host's lines.")] = None,
    rank: Annotated[
        int | None, typer.Option("--rank", help="Only this global rank's lines.")
    ] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", help="Only the last N lines of each rank.")
    ] = None,
) -> None:
    """Print everything a job's ranks have written, as [host rN] line."""
    want = jobs.LogFilter(node=node, rank=rank, tail=tail)
    raise typer.Exit(jobs.logs(Store(), job_id, want, follow, ConsoleReporter()))


@app.command()
def kill(
    job_id: Annotated[str | None, typer.Argument(help="A job id (or a unique prefix).")] = None,
    all_jobs: Annotated[
        bool, typer.Option("--all", help="Kill every job that has not ended.")
    ] = False,
) -> None:
    """Stop a job on every host: its process groups, then anything carrying its tag."""
    if (job_id is None) == (not all_jobs):
        raise InputError(
            "give a job id or --all, not both or neither", "orch kill JOB_ID  |  orch kill --all"
        )
    outcomes = jobs.kill(Store(), None if all_jobs else job_id, ConsoleReporter())
    unreachable = []
    for outcome in outcomes:
        if outcome.already is not None:
            typer.echo(
                f"job {outcome.job_id} had already ended ({outcome.already.value}): nothing to kill"
            )
            continue
        for host, killed in outcome.killed.items():
            what = ", ".join(
                f"{pid} {cmd.split(' ', 1)[0].rsplit('/', 1)[-1]}" for pid, cmd in killed
            )
            typer.echo(f"[{host}] killed {len(killed)} processes" + (f": {what}" if killed else ""))
        if outcome.port_free is not None:
            typer.echo(
                f"job {outcome.job_id}: rendezvous port "
                + ("free" if outcome.port_free else "STILL IN USE")
            )
        typer.echo(f"job {outcome.job_id} killed")
        unreachable += outcome.unreachable
    if unreachable:
        raise unreachable[0] if len(unreachable) == 1 else MultiHostError(unreachable)


@app.command()
def check(
    job: Annotated[
        Path | None,
        typer.Argument(help="A job file: also check its hosts' rendezvous port and python."),
    ] = None,
    inventory: InventoryOpt = None,
    bandwidth: Annotated[
        bool,
        typer.Option("--bandwidth", help="Also measure TCP throughput to the master and back."),
    ] = False,
) -> None:
    """Find what would make a job hang: a row per host, then each problem with its fix.

    Exits 3 when any error is found (what submit would refuse), else 0.
    """
    spec = load_job(job) if job else None
    found = service.resolve_inventory(inventory, spec)
    notices = ConsoleReporter()
    with _progress("probing the job's hosts" if spec else f"probing {len(found.hosts)} hosts"):
        report = run_check(found, spec, bandwidth, ConnectOptions(notice=notices.notice))
    console = _wide_console()
    console.print(host_table(report))
    if report.throughput is not None:
        console.print(bandwidth_title(report))
        console.print(bandwidth_table(report))
    for line in summary_lines(report):
        console.print(line)
    if report.errors:
        raise typer.Exit(EXIT_INFRA)


def _wide_console() -> Console:
    """stdout for tables; when it is not a terminal, wide enough that rows never wrap."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=250)


@contextmanager
def _progress(message: str) -> Iterator[None]:
    """A spinner on stderr while hosts are probed, when stderr is a terminal."""
    err = Console(stderr=True)
    if not err.is_terminal:
        yield
        return
    with err.status(message):
        yield


def _names(csv: str | None) -> list[str]:
    return [part.strip() for part in (csv or "").split(",") if part.strip()]


HostsOpt = Annotated[
    str | None, typer.Option("--hosts", help="Only these hosts (comma-separated names).")
]
LabelsOpt = Annotated[
    str | None, typer.Option("--labels", help="Only hosts with all these labels (comma-separated).")
]


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_command(
    command: Annotated[
        list[str], typer.Argument(help="The command: one shell line, or a program and its args.")
    ],
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    labels: LabelsOpt = None,
) -> None:
    """Run a command on every selected host in parallel: `orch exec -- nvidia-smi`.

    Each output line comes as [host] line. The exit code is the worst host's; each host
    that failed is named with its exit code.
    """
    selected = pick_hosts(service.resolve_inventory(inventory, None), _names(hosts), _names(labels))
    printer = ConsoleReporter()
    runs = run_everywhere(
        selected,
        command,
        lambda host, line: printer.output(host, None, (line + "\n").encode()),
        ConnectOptions(notice=printer.notice),
    )
    if any(not r.ok for r in runs):
        raise ExecFailed(runs)


bench_app = typer.Typer(
    name="bench", help="Measure the cluster as a job sees it.", no_args_is_help=True
)


class _BenchPrinter:
    """Prints a sweep as nccl-tests' all_reduce_perf does; rank output on stderr."""

    def __init__(self, hosts: list[str], spec: BenchSpec) -> None:
        self.hosts = hosts
        self.spec = spec
        self.notices = ConsoleReporter()

    def started(self, world: int, backend: str) -> None:
        typer.echo(
            f"# orch bench allreduce: {world} ranks on {', '.join(self.hosts)}; {backend}, "
            f"float32 sum, {self.spec.iters} iterations after {self.spec.warmup} warm-up"
        )
        typer.echo("#")
        for line in BENCH_HEADER:
            typer.echo(line)

    def row(self, result: SizeResult) -> None:
        typer.echo(format_row(result))

    def line(self, host: str, rank: int | None, text: str) -> None:
        prefix = f"[{host} r{rank}]" if rank is not None else f"[{host}]"
        sys.stderr.write(f"{prefix} {text}\n")

    def notice(self, message: str) -> None:
        self.notices.notice(message)


@bench_app.command("allreduce")
def bench_allreduce(
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    labels: LabelsOpt = None,
    sizes: Annotated[
        str | None,
        typer.Option(
            "--sizes", help="Bytes: 1K,1M or MIN:MAX[:FACTOR] (default 1K:16M:4, nccl 1K:1G:4)."
        ),
    ] = None,
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed all_reduces per size.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed ones before.")] = 5,
    backend: Annotated[
        str, typer.Option("--backend", help="auto (nccl when every host has GPUs), nccl, gloo.")
    ] = "auto",
    nproc_per_node: Annotated[
        int | None, typer.Option("--nproc-per-node", min=1, help="Default: each host's slots.")
    ] = None,
) -> None:
    """all_reduce sweep across the hosts: size, time, algorithm and bus bandwidth."""
    if backend not in ("auto", "nccl", "gloo"):
        raise InputError(f"unknown backend '{backend}'", "use auto, nccl or gloo")
    found = service.resolve_inventory(inventory, None)
    selected = pick_hosts(found, _names(hosts), _names(labels))
    chosen = choose_backend(selected, backend)
    spec = BenchSpec(
        chosen, parse_sizes(sizes or DEFAULT_SIZES[chosen]), iters, warmup, nproc_per_node
    )
    results = run_allreduce(found, selected, spec, _BenchPrinter([h.name for h in selected], spec))
    typer.echo(f"# Avg bus bandwidth    : {average_busbw(results):.3f} GB/s")


app.add_typer(bench_app)


@app.command("gc")
def gc_command(
    inventory: InventoryOpt = None,
    keep: Annotated[
        int | None,
        typer.Option(
            "--keep",
            min=0,
            help="Finished jobs per host that keep their code (default: $ORCH_KEEP_SNAPSHOTS, else 10).",
        ),
    ] = None,
) -> None:
    """Free disk space on the hosts: remove the code snapshots of finished jobs but the
    newest, and pushed content no snapshot uses. Logs and job records stay."""
    reports = service.gc(inventory, keep, ConsoleReporter().notice)
    for host, r in reports.items():
        typer.echo(
            f"{host}: removed {r.get('snapshots_removed', 0)} snapshots and "
            f"{r.get('objects_removed', 0)} files ({r.get('bytes_freed', 0) / 1e6:.1f} MB); "
            f"kept {r.get('snapshots_kept', 0)} finished, {r.get('running', 0)} running"
        )


def main() -> NoReturn:
    """Entry point: run the app; map errors to `error:`/`hint:` lines and exit codes.

    typer itself turns usage errors into exit 2 and Ctrl-C into exit 130.
    """
    try:
        app()
    except OrchError as exc:
        _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", "", EXIT_INTERRUPTED)
    except Exception as exc:  # anything unforeseen: still never a traceback
        logging.getLogger(__name__).debug("unexpected error", exc_info=True)
        _fail(f"internal error: {exc!r}", "run again with -vv and report the output", 1)
    sys.exit(0)


def _fail(message: str, hint: str, code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.exit(code)
