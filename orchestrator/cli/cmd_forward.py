"""`orch forward JOB PORT[:LOCAL]`: a port of a running job's host at this machine's
localhost, until Ctrl-C."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.api import watch
from orchestrator.cli.app import JobIdArg, app
from orchestrator.cli.console import ConsoleReporter


@app.command("forward")
def forward_command(
    job_id: JobIdArg,
    ports: Annotated[
        str,
        typer.Argument(
            metavar="PORT[:LOCAL]",
            help="The port on the host, and on this machine (default: the same; 0: any free).",
        ),
    ],
    node: Annotated[
        str | None, typer.Option("--node", help="The node's host (default: the master's).")
    ] = None,
) -> None:
    """Carry a port of a running job's host (its master, or --node) to 127.0.0.1 on
    this machine, through the job's SSH connection, until Ctrl-C: TensorBoard or
    Jupyter on the master in this machine's browser. The first line is the address.
    """
    port, local_port = watch.parse_ports(ports)
    reporter = ConsoleReporter()
    with watch.forward(job_id, port, local_port, node, reporter=reporter) as forwarding:
        typer.echo(forwarding.address)
        reporter.notice(
            f"forwarding port {port} of {forwarding.host.name} to {forwarding.address} until Ctrl-C"
        )
        forwarding.serve()
