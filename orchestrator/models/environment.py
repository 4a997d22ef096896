"""A job's `environment:` (docs/ENVIRONMENTS.md): the packages each host's virtual
environment holds on top of the host's `python:`, read and checked at load (pure).

`environment:` is a requirements file in the workdir (`requirements.txt`) or an
inline list (`[numpy==2.3.1, tqdm]`); `wheels:` a directory of wheels inside the
workdir, which travels to the hosts with the code (by hash, once) and from which the
hosts install with no index.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.models.errors import SpecError

# One requirement as pip reads it (PEP 508, the common forms): a name, extras, version
# specifiers, a marker after `;`, or `name @ URL`. Options (`-r`, `-e`, `--index-url`)
# are refused: where packages come from is orch's to say (`wheels:`).
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION = r"(?:===|==|!=|<=|>=|~=|<|>)\s*[A-Za-z0-9.*+!_-]+"
_REQUIREMENT_RE = re.compile(
    rf"^(?P<name>{_NAME})\s*(?:\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?\s*"
    rf"(?:(?:\(\s*)?{_VERSION}(?:\s*,\s*{_VERSION})*(?:\s*\))?|@\s*\S+)?\s*(?:;.*)?$"
)


@dataclass(frozen=True)
class Environment:
    """A job's environment as the hosts build it.

    Attributes:
        requirements: one requirement per item, comments and blank lines gone.
        source: where they were read, for messages (`requirements.txt` or `job.yaml`).
        wheels: the wheel directory's path inside the workdir (posix), or None.
    """

    requirements: tuple[str, ...]
    source: str
    wheels: str | None = None

    def names(self) -> tuple[str, ...]:
        """The requirements' package names, as written."""
        out = []
        for line in self.requirements:
            found = _REQUIREMENT_RE.match(line)
            out.append(found.group("name") if found else line)
        return tuple(out)


def parse_requirement(text: str) -> str | None:
    """One line of a requirements file without its comment, or None for none; a line
    that is not a requirement raises ValueError with the reason."""
    line = re.split(r"(?:^|\s)#", text, maxsplit=1)[0].strip()
    if not line:
        return None
    if line.startswith("-"):
        raise ValueError(f"pip option {line.split()[0]!r} is not taken in an environment")
    if not _REQUIREMENT_RE.match(line):
        raise ValueError(f"not a requirement: {line!r}")
    return line


def read_requirements(path: Path, shown: str) -> tuple[str, ...]:
    """The requirements of a requirements file.

    Raises:
        SpecError: a line that is not a requirement, at its line number.
    """
    out = []
    for number, text in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        try:
            found = parse_requirement(text)
        except ValueError as exc:
            raise SpecError(
                shown,
                str(exc),
                "write one requirement per line, as pip reads them (numpy==2.3.1, "
                "tqdm>=4); wheels come from `wheels:` (docs/ENVIRONMENTS.md)",
                number,
                1,
            ) from None
        if found is not None:
            out.append(found)
    return tuple(out)


def environment_digest(env: Environment, wheel_hashes: dict[str, str]) -> str:
    """The controller's half of an environment's name: its requirements in order and
    the wheels it may install from (name -> sha256). Each host adds its interpreter and
    platform (agent/host/envs.py `env_key`), so a changed requirement, wheel, Python or
    machine is another environment, and the same ones are the same everywhere."""
    what = [list(env.requirements), sorted(wheel_hashes.items())]
    return hashlib.sha256(json.dumps(what, separators=(",", ":")).encode()).hexdigest()
