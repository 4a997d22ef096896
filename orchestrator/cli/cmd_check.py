"""`orch check`: a row per host, then each problem with its fix."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.api import cluster
from orchestrator.api.cluster import CheckLine, CheckOptions, CheckResult, CheckTable, Mark
from orchestrator.api.errors import EXIT_INFRA
from orchestrator.cli.app import InventoryOpt, app
from orchestrator.cli.console import ConsoleReporter

STYLE = {Mark.ERROR: "bold red", Mark.WARNING: "yellow", Mark.PASSED: "green"}


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
    options = CheckOptions(bandwidth=bandwidth, compute=compute)
    with _probing("probing the job's hosts" if job else "probing the hosts"):
        found = cluster.check(job, inventory, options, ConsoleReporter())
    show(found)
    if found.failed:
        raise typer.Exit(EXIT_INFRA)


@contextmanager
def _probing(message: str) -> Iterator[None]:
    """A spinner on stderr while hosts are probed, when stderr is a terminal."""
    err = Console(stderr=True)
    if not err.is_terminal:
        yield
        return
    with err.status(message):
        yield


def show(found: CheckResult) -> None:
    """The tables and lines on stdout, each error with its hint on stderr."""
    console = _wide_console()
    for table in found.tables:
        if table.title:
            console.print(Text(table.title))
        console.print(_table(table))
    for line in found.lines:
        console.print(_line(line))
    for error in found.errors:
        sys.stderr.write(f"error: {error.message}\n")
        if error.hint:
            sys.stderr.write(f"hint: {error.hint}\n")


def _table(found: CheckTable) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for column in found.columns:
        table.add_column(
            column.title, justify="right" if column.right else "left", no_wrap=column.no_wrap
        )
    for row in found.rows:
        table.add_row(*(Text(c.text, style=STYLE[c.mark] if c.mark else "") for c in row))
    return table


def _line(line: CheckLine) -> Text:
    style = STYLE[line.mark] if line.mark else ""
    if line.head:
        return Text.assemble((line.head, style), ": ", line.text)
    return Text(line.text, style=style)


def _wide_console() -> Console:
    """stdout for tables; when it is not a terminal, wide enough that rows never wrap."""
    console = Console(highlight=False)
    return console if console.is_terminal else Console(highlight=False, width=250)
