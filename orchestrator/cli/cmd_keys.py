"""`orch keys`: the prompts (password, consent to create a key) and a line per host;
the work is onboard/keys.py's."""

from __future__ import annotations

import getpass
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.api.errors import InputError
from orchestrator.api.onboard import (
    ConnectOptions,
    Host,
    complete_aliases,
    hosts_from_words,
    load_inventory,
    no_hosts,
    pick_hosts,
    split_words,
)
from orchestrator.api.onboard import keys as onboard
from orchestrator.cli.app import InventoryOpt, app


class TerminalPasswords:
    """Asks on the terminal, echo off (getpass)."""

    def ask(self, target: str, refused: bool) -> str | None:
        again = "password refused; " if refused else ""
        return getpass.getpass(f"{again}password for {target}: ") or None


class StdinPasswords:
    """The first line of stdin, once: a script's password never shows in an argv."""

    def __init__(self) -> None:
        self._read = False

    def ask(self, target: str, refused: bool) -> str | None:
        if self._read:
            return None
        self._read = True
        return sys.stdin.readline().rstrip("\r\n") or None


class NoPasswords:
    """Neither a terminal nor --password-stdin: nothing to ask with."""

    def ask(self, target: str, refused: bool) -> str | None:
        raise InputError(
            f"{target} refuses the key, and there is no terminal to ask its password on",
            "run orch keys on a terminal, or give the password with --password-stdin",
        )


@app.command("keys")
def keys_command(
    hosts: Annotated[
        list[str] | None,
        typer.Argument(
            help="Hosts: ~/.ssh/config aliases or addresses (NAME=ADDRESS names one); "
            "with -i, names of the inventory's hosts (default: all of them).",
            show_default=False,
            metavar="HOST...",
            autocompletion=complete_aliases,
        ),
    ] = None,
    inventory: InventoryOpt = None,
    hosts_csv: Annotated[
        str | None, typer.Option("--hosts", help="More hosts, comma-separated (as HOSTS).")
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(
            "--user", help="Log in as this user (else the inventory's, ~/.ssh/config's, yours)."
        ),
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            "--key",
            help="The private key whose .pub to install (else each host's identity_file, "
            "else ~/.ssh/id_ed25519, id_ecdsa or id_rsa).",
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Create a missing key without asking.")
    ] = False,
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Read the password from the first line of stdin instead of asking on the "
            "terminal, for scripts: printf '%s\\n' \"$PW\" | orch keys --password-stdin node1. "
            "Never put it in an argument.",
        ),
    ] = False,
) -> None:
    """Install your SSH public key on every host that does not take it yet, then prove
    that key login works.

    Where a host refuses your key, orch asks for the password (on the terminal, not
    echoed), tries it on the next hosts too and asks again only where it is refused.
    Logged in with it, orch adds the key to ~/.ssh/authorized_keys there (created 0600
    in ~/.ssh 0700 if missing; a key already there is not added twice), then logs in
    with the key alone. The password is never shown, logged, written anywhere or handed
    to another program. Host keys are checked as for every orch connection.

    Prints [host] key installed, [host] key already works, or [host] failed: why. Exits
    3 when key login does not work on some host (the others are still done), 2 on bad
    input. Where there is no key yet, orch offers to create ~/.ssh/id_ed25519 (--yes:
    without asking).
    """
    selected = _selected(hosts or [], hosts_csv, inventory, user)
    interactive = sys.stdin.isatty() and not password_stdin
    for path in onboard.missing_keys(selected, key):
        _consent(path, yes, interactive)
        onboard.create_key(path)
        typer.echo(f"created {path} and {onboard.public_path(path)}", err=True)
    keys = {}
    for host in selected:
        if not host.is_local:
            private = onboard.key_of(host, key)
            keys[host.name] = (private, onboard.load_public_key(private))
    passwords: onboard.Passwords = (
        StdinPasswords()
        if password_stdin
        else TerminalPasswords()
        if interactive
        else NoPasswords()
    )
    options = ConnectOptions(notice=lambda message: typer.echo(f"orch: {message}", err=True))
    results = onboard.install_keys(
        selected,
        keys,
        passwords,
        options,
        lambda result: typer.echo(f"[{result.host}] {result.describe()}"),
    )
    onboard.check_results(results)


def _selected(
    words: list[str], csv: str | None, inventory: Path | None, user: str | None
) -> list[Host]:
    """The hosts to work on: the inventory's (-i, else $ORCH_INVENTORY when no host is
    named; only those named, if any), else those named."""
    named = split_words(words, csv)
    if inventory is None and not named and os.environ.get("ORCH_INVENTORY"):
        inventory = Path(os.environ["ORCH_INVENTORY"])
    if inventory is not None:
        hosts = pick_hosts(load_inventory(inventory), named)
    elif named:
        hosts = hosts_from_words(named)
    else:
        raise no_hosts("keys")
    if user:
        hosts = [replace(h, user=user) for h in hosts]
    return list(hosts)


def _consent(path: Path, yes: bool, interactive: bool) -> None:
    """Go ahead with creating a key at `path`, or raise InputError."""
    if yes:
        return
    if not interactive:
        raise InputError(
            f"no SSH key at {path} to install",
            "add --yes to create one (ed25519, no passphrase), or make one: "
            f"ssh-keygen -t ed25519 -f {path}",
        )
    question = f"No SSH key at {path}. Create one (ed25519, no passphrase)?"
    if not typer.confirm(question, default=True, err=True):
        raise InputError(
            "no key to install",
            f"make one: ssh-keygen -t ed25519 -f {path}, or name one: --key PATH",
        )
