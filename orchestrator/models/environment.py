"""A job's `environment:` (docs/ENVIRONMENTS.md): the packages each host's virtual
environment holds on top of the host's `python:`, read and checked at load (pure).

`environment:` is a requirements file in the workdir (`requirements.txt`), a
`pyproject.toml` (its dependencies, pinned by a `uv.lock` beside it) or an inline list
(`[numpy==2.3.1, tqdm]`); `wheels:` a directory of wheels (in the workdir or outside
it), or `download` (the controller downloads them for the hosts' platform and Python),
which travel to the hosts with the code (by hash, once) and from which the hosts
install with no index.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.models.errors import SpecError

# `wheels: download`: the controller downloads the wheels (sync/wheels.py).
DOWNLOAD = "download"
# Where wheels that are not in the workdir (downloaded, or a directory outside it) go
# in the job's code on every host: pushed with the code, under this directory.
CARRIED_WHEELS = ".orch-wheels"

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
        wheels: where the hosts find the wheels in the job's code (posix): a
            directory of the workdir, or CARRIED_WHEELS; None installs from an index.
        wheels_dir: a directory outside the workdir whose wheels are carried (to
            CARRIED_WHEELS), as the controller names it; None where there is none.
        download: the controller downloads the wheels for the hosts' platform and
            Python (to CARRIED_WHEELS).
    """

    requirements: tuple[str, ...]
    source: str
    wheels: str | None = None
    wheels_dir: str | None = None
    download: bool = False

    @property
    def wheels_said(self) -> str | None:
        """Where the wheels come from, as the user said it (for messages)."""
        if self.download:
            return DOWNLOAD
        return self.wheels_dir or self.wheels

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


def read_pyproject(path: Path, shown: str) -> tuple[str, ...]:
    """The requirements of a `pyproject.toml`: its `[project] dependencies`, each pinned
    to the version its `uv.lock` beside it resolved, where it has one (the lock's other
    packages are left to the installer: uv.lock keeps their platform markers on the
    edges between packages, and a flat list would ask a Linux host for Windows-only
    ones).

    Raises:
        SpecError: not TOML, no `[project] dependencies` list, or a dependency that is
            not a requirement.
    """
    import tomllib

    hint = "give [project] dependencies as pip reads them (docs/ENVIRONMENTS.md)"
    try:
        data = tomllib.loads(path.read_text(errors="replace"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(shown, f"not TOML: {exc}", hint) from None
    deps = data.get("project", {}).get("dependencies")
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise SpecError(shown, "no [project] dependencies list", hint)
    pinned = _uv_lock_versions(path.parent / "uv.lock")
    out = []
    for dep in deps:
        try:
            found = parse_requirement(dep)
        except ValueError as exc:
            raise SpecError(shown, f"dependencies: {exc}", hint) from None
        if found is None:
            continue
        match = _REQUIREMENT_RE.match(found)
        name = match.group("name") if match else found
        version = pinned.get(_normalized(name))
        if version is not None and not re.search(r"[<>=!~@]", found.split(";")[0]):
            marker = found.partition(";")[2]
            found = f"{found.split(';')[0].strip()}=={version}" + (f" ;{marker}" if marker else "")
        out.append(found)
    return tuple(out)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _uv_lock_versions(path: Path) -> dict[str, str]:
    """Package name (normalized) -> version, from a uv.lock; empty where there is none."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    found = {}
    for package in data.get("package", []):
        if isinstance(package, dict) and "name" in package and "version" in package:
            found[_normalized(str(package["name"]))] = str(package["version"])
    return found


def environment_digest(env: Environment, wheel_hashes: dict[str, str]) -> str:
    """The controller's half of an environment's name: its requirements in order and
    the wheels it may install from (name -> sha256). Each host adds its interpreter and
    platform (agent/host/envs.py `env_key`), so a changed requirement, wheel, Python or
    machine is another environment, and the same ones are the same everywhere."""
    what = [list(env.requirements), sorted(wheel_hashes.items())]
    return hashlib.sha256(json.dumps(what, separators=(",", ":")).encode()).hexdigest()


# The oldest glibc each legacy manylinux name stands for (PEP 600's aliases), and the
# machines it was defined for.
_LEGACY_MANYLINUX = (
    (17, "manylinux2014", ("x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le", "s390x")),
    (12, "manylinux2010", ("x86_64", "i686")),
    (5, "manylinux1", ("x86_64", "i686")),
)


@dataclass(frozen=True)
class WheelTarget:
    """What a host's python installs: the tags pip on that host would accept, as
    `pip download --python-version --implementation --abi --platform` takes them.

    Attributes:
        implementation: the interpreter's tag (`cp`, `pp`).
        python_version: major.minor (`3.11`).
        abi: its ABI tag (`cp311`, `cp313t`); abi3 and none are accepted with it.
        platform: sysconfig's platform as a tag (`linux_x86_64`).
        glibc: the C library's version (`2.36`), None where it is not glibc.
    """

    implementation: str
    python_version: str
    abi: str
    platform: str
    glibc: str | None = None

    def platforms(self) -> tuple[str, ...]:
        """Every platform tag a wheel for this host may carry, most specific first, as
        packaging.tags orders them: the bare platform, then manylinux_2_N from the
        host's glibc down to the oldest one defined for its machine (PEP 600), the
        legacy names among them."""
        found: list[str] = [self.platform]
        arch = self.platform.removeprefix("linux_")
        if self.platform.startswith("linux_") and self.glibc:
            major, _, minor = self.glibc.partition(".")
            if major == "2" and minor.isdigit():
                oldest = 5 if arch in ("x86_64", "i686") else 17
                for n in range(int(minor), oldest - 1, -1):
                    found.append(f"manylinux_2_{n}_{arch}")
                    for glibc, name, machines in _LEGACY_MANYLINUX:
                        if n == glibc and arch in machines:
                            found.append(f"{name}_{arch}")
        return tuple(found)

    def describe(self) -> str:
        """`python 3.11 (cp311) on linux_x86_64, glibc 2.36`, for messages."""
        libc = f", glibc {self.glibc}" if self.glibc else ""
        return f"python {self.python_version} ({self.abi}) on {self.platform}{libc}"


# The settings of where packages come from that a job's `env:` (or its host's) may
# hold: the installer on the host gets them, as `orch check` asks that index.
INSTALLER_SETTINGS = (
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_TRUSTED_HOST",
    "PIP_FIND_LINKS",
    "UV_INDEX_URL",
    "UV_EXTRA_INDEX_URL",
    "UV_DEFAULT_INDEX",
    "UV_INDEX",
)


def installer_env(env: Mapping[str, str]) -> dict[str, str]:
    """The installer settings of the env a job's node gets on a host."""
    return {k: v for k, v in env.items() if k in INSTALLER_SETTINGS}
