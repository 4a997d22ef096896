"""Hosts named on the command line, before any inventory exists: `node1` (an alias of
`~/.ssh/config`, or any address) or `name=address`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from orchestrator.models.errors import InputError
from orchestrator.models.inventory import RESERVED_NAMES, Host

SSH_CONFIG = "~/.ssh/config"


def split_words(words: Sequence[str], csv: str | None) -> list[str]:
    """The positional words and the comma-separated `--hosts` value, in that order."""
    return [*words, *(part.strip() for part in (csv or "").split(",") if part.strip())]


def hosts_from_words(words: Sequence[str], user: str | None = None) -> list[Host]:
    """A Host per word: `alias` (name and address both) or `name=address`.

    The address is kept as written, so that `~/.ssh/config` (HostName, User, Port,
    IdentityFile, ProxyJump) applies to an alias when orch connects.

    Raises:
        InputError: a word is empty, names a host twice, or gives an unusable name.
    """
    hosts: list[Host] = []
    for word in words:
        name, sep, address = word.partition("=")
        name, address = name.strip(), (address if sep else name).strip()
        if not name or not address:
            raise InputError(
                f"host {word!r}: expected ALIAS or NAME=ADDRESS",
                "e.g. orch init node1 node2, or --hosts gpu1=10.0.0.5,gpu2=10.0.0.6",
            )
        if any(c.isspace() or c in "[]/" for c in name) or name in RESERVED_NAMES:
            raise InputError(
                f"host {word!r}: {name!r} cannot name a host",
                "use letters, digits, '-', '_' and '.', or give a name: NAME=ADDRESS",
            )
        if any(h.name == name for h in hosts):
            raise InputError(f"host {name!r} is named twice", "name every host once")
        hosts.append(Host(name=name, address=address, user=user))
    return hosts


def no_hosts_error(verb: str, aliases: Sequence[str]) -> InputError:
    """What `orch keys` or `orch init` says when it was given no host at all."""
    known = f" (in {SSH_CONFIG}: {', '.join(aliases[:12])})" if aliases else ""
    return InputError(
        f"no hosts given{known}",
        f"name them: orch {verb} node1 node2, or --hosts 10.0.0.5,10.0.0.6"
        + (", or -i INVENTORY" if verb == "keys" else ""),
    )


def ssh_config_path() -> Path:
    return Path(SSH_CONFIG).expanduser()


def complete_aliases(incomplete: str) -> list[str]:
    """The `~/.ssh/config` aliases that start with `incomplete`, for shell completion."""
    from orchestrator.transport.ssh import ssh_config_aliases

    return [a for a in ssh_config_aliases(ssh_config_path()) if a.startswith(incomplete)]
