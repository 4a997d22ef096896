"""`orch init`: probe the named hosts, write the inventory, say what to run next; the
work is onboard/init.py's and onboard/render.py's."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from orchestrator.api.errors import InfraError, MultiHostError, OrchError
from orchestrator.api.onboard import (
    ConnectOptions,
    Probed,
    complete_aliases,
    describe,
    hosts_from_words,
    no_hosts,
    probe_all,
    render_inventory,
    split_words,
    write_new,
)
from orchestrator.cli.app import app

DEFAULT_OUTPUT = Path("inventory/hosts.yaml")


@app.command("init")
def init_command(
    hosts: Annotated[
        list[str] | None,
        typer.Argument(
            help="Hosts: ~/.ssh/config aliases or addresses (NAME=ADDRESS names one).",
            show_default=False,
            metavar="HOST...",
            autocompletion=complete_aliases,
        ),
    ] = None,
    hosts_csv: Annotated[
        str | None, typer.Option("--hosts", help="More hosts, comma-separated (as HOSTS).")
    ] = None,
    output: Annotated[
        Path, typer.Option("-o", "--output", help="The inventory file to write.")
    ] = DEFAULT_OUTPUT,
    force: Annotated[bool, typer.Option("--force", help="Replace the file if it exists.")] = False,
    user: Annotated[
        str | None,
        typer.Option("--user", help="Log in as this user (written as defaults: user:)."),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            help="An interpreter to look at first for torch on every host (else python3 on "
            "PATH, venvs, conda and pyenv installs in the home directory and /opt/conda, "
            "and this orch's own interpreter path).",
        ),
    ] = None,
) -> None:
    """Write an inventory of the named hosts, filled in with what a probe finds on each:
    GPUs, CPUs, and the python that has torch.

    Hosts come as ~/.ssh/config aliases (orch init node1 node2), whose User, Port,
    IdentityFile and ProxyJump then apply, or as addresses (--hosts 10.0.0.5,10.0.0.6).
    A host that cannot be reached or probed is written commented out, with the reason,
    and makes orch init exit 3 once the file is written. Never replaces a file without
    --force. Key login must work first: orch keys sets it up.
    """
    words = split_words(hosts or [], hosts_csv)
    if not words:
        raise no_hosts("init")
    targets = hosts_from_words(words, user)
    if output.exists() and not force:
        write_new(output, "", force=False)  # the one error an existing file gets
    options = ConnectOptions(notice=lambda message: typer.echo(f"orch: {message}", err=True))
    with _spinner(f"probing {len(targets)} host{'s' if len(targets) != 1 else ''}"):
        probed = probe_all(targets, options, python)
    for item in probed:
        typer.echo(f"[{item.host.name}] {_summary(item)}")
    failed = [p.error for p in probed if p.error is not None]
    if len(failed) == len(probed):
        raise failed[0] if len(failed) == 1 else MultiHostError(failed)
    source = "orch init " + shlex.join(words)
    write_new(output, render_inventory(probed, source, str(output), user), force)
    reached = len(probed) - len(failed)
    typer.echo(f"wrote {output}: {reached} host{'s' if reached != 1 else ''}")
    typer.echo(f"next: orch check -i {shlex.quote(str(output))}")
    if failed:
        raise _left_out(failed, output)


def _summary(item: Probed) -> str:
    if item.found is None:
        return f"not probed: {item.error.what if item.error else 'no answer'}"
    found = item.found
    text = describe(found.facts, found.cpus)
    if found.torch_python:
        return f"{text}; python: {found.torch_python}"
    return (
        f"{text}; NO TORCH in {', '.join(found.candidates)}: "
        "a job's environment: [torch, ...] can bring it (docs/ENVIRONMENTS.md)"
    )


def _left_out(failed: list[OrchError], output: Path) -> InfraError:
    names = ", ".join(e.host or "?" for e in failed)
    hint = failed[0].hint
    fix = f"{hint}{' ' if hint.endswith(('?', '.')) else '; '}then: " if hint else ""
    return InfraError(
        f"{names} could not be probed: commented out in {output}",
        f"{fix}orch init again with --force, or uncomment the host",
    )


@contextmanager
def _spinner(message: str) -> Iterator[None]:
    """A spinner on stderr while hosts are probed, when stderr is a terminal."""
    err = Console(stderr=True)
    if not err.is_terminal or not sys.stderr.isatty():
        yield
        return
    with err.status(message):
        yield
