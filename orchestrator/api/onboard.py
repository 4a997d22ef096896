"""orch from Python, first contact with a set of machines: `orch keys` installs the
user's SSH key on each host (`keys`), `orch init` writes an inventory from what a
probe finds there (`probe_all`, `render_inventory`, `write_new`). Hosts come from
words on the command line (`hosts_from_words`) or from an inventory (`load_inventory`,
`pick_hosts`); `ConnectOptions` says how to connect and where notices go."""

from orchestrator.models.errors import InputError
from orchestrator.models.inventory import Host, load_inventory, pick_hosts
from orchestrator.onboard import keys
from orchestrator.onboard.init import Probed, probe_all, write_new
from orchestrator.onboard.render import describe, render_inventory
from orchestrator.onboard.targets import (
    complete_aliases,
    hosts_from_words,
    no_hosts_error,
    split_words,
    ssh_config_path,
)
from orchestrator.transport.base import ConnectOptions

__all__ = [
    "ConnectOptions",
    "Host",
    "Probed",
    "complete_aliases",
    "describe",
    "hosts_from_words",
    "keys",
    "load_inventory",
    "no_hosts",
    "pick_hosts",
    "probe_all",
    "render_inventory",
    "split_words",
    "ssh_config_path",
    "write_new",
]


def no_hosts(verb: str) -> InputError:
    """What `orch keys` or `orch init` says when it was given no host at all: it names
    the aliases of ~/.ssh/config."""
    from orchestrator.transport.ssh import ssh_config_aliases  # paramiko: only for this

    return no_hosts_error(verb, ssh_config_aliases(ssh_config_path()))
