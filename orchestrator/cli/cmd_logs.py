"""`orch logs`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator import api
from orchestrator.api.progress import PROGRESS_EVERY_S, ProgressMode
from orchestrator.cli.app import JobIdArg, ProgressEveryOpt, ProgressOpt, app
from orchestrator.cli.console import ConsoleReporter


@app.command()
def logs(
    job_id: JobIdArg,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Go on until the job ends.")
    ] = False,
    node: Annotated[str | None, typer.Option("--node", help="Only this host's lines.")] = None,
    rank: Annotated[
        int | None, typer.Option("--rank", help="Only this global rank's lines.")
    ] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", help="Only the last N lines of each rank.")
    ] = None,
    progress: ProgressOpt = ProgressMode.AUTO,
    progress_every: ProgressEveryOpt = PROGRESS_EVERY_S,
) -> None:
    """Print everything a job's ranks have written, as [host rN] line.

    A progress bar's line shows in its last state; with -f, a bar that moves is
    redrawn in place on a terminal, else printed every --progress-every seconds.
    """
    # What is already written prints as lines; only -f has bars that move.
    with ConsoleReporter(progress, progress_every, redraw=None if follow else False) as out:
        code = api.job(job_id).logs_to(out, follow, node=node, rank=rank, tail=tail)
    raise typer.Exit(code)
