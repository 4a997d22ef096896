"""`orch exec [--] COMMAND` on the inventory's hosts; `orch exec JOB -- COMMAND` on a
running job's nodes."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from orchestrator.api import cluster, watch
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
    `orch exec JOB -- COMMAND` runs it on every node of a running job instead, each in
    its node's code directory with the job's environment (as `orch ssh JOB NODE --
    COMMAND` does).

    Each output line comes as [host] line. The exit code is the worst host's; each host
    that failed is named with its exit code.
    """
    job_id, command = job_and_command(command, sys.argv)
    reporter = ConsoleReporter()
    if job_id is not None:
        if hosts or labels or inventory:
            raise typer.BadParameter(
                "orch exec JOB runs on the job's own nodes: drop -i, --hosts and --labels"
            )
        watch.exec_in_job(job_id, command, reporter=reporter)  # raises ExecFailed too
        return
    cluster.exec_command(
        command, inventory, hosts=_names(hosts), labels=_names(labels), reporter=reporter
    )  # raises ExecFailed, with the worst host's exit code, where any failed


def job_and_command(words: list[str], argv: list[str]) -> tuple[str | None, list[str]]:
    """`JOB -- COMMAND` (one word, then `--`: a job) or `[--] COMMAND` (the hosts').

    Click keeps a `--` that comes after the first word, and takes away one that comes
    first: `orch exec -- rm -- f` is the hosts' `rm -- f`, which the process's own argv
    (one `--` more than the words have) tells apart from `orch exec JOB -- rm f`."""
    if len(words) >= 2 and words[1] == "--" and argv.count("--") == words.count("--"):
        return words[0], words[2:]
    return None, words
