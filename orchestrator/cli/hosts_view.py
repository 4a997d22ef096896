"""`orch status --hosts`: each host's GPUs (or slots), free or held by which job and
user since when, and the jobs waiting in its line."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.api import cluster
from orchestrator.api.cluster import QueueRow, UnitRow, WarmInterpreter, printable
from orchestrator.api.errors import combined
from orchestrator.cli.console import ConsoleReporter


def show_hosts(inventory_path: Path | None, as_json: bool) -> None:
    """Print every inventory host's units and line; hosts that do not answer are
    named, and make the exit code 3 once the rest is shown.

    Raises:
        OrchError: a host (or several) did not answer.
    """
    found = cluster.hosts(inventory_path, ConsoleReporter())
    if as_json:
        typer.echo(json.dumps(found.as_json(), indent=2))
    else:
        _print_tables(found.units, found.queue)
        _print_warm(found.warm)
    if found.errors:
        raise combined(found.errors)


def _print_tables(units: Sequence[UnitRow], line: Sequence[QueueRow]) -> None:
    console = Console()
    table = Table("host", "unit", "state", "job", "user", "since", box=None)
    for row in units:
        state = {"free": "[green]free[/green]", "held": "[cyan]held[/cyan]"}.get(
            row.state, "[red]busy (not orch)[/red]"
        )
        job = row.job or (f"pid {row.pid}" if row.pid is not None else "")
        table.add_row(
            row.host,
            f"{'GPU' if row.kind == 'gpu' else 'slot'} {row.unit}",
            state,
            _text(job),
            _text(row.user),
            _since(row.since),
        )
    console.print(table)
    if line:
        queue = Table(
            "host", "#", "job", "user", "wants", "priority", "since", box=None, title="in line"
        )
        for waiting in line:
            unit = "GPU" if waiting.kind == "gpu" else "slot"
            queue.add_row(
                waiting.host,
                str(waiting.position),
                _text(waiting.job),
                _text(waiting.user),
                f"{waiting.count} {unit}{'s' if waiting.count != 1 else ''}",
                waiting.priority,
                _since(waiting.since),
            )
        console.print(queue)


def _print_warm(rows: Sequence[WarmInterpreter]) -> None:
    """Your warm interpreters (docs/WARM.md), with their memory."""
    if not rows:
        return
    table = Table("host", "pid", "state", "preload", "memory (PSS)", "idle", box=None)
    table.title = "warm interpreters"
    for row in rows:
        table.add_row(
            row.host,
            str(row.pid),
            _text(row.state),
            _text(",".join(row.preload)),
            f"{row.pss_kb / 1024:.0f} MB" if row.pss_kb is not None else "?",
            f"{row.idle_s:.0f} s" if row.idle_s is not None else "",
        )
    Console().print(table)


def _text(value: object) -> str:
    """A job id or user name from another user's file: no control characters, and
    no rich markup either ('[/x]' would stop the table)."""
    return escape(printable(value)) if value else ""


def _since(when: float | None) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(when)) if when else ""
    except (OverflowError, ValueError, OSError, TypeError):
        return "?"
