"""The host inventory: which machines exist and how to reach them."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from orchestrator.models.errors import HostChoiceError, SpecError
from orchestrator.models.positions import PosDict
from orchestrator.models.schema import (
    Where,
    check_keys,
    get_env,
    get_int,
    get_mapping,
    get_str,
    get_str_list,
    load_yaml,
)
from orchestrator.models.slurm import load_slurm_section

LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "::1"})
DEFAULT_WORKDIR = "~/.orch"
DEFAULT_REMOTE_PYTHON = "python3"
# A node's directory is named after its host, beside a shared snapshot's entries:
# agent/kernel/layout.py's RESERVED_NAMES (models import nothing of orch; a test checks).
RESERVED_NAMES = frozenset({"code", "agent", "snapshot.json", "seal.json", "outputs", ".", ".."})

_HOST_KEYS = {
    "name": "unique name, used in prefixes and --node",
    "address": "IP, DNS name or ~/.ssh/config alias",
    "user": "SSH user",
    "port": "SSH port",
    "identity_file": "SSH private key",
    "python": "interpreter with torch on that host",
    "workdir": "where code, logs and job state live on the host",
    "gpus": "GPU count or list of GPU indices",
    "slots": "processes a job may start here",
    "labels": "labels for job selection",
    "env": "environment for every job on the host",
    "lost_after": "seconds a host may stay silent, confirmed, before its node is lost",
    "shared_fs": "whether the workdir is on a filesystem other hosts share: true, false, "
    "or a group name (default: found out)",
}
_DEFAULT_KEYS = {k: v for k, v in _HOST_KEYS.items() if k not in ("name", "address")}


class BackendSection(Protocol):
    """An inventory's section of a backend other than plain SSH, as that backend's
    model reads it (models/slurm.py's `SlurmSection`)."""

    @property
    def backend(self) -> str:
        """The name of the backend that runs the jobs (a key of backends.BACKENDS)."""
        ...

    def contacts(self, where: Where) -> list[Where]:
        """The hosts orch connects to, each as a host entry of the inventory: a Slurm
        cluster's login node. `where` is the section itself."""
        ...


# A backend's section key -> its reader: (the section, whether `hosts:` is beside it).
BACKEND_SECTIONS: dict[str, Callable[[Where, bool], BackendSection]] = {
    "slurm": load_slurm_section,
}


@dataclass(frozen=True)
class Host:
    """One machine of the inventory, with defaults already merged in."""

    name: str
    address: str
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    python: str = DEFAULT_REMOTE_PYTHON
    workdir: str = DEFAULT_WORKDIR
    gpus: tuple[int, ...] = ()
    slots: int = 1
    labels: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, hash=False)
    # Shares the workdir's filesystem with: None, find out; False, no host; True or a
    # name, the hosts that say the same.
    shared_fs: bool | str | None = None
    # Seconds of confirmed silence before a node here is lost (None: the default).
    lost_after: int | None = None
    # The inventory says how many GPUs or slots the host has: jobs lease them, and
    # wait in line while they are held (ssh/queue.py).
    leases: bool = False

    @property
    def is_local(self) -> bool:
        """Local hosts run without SSH, straight on this machine."""
        return self.address in LOCAL_ADDRESSES


@dataclass(frozen=True)
class Inventory:
    """The hosts a job may run on, in file order."""

    path: str
    hosts: tuple[Host, ...]
    # The section of a backend other than plain SSH (`slurm:`), as that backend's model
    # reads it: its `backend` names the one that runs the jobs (backends.for_inventory),
    # and `hosts` is then what orch connects to (a Slurm cluster's login node alone).
    backend: BackendSection | None = None

    @property
    def backend_name(self) -> str:
        """The backend that runs this inventory's jobs: its section's, else "ssh"."""
        return self.backend.backend if self.backend is not None else "ssh"

    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def by_name(self, name: str) -> Host | None:
        return next((h for h in self.hosts if h.name == name), None)


def builtin_local_inventory(local_python: str | None = None) -> Inventory:
    """The inventory used when none is given: this machine, one slot, no SSH."""
    host = Host(name="localhost", address="localhost", python=local_python or sys.executable)
    return Inventory(path="<built-in localhost inventory>", hosts=(host,))


def load_inventory(path: Path, local_python: str | None = None) -> Inventory:
    """Load and validate an inventory file.

    Args:
        path: the YAML file.
        local_python: interpreter for local hosts that name none (default: this one).

    Returns:
        The inventory, with `defaults:` merged into every host.

    Raises:
        SpecError: the file is missing, malformed, or breaks the schema.
    """
    shown = str(path)
    top = Where(shown, load_yaml(path, "inventory"))
    named = [key for key in BACKEND_SECTIONS if key in top.mapping]
    known = dict.fromkeys(["defaults", "hosts", *BACKEND_SECTIONS])
    check_keys(top, known, () if named else ("hosts",))
    defaults = get_mapping(top, "defaults") or PosDict()
    dwhere = top.child(defaults, "defaults.")
    check_keys(dwhere, _DEFAULT_KEYS)
    if named:  # a backend's own section: it says which hosts orch connects to
        key = named[0]
        swhere = top.child(get_mapping(top, key) or PosDict(), f"{key}.")
        section = BACKEND_SECTIONS[key](swhere, "hosts" in top.mapping)
        contact = [
            _load_host(w, dwhere, local_python or sys.executable) for w in section.contacts(swhere)
        ]
        return Inventory(shown, tuple(contact), section)
    raw_hosts = top.mapping["hosts"]
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise top.error(
            "hosts",
            "expected a non-empty list of hosts",
            "add entries like '- {name: node1, address: 10.0.0.1}'",
        )
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_hosts):
        if not isinstance(raw, PosDict):
            raise top.error("hosts", f"host #{index + 1} must be a mapping with name and address")
        hwhere = top.child(raw, f"hosts[{index}].")
        check_keys(hwhere, _HOST_KEYS, required=("name", "address"))
        host = _load_host(hwhere, dwhere, local_python or sys.executable)
        if host.name in seen:
            line = raw.positions.get("name", raw.start)[0]
            raise SpecError(
                shown,
                f"duplicate host name '{host.name}' (first defined on line {seen[host.name]})",
                "give every host a unique name",
                line,
            )
        seen[host.name] = raw.positions.get("name", raw.start)[0]
        hosts.append(host)
    return Inventory(path=shown, hosts=tuple(hosts))


def _pick(host: Where, defaults: Where, key: str) -> Where:
    """The mapping a key's value comes from: the host's own, else the defaults."""
    return host if key in host.mapping else defaults


def _load_host(where: Where, defaults: Where, local_python: str) -> Host:
    name = get_str(where, "name")
    address = get_str(where, "address")
    assert name is not None and address is not None  # required keys, checked above
    if not name or any(c.isspace() or c in "[]/" for c in name):
        raise where.error(
            "name", f"invalid host name {name!r}", "use letters, digits, '-', '_' and '.'"
        )
    if name in RESERVED_NAMES:
        raise where.error(
            "name",
            f"host name {name!r} is reserved: it names a file in orch's job directories",
            "give the host another name",
        )
    if not address:
        raise where.error("address", "empty address")
    is_local = address in LOCAL_ADDRESSES
    python = get_str(_pick(where, defaults, "python"), "python")
    workdir = get_str(_pick(where, defaults, "workdir"), "workdir") or DEFAULT_WORKDIR
    gpus = _load_gpus(_pick(where, defaults, "gpus"))
    slots = get_int(_pick(where, defaults, "slots"), "slots", minimum=1)
    labels = get_str_list(_pick(where, defaults, "labels"), "labels")
    env = {**get_env(defaults, "env"), **get_env(where, "env")}
    return Host(
        name=name,
        address=address,
        user=get_str(_pick(where, defaults, "user"), "user"),
        port=get_int(_pick(where, defaults, "port"), "port", minimum=1),
        identity_file=get_str(_pick(where, defaults, "identity_file"), "identity_file"),
        python=python or (local_python if is_local else DEFAULT_REMOTE_PYTHON),
        workdir=workdir,
        gpus=gpus,
        slots=slots if slots is not None else (len(gpus) or 1),
        labels=labels,
        env=env,
        shared_fs=_load_shared_fs(_pick(where, defaults, "shared_fs")),
        lost_after=get_int(_pick(where, defaults, "lost_after"), "lost_after", minimum=3),
        leases=any(k in w.mapping for w in (where, defaults) for k in ("gpus", "slots")),
    )


def _load_shared_fs(where: Where) -> bool | str | None:
    value = where.mapping.get("shared_fs")
    if value is None or isinstance(value, bool) or (isinstance(value, str) and value):
        return value
    raise where.error(
        "shared_fs",
        f"expected true, false or a group name, got {value!r}",
        "leave it out to let orch find out which hosts share a filesystem",
    )


def _load_gpus(where: Where) -> tuple[int, ...]:
    value = where.mapping.get("gpus")
    if value is None:
        return ()
    if isinstance(value, bool):
        raise where.error("gpus", "expected a GPU count or a list of GPU indices")
    if isinstance(value, int):
        if value < 0:
            raise where.error("gpus", f"must be at least 0, got {value}")
        return tuple(range(value))
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        if len(set(value)) != len(value):
            raise where.error("gpus", "GPU indices must be unique")
        return tuple(value)
    raise where.error("gpus", f"expected a GPU count or a list of GPU indices, got {value!r}")


def resolve_inventory(cli_path: Path | None, job_inventory: Path | None) -> Inventory:
    """-i PATH, else $ORCH_INVENTORY, else the job's `inventory:`, else built-in localhost."""
    if cli_path is not None:
        return load_inventory(cli_path)
    env_path = os.environ.get("ORCH_INVENTORY")
    if env_path:
        return load_inventory(Path(env_path))
    if job_inventory is not None:
        return load_inventory(job_inventory)
    return builtin_local_inventory()


def pick_hosts(
    inventory: Inventory,
    names: Sequence[str] = (),
    labels: Sequence[str] = (),
    count: int | None = None,
) -> list[Host]:
    """The hosts named (in that order, each once), else all; those with every label;
    the first `count` of them (all when None). The one rule of `hosts:`, `labels:` and
    `nodes:` in a job, and of `--hosts` and `--labels` on the command line.

    Raises:
        HostChoiceError: an unknown host name, no host with the labels, or fewer hosts
            than `count`.
    """
    unknown = [n for n in names if inventory.by_name(n) is None]
    if unknown:
        raise HostChoiceError(
            "hosts",
            f"host '{unknown[0]}' is not in inventory {inventory.path}",
            "known hosts: " + ", ".join(inventory.names()),
        )
    hosts = [inventory.by_name(n) for n in dict.fromkeys(names)] if names else inventory.hosts
    candidates = [h for h in hosts if h is not None and set(labels) <= set(h.labels)]
    if labels and not candidates:
        raise HostChoiceError(
            "labels",
            f"no host in {inventory.path} has labels {list(labels)}",
            "fix the labels, or add them to hosts in the inventory (orch check lists them)",
        )
    wanted = count if count is not None else len(candidates)
    if wanted > len(candidates):
        with_labels = f" with labels {list(labels)}" if labels else ""
        raise HostChoiceError(
            "nodes",
            f"nodes={wanted} but inventory has {len(candidates)} hosts{with_labels}",
            f"lower nodes, or add hosts to {inventory.path}",
        )
    return candidates[:wanted]
