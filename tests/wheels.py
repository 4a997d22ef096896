"""A wheel of a one-module package, built here with this python's pip and no index:
what the environment tests and bench/env.py install offline (`wheels:`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def tiny_wheel(
    work: Path,
    out: Path,
    name: str,
    version: str,
    dependencies: Sequence[str] = (),
    payload_bytes: int = 0,
) -> Path:
    """Build `name==version` (its module says `VERSION = version`) into `out`, from a
    source tree made under `work`; returns `out`.

    Args:
        dependencies: its `[project] dependencies`, which an installer resolves.
        payload_bytes: a file of that many random bytes in the package (a wheel that
            takes room, and time, to install).
    """
    src = work / f"src-{name}-{version}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"VERSION = {version!r}\n")
    if payload_bytes:
        import os

        (src / name / "payload.bin").write_bytes(os.urandom(payload_bytes))
    deps = ", ".join(f'"{d}"' for d in dependencies)
    (src / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\ndependencies = [{deps}]\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        + ('[tool.setuptools.package-data]\n"*" = ["*.bin"]\n' if payload_bytes else "")
    )
    out.mkdir(parents=True, exist_ok=True)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(out), str(src)], check=True)
    return out
