"""The tools orch carries to hosts, as it carries the agent: py-spy, which reads a
rank's Python stack without its help (`orch stack`).

Where the controller gets a host's py-spy, per host platform (`uname -m` of a Linux
host), first found first:

1. `$ORCH_HOME/tools/py-spy-linux-<machine>`: one the user put there, for hosts of
   another platform than this controller's (docs/STACKS.md says how to get one);
2. the `py-spy` that orch's own install brought (the `py-spy` wheel, a dependency of
   orch, beside this Python), where this controller runs Linux: it serves hosts of
   this controller's machine.

A host keeps each binary under its hash in `WORKDIR/tools` (host/tools.py) and is sent
it only when it lacks that hash. A host of a platform with no binary here reads its
ranks through faulthandler where they arranged it (agent/node/traceable.py), else
says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from orchestrator.agent.kernel.layout import PYSPY, tools_dir
from orchestrator.models.errors import HostError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.records.home import orch_home, private_dir
from orchestrator.transport import Transport

TOOLS = "tools"
PUT_TIMEOUT_S = 120.0  # 8 MB over a slow uplink


@dataclass(frozen=True)
class Tool:
    """A binary for hosts of one machine (`uname -m`)."""

    name: str
    machine: str
    path: Path
    sha256: str


_lock = threading.Lock()
_hashes: dict[tuple[Path, int, int], str] = {}
HASHES = "hashes.json"  # in $ORCH_HOME/tools: each binary's hash, by path, size and mtime


def _sha256(path: Path, home: Path | None = None) -> str:
    """A binary's sha256, kept in $ORCH_HOME/tools/hashes.json while its size and
    mtime stay: hashing py-spy's 8 MB costs every `orch stack` 25 ms of CPU."""
    info = path.stat()
    key = (path, info.st_size, int(info.st_mtime_ns))
    with _lock:
        if key in _hashes:
            return _hashes[key]
        cache = (home or orch_home()) / TOOLS / HASHES
        said = f"{path} {info.st_size} {info.st_mtime_ns}"
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError):
            known = {}
        found = known.get(said) if isinstance(known, dict) else None
        if not isinstance(found, str):
            found = hashlib.sha256(path.read_bytes()).hexdigest()
            with contextlib.suppress(OSError):
                private_dir(cache.parent)
                cache.write_text(
                    json.dumps({said: found, **(known if isinstance(known, dict) else {})})
                )
        _hashes[key] = found
        return found


def own_pyspy() -> Path | None:
    """The py-spy orch's install brought, where this controller runs Linux."""
    if not sys.platform.startswith("linux"):
        return None
    beside = Path(sys.executable).parent / PYSPY
    return beside if beside.is_file() else None


def pyspy_tools(home: Path | None = None) -> dict[str, Tool]:
    """machine -> the py-spy this controller carries to hosts of that machine."""
    found: dict[str, Tool] = {}
    own = own_pyspy()
    if own is not None:
        machine = platform.machine()
        found[machine] = Tool(PYSPY, machine, own, _sha256(own, home))
    folder = (home or orch_home()) / TOOLS
    prefix = f"{PYSPY}-linux-"
    for path in sorted(folder.glob(f"{prefix}*")) if folder.is_dir() else []:
        if path.is_file() and path.name != HASHES:
            machine = path.name[len(prefix) :]
            found[machine] = Tool(PYSPY, machine, path, _sha256(path, home))
    return found


def put(host: Host, transport: Transport, tool: Tool) -> None:
    """Send `tool` to the host, kept under its hash in the host's tools directory.

    Raises:
        HostError: the host would not keep it.
    """
    data = tool.path.read_bytes()
    reply = agent.run(
        host,
        transport,
        ["tool-put", tools_dir(host.workdir), tool.name, tool.sha256],
        stdin=[data],
        timeout=PUT_TIMEOUT_S,
    )
    if "kept" not in reply:
        raise HostError(
            host.name,
            f"could not keep {tool.name} there: {reply.get('error')}",
            f"make {tools_dir(host.workdir)} yours alone (chmod 700)",
        )
