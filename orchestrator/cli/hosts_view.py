"""`orch status --hosts`: each host's GPUs (or slots), free or held by which job and
user since when, and the jobs waiting in its line."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator import backends
from orchestrator.agent.kernel.lease_wire import printable
from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.errors import MultiHostError
from orchestrator.models.inventory import resolve_inventory


def show_hosts(inventory_path: Path | None, as_json: bool) -> None:
    """Print every inventory host's units and line; hosts that do not answer are
    named, and make the exit code 3 once the rest is shown.

    Raises:
        OrchError: a host (or several) did not answer.
    """
    inventory = resolve_inventory(inventory_path, None)
    found = backends.for_inventory(inventory).hosts(inventory, ConsoleReporter())
    if as_json:
        typer.echo(
            json.dumps({"units": found.units, "queue": found.queue, "warm": found.warm}, indent=2)
        )
    else:
        _print_tables(found.units, found.queue)
        _print_warm(found.warm)
    errors = found.errors
    if errors:
        raise errors[0] if len(errors) == 1 else MultiHostError(errors)


def _print_tables(units: list[dict[str, Any]], line: list[dict[str, Any]]) -> None:
    console = Console()
    table = Table("host", "unit", "state", "job", "user", "since", box=None)
    for row in units:
        state = {"free": "[green]free[/green]", "held": "[cyan]held[/cyan]"}.get(
            row["state"], "[red]busy (not orch)[/red]"
        )
        job = row.get("job") or (f"pid {row['pid']}" if "pid" in row else "")
        table.add_row(
            row["host"],
            f"{'GPU' if row['kind'] == 'gpu' else 'slot'} {row['unit']}",
            state,
            _text(job),
            _text(row.get("user")),
            _since(row.get("since")),
        )
    console.print(table)
    if line:
        queue = Table("host", "#", "job", "user", "wants", "since", box=None, title="in line")
        for row in line:
            unit = "GPU" if row["kind"] == "gpu" else "slot"
            queue.add_row(
                row["host"],
                str(row["position"]),
                _text(row["job"]),
                _text(row["user"]),
                f"{row['count']} {unit}{'s' if row['count'] != 1 else ''}",
                _since(row.get("since")),
            )
        console.print(queue)


def _print_warm(rows: list[dict[str, Any]]) -> None:
    """Your warm interpreters (docs/WARM.md), with their memory."""
    if not rows:
        return
    table = Table("host", "pid", "state", "preload", "memory (PSS)", "idle", box=None)
    table.title = "warm interpreters"
    for row in rows:
        kb = row.get("pss_kb")
        idle = row.get("idle_s")
        table.add_row(
            row["host"],
            str(row.get("pid")),
            _text(row.get("state")),
            _text(",".join(map(str, row.get("preload") or []))),
            f"{kb / 1024:.0f} MB" if isinstance(kb, int) else "?",
            f"{idle:.0f} s" if isinstance(idle, (int, float)) else "",
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
