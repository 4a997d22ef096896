"""`orch warm`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.app import InventoryOpt, app
from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.errors import MultiHostError
from orchestrator.models.inventory import resolve_inventory
from orchestrator.nodes import warm


@app.command("warm")
def warm_command(
    inventory: InventoryOpt = None,
    stop: Annotated[
        bool, typer.Option("--stop", help="End your warm interpreters on the hosts.")
    ] = False,
) -> None:
    """Your warm interpreters on the inventory's hosts, with their memory (PSS): each
    job leaves one on its hosts when it ends, and a resubmit's ranks are forked from
    it. --stop ends them."""
    hosts = list(resolve_inventory(inventory, None).hosts)
    notice = ConsoleReporter().notice
    if stop:
        stopped, failures = warm.stop(hosts, notice)
        for host, pids in stopped.items():
            typer.echo(f"{host}: ended {len(pids)} warm interpreters")
    else:
        found, failures = warm.listing(hosts, notice)
        for host, processes in found.items():
            if not processes:
                typer.echo(f"{host}: no warm interpreter")
            for p in processes:
                memory = f"{p.pss_kb / 1024:.0f} MB" if p.pss_kb is not None else "?"
                idle = f", idle {p.idle_s:.0f} s" if p.idle_s is not None else ""
                typer.echo(
                    f"{host}: pid {p.pid} {p.state}, preload {','.join(p.preload) or '-'}, "
                    f"{memory} PSS{idle}"
                )
    if failures:
        raise failures[0] if len(failures) == 1 else MultiHostError(failures)
