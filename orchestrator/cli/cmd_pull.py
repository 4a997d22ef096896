"""`orch pull`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import DownloadColumn, TextColumn, TransferSpeedColumn
from rich.progress import Progress as Bars

from orchestrator.api import watch
from orchestrator.api.watch import Progress, PullReport
from orchestrator.cli.app import JobIdArg, app
from orchestrator.cli.console import ConsoleReporter


@app.command("pull")
def pull_command(
    job_id: JobIdArg,
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Paths or globs in the output directory (default: the job's outputs:, else all)."
        ),
    ] = None,
    outputs_dir: Annotated[
        Path | None,
        typer.Option("--outputs-dir", help="Where to put them (default: ./orch-outputs/JOB_ID)."),
    ] = None,
    every_node: Annotated[
        bool | None,
        typer.Option(
            "--all-nodes/--rank0",
            help="From every node (into HOST/ folders), or node rank 0's only (default: as the job's outputs: say).",
        ),
    ] = None,
) -> None:
    """Copy a job's outputs (its ORCH_OUTPUT_DIR) from the hosts, also while it runs.
    A second pull moves only what changed."""
    reports = watch.pull(
        job_id,
        paths or (),
        outputs_dir,
        every_node=every_node,
        reporter=ConsoleReporter(),
        bars=with_progress,
    )
    for line in summary(reports):
        typer.echo(line)


def with_progress(run: Callable[[Progress | None], list[PullReport]]) -> list[PullReport]:
    """Run the pull with a bar per host on a terminal (stderr), quietly elsewhere."""
    if not sys.stderr.isatty():
        return run(None)
    with Bars(
        TextColumn("{task.description}"),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        tasks: dict[str, int] = {}

        def progress(host: str, done: int) -> None:
            if host not in tasks:
                tasks[host] = bar.add_task(f"pull {host}", total=None)
            bar.update(tasks[host], completed=done)  # type: ignore[arg-type]

        return run(progress)


def summary(reports: list[PullReport]) -> list[str]:
    """A line per node: what came, what was already here, where it went."""
    lines = []
    for r in reports:
        unchanged = f", {r.unchanged} unchanged" if r.unchanged else ""
        lines.append(
            f"[{r.host}] {r.files} files ({r.bytes / 1e6:.1f} MB){unchanged} -> {r.target}"
        )
        lines += [f"[{r.host}] could not copy {e}" for e in r.errors]
    return lines
