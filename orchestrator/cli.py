"""The `orch` command line: parse, print, exit. The only module that does any of those.

Results go to stdout (the job id, the ranks' lines), diagnostics to stderr. Every
OrchError is caught in `main` and shown as `error: ...` and `hint: ...` with its exit
code; no traceback ever reaches the user.
"""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from orchestrator import service
from orchestrator.models.errors import EXIT_INTERRUPTED, InputError, OrchError
from orchestrator.plan import describe

app = typer.Typer(
    name="orch",
    help="Launch PyTorch distributed training on machines you can reach over SSH.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

InventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "-i", "--inventory", help="Inventory file (else $ORCH_INVENTORY, the job's, localhost)."
    ),
]


class ConsoleReporter:
    """Prints a running job: prefixed rank lines on stdout, notices on stderr."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def job_started(self, job_id: str) -> None:
        self._out(f"job {job_id}\n")

    def line(self, host: str, rank: int | None, text: str) -> None:
        prefix = f"[{host} r{rank}]" if rank is not None else f"[{host}]"
        self._out(f"{prefix} {text}\n")

    def notice(self, message: str) -> None:
        with self._lock:
            sys.stderr.write(f"orch: {message}\n")
            sys.stderr.flush()

    def _out(self, text: str) -> None:
        with self._lock:
            sys.stdout.write(text)
            sys.stdout.flush()


@app.callback()
def _root(
    verbose: Annotated[
        int, typer.Option("-v", "--verbose", count=True, help="More diagnostics on stderr.")
    ] = 0,
) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(relativeCreated)6.0fms %(levelname)s %(name)s: %(message)s",
    )
    if verbose < 2:
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)


@app.command()
def submit(
    job: Annotated[Path, typer.Argument(help="Job file (YAML).")],
    inventory: InventoryOpt = None,
    detach: Annotated[
        bool, typer.Option("-d", "--detach", help="Return once every node has started.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each host's command; touch no host.")
    ] = False,
) -> None:
    """Run a job on its hosts and stream every rank's output."""
    sub = service.prepare(job, inventory)
    if dry_run:
        for line in describe(service.dry_run(sub)):
            typer.echo(line)
        return
    code = service.submit(sub, ConsoleReporter(), detach=detach)
    raise typer.Exit(code)


def _not_yet(command: str) -> NoReturn:
    raise InputError(
        f"'orch {command}' is not available in this version yet",
        "follow a job with an attached 'orch submit' for now",
    )


@app.command()
def status(job_id: Annotated[str | None, typer.Argument()] = None) -> None:
    """Table of jobs, or one job's nodes."""
    _not_yet("status")


@app.command()
def logs(
    job_id: str,
    follow: Annotated[bool, typer.Option("-f", "--follow")] = False,
    node: Annotated[str | None, typer.Option("--node")] = None,
    rank: Annotated[int | None, typer.Option("--rank")] = None,
    tail: Annotated[int | None, typer.Option("--tail")] = None,
) -> None:
    """Print a job's output."""
    _not_yet("logs")


@app.command()
def kill(
    job_id: Annotated[str | None, typer.Argument()] = None,
    all_jobs: Annotated[bool, typer.Option("--all")] = False,
) -> None:
    """Stop a job on every host."""
    _not_yet("kill")


@app.command()
def check(
    job: Annotated[Path | None, typer.Argument()] = None, inventory: InventoryOpt = None
) -> None:
    """Find misconfigurations that make multi-node jobs hang."""
    _not_yet("check")


def main() -> NoReturn:
    """Entry point: run the app; map errors to `error:`/`hint:` lines and exit codes.

    typer itself turns usage errors into exit 2 and Ctrl-C into exit 130.
    """
    try:
        app()
    except OrchError as exc:
        _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", "", EXIT_INTERRUPTED)
    except Exception as exc:  # anything unforeseen: still never a traceback
        logging.getLogger(__name__).debug("unexpected error", exc_info=True)
        _fail(f"internal error: {exc!r}", "run again with -vv and report the output", 1)
    sys.exit(0)


def _fail(message: str, hint: str, code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.exit(code)
