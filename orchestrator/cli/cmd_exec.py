"""`orch exec`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.api import cluster
from orchestrator.cli.app import HostsOpt, InventoryOpt, LabelsOpt, _names, app
from orchestrator.cli.console import ConsoleReporter


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_command(
    command: Annotated[
        list[str], typer.Argument(help="The command: one shell line, or a program and its args.")
    ],
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    labels: LabelsOpt = None,
) -> None:
    """Run a command on every selected host in parallel: `orch exec -- nvidia-smi`.

    Each output line comes as [host] line. The exit code is the worst host's; each host
    that failed is named with its exit code.
    """
    cluster.exec_command(
        command, inventory, hosts=_names(hosts), labels=_names(labels), reporter=ConsoleReporter()
    )  # raises ExecFailed, with the worst host's exit code, where any failed
