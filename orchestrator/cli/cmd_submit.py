"""`orch submit`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator import api
from orchestrator.api import Overrides
from orchestrator.api.errors import InputError
from orchestrator.api.progress import PROGRESS_EVERY_S, ProgressMode
from orchestrator.cli.app import InventoryOpt, ProgressEveryOpt, ProgressOpt, app
from orchestrator.cli.console import ConsoleReporter


@app.command()
def submit(
    job: Annotated[Path, typer.Argument(help="Job file (YAML).")],
    script_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="After --: arguments added after the job's args (where a flag comes twice, "
            "scripts take the last); with --replace-args, instead of them.",
            show_default=False,
        ),
    ] = None,
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
    env: Annotated[
        list[str] | None,
        typer.Option(
            "--env", help="NAME=value over the job's env (repeatable).", metavar="NAME=VALUE"
        ),
    ] = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", min=1, help="Instead of the job's nodes:.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Instead of the job's name:.")] = None,
    nproc_per_node: Annotated[
        int | None,
        typer.Option("--nproc-per-node", min=1, help="Instead of the job's nproc_per_node:."),
    ] = None,
    replace_args: Annotated[
        bool, typer.Option("--replace-args", help="Arguments after -- replace the job's args.")
    ] = False,
    no_wait: Annotated[
        bool,
        typer.Option("--no-wait", help="Exit 3 at once where the GPUs or slots are held."),
    ] = False,
    cold: Annotated[
        bool,
        typer.Option("--cold", help="Start every rank cold, even where a warm interpreter waits."),
    ] = False,
    stall_after: Annotated[
        int | None,
        typer.Option(
            "--stall-after",
            metavar="SECONDS",
            help="Instead of the job's stall_after: when no rank has printed a line for "
            "this long (at least 10), take every rank's stack and fail the job as stalled.",
        ),
    ] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority",
            metavar="LEVEL",
            help="Instead of the job's priority: low, normal or high: its place in a shared "
            "host's line (high only where the hosts' policy names you).",
        ),
    ] = None,
    wheels: Annotated[
        str | None,
        typer.Option(
            "--wheels",
            metavar="DIR|download",
            help="Instead of the job's wheels: a directory of wheels that the hosts install "
            "the job's environment: from, with no index, or download: this machine "
            "downloads them for the hosts' platform and Python.",
        ),
    ] = None,
    notify: Annotated[
        str | None,
        typer.Option(
            "--notify",
            metavar="URL|COMMAND",
            help="Instead of the job's notify: where word goes when the job ends, fails, "
            "restarts or stalls: a webhook's URL or a shell command.",
        ),
    ] = None,
) -> None:
    """Run a job on its hosts and stream every rank's output.

    A sweep needs no copies of the job file, for example:
    orch submit job.yaml --name lr-0.1 --env LR=0.1 -- --lr 0.1
    """
    overrides = Overrides(
        env=dict(_pair(item) for item in env or []),
        nodes=nodes,
        name=name,
        nproc_per_node=nproc_per_node,
        args=tuple(script_args or ()),
        replace_args=replace_args,
        no_wait=no_wait,
        cold=cold,
        stall_after=stall_after,
        wheels=wheels,
        notify=notify,
        priority=priority,
    )
    if dry_run:  # each host's command (a Slurm cluster: the batch script and sbatch)
        typer.echo("\n".join(api.dry_run(job, inventory, overrides=overrides)))
        return
    with ConsoleReporter(progress, progress_every) as reporter:
        api.submit(
            job,
            inventory,
            detach=detach,
            overrides=overrides,
            outputs_dir=outputs_dir,
            reporter=reporter,
        )  # returns once the job succeeded (detached: started); else raises


def _pair(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep:
        raise InputError(f"--env {item!r}: expected NAME=value", "write --env NAME=value")
    return name, value
