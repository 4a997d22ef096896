"""`orch gc`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.api import cluster
from orchestrator.api.cluster import GcOptions
from orchestrator.cli.app import InventoryOpt, app
from orchestrator.cli.console import ConsoleReporter


@app.command("gc")
def gc_command(
    inventory: InventoryOpt = None,
    keep: Annotated[
        int | None,
        typer.Option(
            "--keep",
            min=0,
            help="Finished jobs per host that keep their code (default: $ORCH_KEEP_SNAPSHOTS, else 10).",
        ),
    ] = None,
    outputs: Annotated[
        bool,
        typer.Option(
            "--outputs", help="Also remove the output directories of jobs that ended (pull first)."
        ),
    ] = False,
) -> None:
    """Free disk space on the hosts: remove the code snapshots of finished jobs but the
    newest, pushed content no snapshot uses, and environments unused for
    $ORCH_KEEP_ENVS_DAYS (default 14). Logs, job records and outputs stay, outputs
    unless --outputs."""
    found = cluster.gc(inventory, GcOptions(keep, outputs), ConsoleReporter())
    for host, r in found.items():
        gone = (
            f"; removed {r.outputs_removed} output directories ({r.outputs_bytes_freed / 1e6:.1f} MB)"
            if outputs
            else ""
        )
        typer.echo(
            f"{host}: removed {r.snapshots_removed} snapshots and "
            f"{r.objects_removed} files ({r.bytes_freed / 1e6:.1f} MB); "
            f"kept {r.snapshots_kept} finished, {r.running} running{gone}"
            + (f"; ended {r.warm_ended} warm interpreters" if r.warm_ended else "")
            + (f"; removed {r.envs_removed} unused environments" if r.envs_removed else "")
        )
