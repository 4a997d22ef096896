"""`orch exec`."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.app import HostsOpt, InventoryOpt, LabelsOpt, _names, app
from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.errors import ExecFailed
from orchestrator.models.inventory import pick_hosts, resolve_inventory
from orchestrator.nodes.execute import run_everywhere
from orchestrator.transport.base import ConnectOptions


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
    selected = pick_hosts(resolve_inventory(inventory, None), _names(hosts), _names(labels))
    printer = ConsoleReporter()
    runs = run_everywhere(
        selected,
        command,
        lambda host, line: printer.output(host, None, (line + "\n").encode()),
        ConnectOptions(notice=printer.notice),
    )
    if any(not r.ok for r in runs):
        raise ExecFailed(runs)
