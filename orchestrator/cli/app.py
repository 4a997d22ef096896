"""The typer app that every `cmd_*` module adds its verb to, and the options they share."""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
import typer.main
from typer import _click
from typer.core import TyperGroup

from orchestrator.api.progress import AUTO_MAX, ProgressMode

# Each verb is its own cmd_* module, which adds it to `app`; listed in the order
# `orch --help` shows them. A verb's module is imported when that verb runs (or help
# lists them all): `orch kill` need not import what submit and check need (0.1 s).
VERBS = {
    "submit": "cmd_submit",
    "status": "cmd_status",
    "logs": "cmd_logs",
    "top": "cmd_top",
    "stack": "cmd_stack",
    "forward": "cmd_forward",
    "ssh": "cmd_ssh",
    "ui": "cmd_ui",
    "kill": "cmd_kill",
    "pull": "cmd_pull",
    "check": "cmd_check",
    "exec": "cmd_exec",
    "bench": "cmd_bench",
    "gc": "cmd_gc",
    "env": "cmd_env",
    "warm": "cmd_warm",
    "keys": "cmd_keys",
    "init": "cmd_init",
}


class Verbs(TyperGroup):
    """orch's verbs, each added to the group from its module on first use."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return [*VERBS, *(name for name in super().list_commands(ctx) if name not in VERBS)]

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name not in self.commands and cmd_name in VERBS:
            importlib.import_module(f"orchestrator.cli.{VERBS[cmd_name]}")
            for name, command in typer.main.get_group(app).commands.items():
                self.commands.setdefault(name, command)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    cls=Verbs,
    name="orch",
    help="Launch PyTorch distributed training on machines you can reach over SSH.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    pretty_exceptions_enable=False,
    # Help texts are plain text: `[host rN]` in a docstring is what the user sees, not
    # markup for rich to eat.
    rich_markup_mode=None,
)


InventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "-i", "--inventory", help="Inventory file (else $ORCH_INVENTORY, the job's, localhost)."
    ),
]


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


def _names(csv: str | None) -> list[str]:
    return [part.strip() for part in (csv or "").split(",") if part.strip()]


HostsOpt = Annotated[
    str | None, typer.Option("--hosts", help="Only these hosts (comma-separated names).")
]


LabelsOpt = Annotated[
    str | None, typer.Option("--labels", help="Only hosts with all these labels (comma-separated).")
]


ProgressOpt = Annotated[
    ProgressMode,
    typer.Option(
        "--progress",
        envvar="ORCH_PROGRESS",
        case_sensitive=False,
        help="Which ranks' progress bars (tqdm, rich, ...) show while they move: auto (every "
        f"bar up to {AUTO_MAX}, beyond that the slowest, the fastest and a count of the "
        "others), all, rank0 or none. Each bar's final state is always printed.",
    ),
]


ProgressEveryOpt = Annotated[
    float,
    typer.Option(
        "--progress-every",
        envvar="ORCH_PROGRESS_EVERY",
        min=0.0,
        metavar="SECONDS",
        help="When stdout is not a terminal: print a moving bar at most once every "
        "SECONDS per rank (a terminal redraws it in place).",
    ),
]


def complete_job_ids(incomplete: str) -> list[str]:
    """Job ids for shell completion, newest first (no error ever reaches the shell)."""
    from orchestrator import api

    try:
        return [job.id for job in api.jobs() if job.id.startswith(incomplete)]
    except Exception:  # a missing or locked database: nothing to offer
        return []


JobIdArg = Annotated[
    str,
    typer.Argument(help="A job id (or a unique prefix).", autocompletion=complete_job_ids),
]
OptionalJobIdArg = Annotated[
    str | None,
    typer.Argument(help="A job id (or a unique prefix).", autocompletion=complete_job_ids),
]
