"""`orch ui`: the page of jobs, live logs, curves and hosts, served on this machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.app import app


@app.command()
def ui(
    inventory: Annotated[
        list[Path] | None,
        typer.Option(
            "-i",
            "--inventory",
            help="An inventory whose hosts the page shows (again for more; "
            "default: $ORCH_INVENTORY, else localhost).",
        ),
    ] = None,
    port: Annotated[
        int,
        typer.Option("--port", min=0, max=65535, help="Port on 127.0.0.1 (0: any free one)."),
    ] = 0,
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Print the address only; open no browser.")
    ] = False,
) -> None:
    """Serve a page on 127.0.0.1 with every job (live), a job's nodes, ranks, log and
    curves, and the hosts over time; its address, with the token every request needs,
    is the first line printed. Runs until Ctrl-C.
    """
    # The page is the only verb with a web server behind it: its room, orchestrator/ui,
    # is a client of the API as the CLI is, and is imported only here.
    from orchestrator.ui import Server

    server = Server(inventory or [], port)
    typer.echo(server.url)
    sys.stdout.flush()
    if not no_browser and server.open_browser():
        typer.echo("opened in your browser", err=True)
    try:
        server.run()
    except KeyboardInterrupt:
        typer.echo("stopped", err=True)
        raise typer.Exit(130) from None
