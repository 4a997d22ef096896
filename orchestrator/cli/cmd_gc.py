"""`orch gc`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.app import InventoryOpt, app
from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.inventory import resolve_inventory
from orchestrator.nodes import warm
from orchestrator.sync.gc import gc


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
    newest, and pushed content no snapshot uses. Logs, job records and outputs stay,
    outputs unless --outputs."""
    notice = ConsoleReporter().notice
    reports = gc(inventory, keep, notice, outputs)
    # Warm interpreters hold memory, not disk, but gc is where hosts are cleaned up.
    stopped, _ = warm.stop(list(resolve_inventory(inventory, None).hosts), notice)
    for host, r in reports.items():
        gone = (
            f"; removed {r.outputs_removed} output directories ({r.outputs_bytes_freed / 1e6:.1f} MB)"
            if outputs
            else ""
        )
        typer.echo(
            f"{host}: removed {r.snapshots_removed} snapshots and "
            f"{r.objects_removed} files ({r.bytes_freed / 1e6:.1f} MB); "
            f"kept {r.snapshots_kept} finished, {r.running} running{gone}"
            + (f"; ended {len(stopped[host])} warm interpreters" if stopped.get(host) else "")
        )
