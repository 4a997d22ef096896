"""`orch env`."""

from __future__ import annotations

import time

import typer

from orchestrator.api import cluster
from orchestrator.api.errors import combined
from orchestrator.cli.app import InventoryOpt, app
from orchestrator.cli.console import ConsoleReporter


@app.command("env")
def env_command(inventory: InventoryOpt = None) -> None:
    """Your environments on the inventory's hosts (built from jobs' environment:), with
    their size and last use; orch gc removes those unused for $ORCH_KEEP_ENVS_DAYS."""
    found = cluster.envs(inventory, ConsoleReporter())
    now = time.time()
    for host, rows in found.results.items():
        if not rows:
            typer.echo(f"{host}: no environment")
        for e in rows:
            days = max(0.0, now - e.used) / 86400
            held = ", ".join(e.requirements) or "-"
            typer.echo(f"{host}: {e.key} {e.size / 1e6:.1f} MB, used {days:.1f} days ago: {held}")
    if found.errors:
        raise combined(found.errors)
