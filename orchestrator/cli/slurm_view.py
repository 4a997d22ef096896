"""What `orch check` shows for a Slurm inventory (orchestrator/slurm/check.py)."""

from __future__ import annotations

import sys

import typer

from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.errors import EXIT_INFRA
from orchestrator.models.inventory import Inventory
from orchestrator.models.job import JobSpec
from orchestrator.slurm.check import run_check


def slurm_check(inventory: Inventory, job: JobSpec | None, compute: bool) -> int:
    """Print each finding, then each error with its hint; the exit code (3 on errors)."""
    notices = ConsoleReporter()
    found = run_check(inventory, job, compute, notices.notice)
    for line in found.lines:
        typer.echo(line)
    for error in found.errors:
        sys.stderr.write(f"error: {error.message}\n")
        if error.hint:
            sys.stderr.write(f"hint: {error.hint}\n")
    return EXIT_INFRA if found.errors else 0
