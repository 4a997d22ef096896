"""The inventory `orch init` writes: YAML that models/inventory.py loads, with a
comment on every host saying what the probe found, and the hosts that could not be
probed kept as comments with the reason, ready to uncomment. Pure: text in, text out."""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from orchestrator.models.facts import HostFacts
from orchestrator.onboard.init import Probed

COMMENT_COLUMN = 32


def scalar(value: str | int) -> str:
    """`value` as a YAML scalar: plain where that reads back the same, else quoted."""
    text: str = yaml.safe_dump(value, default_flow_style=True, width=1 << 16)
    return text.removesuffix("\n...\n").removesuffix("\n")


def _entry(indent: str, key: str, value: str | int, comment: str = "") -> str:
    line = f"{indent}{key}: {scalar(value)}"
    if comment:
        line = f"{line.ljust(COMMENT_COLUMN - 2)}  # {_one_line(comment)}"
    return line


def _aside(setting: str, comment: str) -> str:
    """A default left commented out, for the user to set: `  # user: alice  # ...`."""
    return f"{f'  # {setting}'.ljust(COMMENT_COLUMN - 2)}  # {comment}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def describe(facts: HostFacts, cpus: int | None) -> str:
    """`Debian 12, 64 CPUs, 8 GPUs (NVIDIA A100), torch 2.13.0 (CUDA 12.4), Python 3.11.2`."""
    parts = [facts.os] if facts.os else []
    if cpus:
        parts.append(f"{cpus} CPU{'s' if cpus != 1 else ''}")
    if facts.gpu_count:
        names = ", ".join(dict.fromkeys(facts.gpu_names))
        parts.append(
            f"{facts.gpu_count} GPU{'s' if facts.gpu_count != 1 else ''}"
            + (f" ({names})" if names else "")
        )
    else:
        parts.append("no GPU found")
    if facts.torch_version:
        build = f" (CUDA {facts.torch_cuda})" if facts.torch_cuda else ""
        parts.append(f"torch {facts.torch_version}{build}")
    if facts.python_version:
        parts.append(f"Python {facts.python_version}")
    return ", ".join(parts)


def shared_python(probed: Sequence[Probed]) -> str | None:
    """The python every reachable host has torch in, when it is one path for all."""
    found = [p.found for p in probed if p.found is not None]
    pythons = {f.torch_python for f in found}
    if found and len(pythons) == 1:
        return next(iter(pythons))
    return None


def render_inventory(
    probed: Sequence[Probed], source: str, path: str, user: str | None = None
) -> str:
    """The inventory file for the probed hosts.

    Args:
        source: how the hosts were named, for the header (`orch init node1 node2`).
        path: where the file goes, for the `orch check -i` line.
        user: the login for every host (`defaults: user:`), None: ssh_config's.
    """
    common = shared_python(probed)
    lines = [
        f"# orch inventory, written by: {_one_line(source)}",
        "# A host's address is what SSH connects to: an alias of ~/.ssh/config (its User,",
        "# Port, IdentityFile and ProxyJump apply) or a name or IP. Every key: docs/INVENTORY.md.",
        f"# Next: orch check -i {path}",
        "defaults:",
    ]
    if user:
        lines.append(_entry("  ", "user", user))
    else:
        lines.append(_aside("user: alice", "else ~/.ssh/config's User, else your login"))
    if common:
        lines.append(_entry("  ", "python", common, "the python with torch on every host"))
    lines.append(_aside("workdir: ~/.orch", "where code, logs and job state live on hosts"))
    lines.append("hosts:")
    for item in probed:
        lines.extend(_host_lines(item, common))
    return "\n".join(lines) + "\n"


def _host_lines(item: Probed, common: str | None) -> list[str]:
    host, found = item.host, item.found
    if found is None:
        reason = item.error.what if item.error is not None else "no answer"
        return [
            f"  # {host.name}: not probed, so left out: {_one_line(reason)}",
            f"  # - name: {scalar(host.name)}",
            f"  #   address: {scalar(host.address)}",
        ]
    facts = found.facts
    lines = [
        f"  # {host.name}: {describe(facts, found.cpus)}",
        _entry("  - ", "name", host.name),
        _entry("    ", "address", host.address),
    ]
    if found.torch_python is None:
        python = facts.python_executable or "python3"
        looked = ", ".join(found.candidates)
        lines.append(
            _entry(
                "    ",
                "python",
                python,
                f"NO TORCH in any python found ({looked}): list torch in the job's "
                "environment: (docs/ENVIRONMENTS.md), install it, or point python: at one "
                "that has it",
            )
        )
    elif found.torch_python != common:
        lines.append(_entry("    ", "python", found.torch_python, "the python with torch here"))
    if facts.gpu_count:
        lines.append(
            _entry("    ", "gpus", facts.gpu_count, "slots (processes here) default to gpus")
        )
    else:
        cpus = f"{found.cpus} CPUs" if found.cpus else "its CPUs"
        lines.append(_entry("    ", "slots", 1, f"processes a job may start here; no GPU; {cpus}"))
    return lines
