"""`orch check`: a row per host, then each problem with its fix."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from orchestrator import backends
from orchestrator.cli.app import InventoryOpt, app
from orchestrator.cli.check_view import bandwidth_table, bandwidth_title, host_table, summary_lines
from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.errors import EXIT_INFRA, OrchError
from orchestrator.models.inventory import resolve_inventory
from orchestrator.models.job import load_job
from orchestrator.ssh.check.run import CheckReport


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
    compute: Annotated[
        bool, typer.Option("--compute", help="Slurm: also probe a compute node through srun.")
    ] = False,
) -> None:
    """Find what would make a job hang: a row per host, then each problem with its fix.

    Exits 3 when any error is found (what submit would refuse), else 0.
    """
    spec = load_job(job) if job else None
    found = resolve_inventory(inventory, spec.inventory if spec else None)
    backend = backends.for_inventory(found)
    if backend.check(found, spec, _ConsoleView(), bandwidth=bandwidth, compute=compute):
        raise typer.Exit(EXIT_INFRA)


class _ConsoleView:
    """What `orch check` shows, as the backend finds it (backends.CheckView)."""

    def __init__(self) -> None:
        self.notice = ConsoleReporter().notice

    @contextmanager
    def probing(self, message: str) -> Iterator[None]:
        """A spinner on stderr while hosts are probed, when stderr is a terminal."""
        err = Console(stderr=True)
        if not err.is_terminal:
            yield
            return
        with err.status(message):
            yield

    def report(self, report: CheckReport) -> None:
        console = _wide_console()
        console.print(host_table(report))
        if report.throughput is not None:
            console.print(bandwidth_title(report))
            console.print(bandwidth_table(report))
        for line in summary_lines(report):
            console.print(line)

    def findings(self, lines: Sequence[str], errors: Sequence[OrchError]) -> None:
        """Each finding, then each error with its hint."""
        for line in lines:
            typer.echo(line)
        for error in errors:
            sys.stderr.write(f"error: {error.message}\n")
            if error.hint:
                sys.stderr.write(f"hint: {error.hint}\n")


def _wide_console() -> Console:
    """stdout for tables; when it is not a terminal, wide enough that rows never wrap."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=250)
