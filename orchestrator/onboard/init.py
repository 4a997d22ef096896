"""`orch init`: what each named host has (CPUs, GPUs, the python with torch), found
by the project's own probe over the usual SSH connection, for render.py to write.

A host's python with torch is found by looking where people keep one: PATH's
`python3`, venvs and conda or pyenv installs in the home directory and /opt, and the
path of the interpreter running orch here (clusters often share one venv over NFS).
One shell command lists those that exist; then the agent's probe (which reads torch's
version without importing it) runs with each in turn until one has torch.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.models.errors import HostError, InputError, OrchError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host
from orchestrator.nodes.group import HostGroup
from orchestrator.nodes.probe import probe_host
from orchestrator.transport.base import ConnectOptions, Transport

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 15.0
# Where a python with torch is looked for, in order, after --python. Globs are the
# shell's; `~` is the remote home.
PLACES = (
    "python3",
    "python",
    "~/.venv/bin/python",
    "~/venv/bin/python",
    "~/env/bin/python",
    "~/miniforge3/bin/python",
    "~/mambaforge/bin/python",
    "~/miniconda3/bin/python",
    "~/anaconda3/bin/python",
    "/opt/conda/bin/python",
    "~/miniforge3/envs/*/bin/python",
    "~/mambaforge/envs/*/bin/python",
    "~/miniconda3/envs/*/bin/python",
    "~/anaconda3/envs/*/bin/python",
    "~/.conda/envs/*/bin/python",
    "/opt/conda/envs/*/bin/python",
    "~/.pyenv/versions/*/bin/python",
    "~/*/.venv/bin/python",
)
MAX_CANDIDATES = 12  # each costs a probe (~0.1 s); the ones with torch come early


@dataclass(frozen=True)
class Found:
    """What a probe found on one reachable host."""

    cpus: int | None
    facts: HostFacts
    candidates: tuple[str, ...]  # the interpreters looked at, in order
    torch_python: str | None  # the first with torch (its sys.executable), None: none


@dataclass(frozen=True)
class Probed:
    """One host named to `orch init`: what was found, or why it could not be."""

    host: Host
    found: Found | None = None
    error: OrchError | None = None


def places(first: str | None, controller_python: str | None) -> list[str]:
    """Where to look for a python with torch, in order, each once."""
    ordered = [*([first] if first else []), *PLACES]
    if controller_python and os.path.isabs(controller_python):
        ordered.append(controller_python)
    return list(dict.fromkeys(ordered))


def list_command(where: Sequence[str]) -> str:
    """A /bin/sh command that prints the CPU count, then each interpreter of `where`
    that exists and is executable, one per line (globs expanded, `~` the home)."""
    words = []
    for place in where:
        if place.startswith("~/"):
            words.append('"$HOME"/' + _glob_quoted(place[2:]))
        elif "/" in place:
            words.append(_glob_quoted(place))
        else:
            words.append(f'"$(command -v {shlex.quote(place)} 2>/dev/null)"')
    script = (
        "nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 0\n"
        f'for p in {" ".join(words)}; do [ -n "$p" ] && [ -f "$p" ] && [ -x "$p" ] && echo "$p"; done; :'
    )
    return f"/bin/sh -c {shlex.quote(script)}"


def _glob_quoted(path: str) -> str:
    """`path` for sh: each `*` a glob, everything else quoted."""
    return "*".join(shlex.quote(part) if part else "" for part in path.split("*"))


def parse_listing(stdout: str) -> tuple[int | None, list[str]]:
    """The CPU count and the interpreters, as list_command prints them."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None, []
    cpus = int(lines[0]) if lines[0].isdigit() and int(lines[0]) > 0 else None
    return cpus, list(dict.fromkeys(lines[1:]))[:MAX_CANDIDATES]


def find(host: Host, transport: Transport, where: Sequence[str]) -> Found:
    """The host's CPUs, GPUs and python with torch.

    Raises:
        HostError: no python could be probed there at all.
    """
    listed = transport.run(list_command(where), timeout=LIST_TIMEOUT_S)
    cpus, candidates = parse_listing(listed.stdout)
    facts: HostFacts | None = None
    problems: list[str] = []
    for python in candidates:
        try:
            # nvidia-smi (a second on a big box) only until one probe has answered.
            probed = probe_host(replace(host, python=python), transport, gpus=facts is None)
        except OrchError as exc:
            problems.append(f"{python}: {exc.what.splitlines()[0]}")
            continue
        if facts is None or probed.facts.torch_version:
            gpus = facts if facts is not None else probed.facts
            facts = replace(
                probed.facts,
                gpu_count=gpus.gpu_count,
                gpu_names=gpus.gpu_names,
                gpu_error=gpus.gpu_error,
            )
        if probed.facts.torch_version:
            torch_python = probed.facts.python_executable or python
            return Found(cpus, facts, tuple(candidates), torch_python)
    if facts is None:
        detail = "; ".join(problems) or "none of " + ", ".join(where[:4]) + " ... exists"
        raise HostError(
            host.name,
            f"no python found to probe ({detail})",
            f"install python3 there, or name one: orch init --python PATH {host.name}",
        )
    return Found(cpus, facts, tuple(candidates), None)


def probe_all(
    hosts: Sequence[Host],
    options: ConnectOptions,
    python: str | None = None,
    controller_python: str | None = sys.executable,
) -> list[Probed]:
    """Probe every host at once over its usual SSH connection; one result per host,
    in order, hosts that could not be reached or probed carrying their error."""
    where = places(python, controller_python)
    with HostGroup(hosts, options) as group:
        failures = {e.host or "": e for e in group.connect(tolerate=True)}
        found, errors = group.try_each(lambda host, t: find(host, t, where))
    failures.update({e.host or "": e for e in errors})
    results = []
    for host in hosts:
        probed = Probed(host, found.get(host.name), failures.get(host.name))
        if probed.found is None and probed.error is None:  # never a silent gap
            probed = replace(probed, error=HostError(host.name, "no answer from the probe"))
        results.append(probed)
    return results


def write_new(path: Path, text: str, force: bool) -> None:
    """Write `text` at `path`, owner-only; an existing file only with `force`.

    Raises:
        InputError: the file exists (without `force`) or cannot be written.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if force:
            part = path.with_name(f".{path.name}.{os.getpid()}.part")
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(part, path)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
    except FileExistsError:
        raise InputError(
            f"{path} exists already",
            "write elsewhere (-o FILE), or replace it: --force",
        ) from None
    except OSError as exc:
        raise InputError(
            f"cannot write {path}: {exc.strerror or exc}", "pick another -o FILE"
        ) from None
