"""`orch warm`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator import backends
from orchestrator.cli.app import InventoryOpt, app
from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.errors import InputError, MultiHostError, OrchError
from orchestrator.models.inventory import resolve_inventory
from orchestrator.nodes import warm


@app.command("warm")
def warm_command(
    job: Annotated[
        Path | None,
        typer.Argument(
            help="A job file: start the warm interpreters its ranks are forked from, "
            "so that its first submit runs warm too."
        ),
    ] = None,
    inventory: InventoryOpt = None,
    stop: Annotated[
        bool, typer.Option("--stop", help="End your warm interpreters on the hosts.")
    ] = False,
) -> None:
    """Your warm interpreters on the inventory's hosts, with their memory (PSS): each
    job leaves one on its hosts when it ends, and a resubmit's ranks are forked from
    it. With a job file, start the job's before its first submit. --stop ends them."""
    if job is not None:
        if stop:
            raise InputError(
                "orch warm --stop ends every warm interpreter of yours: it takes no job file",
                "orch warm --stop -i INVENTORY",
            )
        _start(job, inventory)
        return
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
    _raise(failures)


def _start(job: Path, inventory: Path | None) -> None:
    """`orch warm JOB`: a line per host, then the hosts' errors."""
    chosen = backends.load(job, inventory)
    started, failures = chosen.backend.warm(chosen.job, chosen.inventory, ConsoleReporter())
    imports = ", ".join(chosen.job.preload) or "nothing"
    for host, one in started.items():
        what = f"starting (it imports {imports})" if one.started else "there already"
        typer.echo(f"{host}: warm interpreter pid {one.pid} {what}")
    _raise(failures)


def _raise(failures: list[OrchError]) -> None:
    if failures:
        raise failures[0] if len(failures) == 1 else MultiHostError(failures)
