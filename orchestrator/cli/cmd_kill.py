"""`orch kill`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator import api
from orchestrator.api.errors import InputError, MultiHostError, OrchError
from orchestrator.cli.app import OptionalJobIdArg, app
from orchestrator.cli.console import ConsoleReporter


@app.command()
def kill(
    job_id: OptionalJobIdArg = None,
    all_jobs: Annotated[
        bool, typer.Option("--all", help="Kill every job that has not ended.")
    ] = False,
) -> None:
    """Stop a job on every host: its process groups, then anything carrying its tag."""
    if (job_id is None) == (not all_jobs):
        raise InputError(
            "give a job id or --all, not both or neither", "orch kill JOB_ID  |  orch kill --all"
        )
    out = ConsoleReporter()
    outcomes = api.kill_all(out) if job_id is None else [api.job(job_id, out).kill()]
    unreachable: list[OrchError] = []
    for outcome in outcomes:
        if outcome.notes:  # a Slurm job: scancel did it
            typer.echo("\n".join(outcome.notes))
            continue
        if outcome.already is not None:
            typer.echo(
                f"job {outcome.job_id} had already ended ({outcome.already.value}): nothing to kill"
            )
            continue
        for host, killed in outcome.killed.items():
            what = ", ".join(
                f"{pid} {cmd.split(' ', 1)[0].rsplit('/', 1)[-1]}" for pid, cmd in killed
            )
            typer.echo(f"[{host}] killed {len(killed)} processes" + (f": {what}" if killed else ""))
        if outcome.port_free is not None:
            typer.echo(
                f"job {outcome.job_id}: rendezvous port "
                + ("free" if outcome.port_free else "STILL IN USE")
            )
        typer.echo(f"job {outcome.job_id} killed")
        unreachable += outcome.unreachable
    if unreachable:
        raise unreachable[0] if len(unreachable) == 1 else MultiHostError(unreachable)
