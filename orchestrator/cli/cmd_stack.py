"""`orch stack`: every rank's Python stack, grouped; `--json` for scripts."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from orchestrator.api import watch
from orchestrator.cli.app import JobIdArg, app
from orchestrator.cli.console import ConsoleReporter


@app.command("stack")
def stack_command(
    job_id: JobIdArg,
    rank: Annotated[
        list[int] | None,
        typer.Option("--rank", help="Only this global rank (again for more).", min=0),
    ] = None,
    node: Annotated[
        list[str] | None, typer.Option("--node", help="Only this host's ranks (again for more).")
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option("-v", "--verbose", help="Every frame of every thread, each rank apart."),
    ] = False,
    native: Annotated[
        bool, typer.Option("--native", help="C frames too (where py-spy reads the rank).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object, for scripts.")] = False,
) -> None:
    """Show the Python stack of every rank of a running job, from every host at once,
    grouped by identical stacks, the largest group first: where a hung job waits.
    Each dump is also kept with the job's records (the path is printed on stderr).
    """
    found = watch.stack(
        job_id, tuple(rank or ()), tuple(node or ()), native=native, reporter=ConsoleReporter()
    )
    if as_json:
        typer.echo(json.dumps(found.to_json(), indent=2))
    else:
        for line in watch.stack_lines(found, verbose):
            typer.echo(line)
    if found.saved:
        typer.echo(f"saved: {found.saved}", err=True)
