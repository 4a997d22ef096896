"""`orch warm`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.api import cluster
from orchestrator.api.errors import InputError, combined
from orchestrator.cli.app import InventoryOpt, app
from orchestrator.cli.console import ConsoleReporter


@app.command("warm")
def warm_command(
    job: Annotated[
        Path | None,
        typer.Argument(
            help="A job file: start the warm interpreters its ranks are forked from, "
            "so that its first submit does not wait for their import."
        ),
    ] = None,
    inventory: InventoryOpt = None,
    stop: Annotated[
        bool, typer.Option("--stop", help="End your warm interpreters on the hosts.")
    ] = False,
) -> None:
    """Your warm interpreters on the inventory's hosts, with their memory (PSS): a
    job's first submit starts one on each of its hosts, its ranks and a resubmit's are
    forked from it. With a job file, start the job's before its first submit. --stop
    ends them."""
    reporter = ConsoleReporter()
    if job is not None:
        if stop:
            raise InputError(
                "orch warm --stop ends every warm interpreter of yours: it takes no job file",
                "orch warm --stop -i INVENTORY",
            )
        started = cluster.warm_start(job, inventory, reporter)
        for host, one in started.results.items():
            imports = ", ".join(one.imports) or "nothing"
            what = f"starting (it imports {imports})" if one.started else "there already"
            typer.echo(f"{host}: warm interpreter pid {one.pid} {what}")
        errors = started.errors
    elif stop:
        stopped = cluster.warm_stop(inventory, reporter)
        for host, pids in stopped.results.items():
            typer.echo(f"{host}: ended {len(pids)} warm interpreters")
        errors = stopped.errors
    else:
        found = cluster.warm_list(inventory, reporter)
        for host, processes in found.results.items():
            if not processes:
                typer.echo(f"{host}: no warm interpreter")
            for p in processes:
                memory = f"{p.pss_kb / 1024:.0f} MB" if p.pss_kb is not None else "?"
                idle = f", idle {p.idle_s:.0f} s" if p.idle_s is not None else ""
                typer.echo(
                    f"{host}: pid {p.pid} {p.state}, preload {','.join(p.preload) or '-'}, "
                    f"{memory} PSS{idle}"
                )
        errors = found.errors
    if errors:
        raise combined(errors)
