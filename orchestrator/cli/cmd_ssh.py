"""`orch ssh JOB [NODE] [-- COMMAND...]`: a shell where a running job's node runs."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from orchestrator.api import watch
from orchestrator.api.errors import InputError
from orchestrator.cli.app import JobIdArg, app
from orchestrator.cli.console import ConsoleReporter


@app.command("ssh")
def ssh_command(
    job_id: JobIdArg,
    words: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NODE] [-- COMMAND...]",
            help="The node's host (default: the master's); after --, a command to run.",
        ),
    ] = None,
) -> None:
    """Open a shell on the host of a running job's node, in the job's code directory,
    with the job's environment (its env:, ORCH_* and devices; not what only its ranks
    get), as kubectl exec does; `-- COMMAND` runs that instead. Exits with the shell's
    status.
    """
    node, command = node_and_command(list(words or ()), sys.argv)
    code = watch.shell(job_id, node, tuple(command), reporter=ConsoleReporter())
    raise typer.Exit(code)


def node_and_command(words: list[str], argv: list[str]) -> tuple[str | None, list[str]]:
    """NODE and COMMAND from the words after JOB (click takes `--` away: the process's
    own argv says where it was)."""
    after = len(argv) - argv.index("--") - 1 if "--" in argv else 0
    before, command = (words[:-after], words[-after:]) if after else (words, [])
    if len(before) > 1:
        raise InputError(
            f"orch ssh takes one node, not {' '.join(before)}",
            "orch ssh JOB [NODE] [-- COMMAND...]",
        )
    return (before[0] if before else None), command
