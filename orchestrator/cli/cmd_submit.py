"""`orch submit`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.app import InventoryOpt, ProgressEveryOpt, ProgressOpt, app
from orchestrator.cli.console import ConsoleReporter
from orchestrator.jobs import submit as submitting
from orchestrator.jobs.progress import PROGRESS_EVERY_S, ProgressMode
from orchestrator.plan import describe
from orchestrator.sync.ignore import collect_files


@app.command()
def submit(
    job: Annotated[Path, typer.Argument(help="Job file (YAML).")],
    inventory: InventoryOpt = None,
    detach: Annotated[
        bool, typer.Option("-d", "--detach", help="Return once every node has started.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each host's command; touch no host.")
    ] = False,
    progress: ProgressOpt = ProgressMode.AUTO,
    progress_every: ProgressEveryOpt = PROGRESS_EVERY_S,
    outputs_dir: Annotated[
        Path | None,
        typer.Option(
            "--outputs-dir",
            help="Where the job's outputs: go when it ends (default: ./orch-outputs/ID).",
        ),
    ] = None,
) -> None:
    """Run a job on its hosts and stream every rank's output."""
    sub = submitting.prepare(job, inventory, outputs_dir)
    if dry_run:
        for line in describe(submitting.dry_run(sub)):
            typer.echo(line)
        files = collect_files(sub.job.workdir, sub.job.exclude)  # and its ignore files read
        typer.echo(f"\npushes {len(files)} files from {sub.job.workdir}")
        return
    with ConsoleReporter(progress, progress_every) as reporter:
        code = submitting.submit(sub, reporter, detach=detach)
    raise typer.Exit(code)
