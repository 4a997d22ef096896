"""A wheel of a one-module package, built here with this python's pip and no index:
what the environment tests and bench/env.py install offline (`wheels:`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def tiny_wheel(work: Path, out: Path, name: str, version: str) -> Path:
    """Build `name==version` (its module says `VERSION = version`) into `out`, from a
    source tree made under `work`; returns `out`."""
    src = work / f"src-{name}-{version}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(f"VERSION = {version!r}\n")
    (src / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\n'
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
    )
    out.mkdir(parents=True, exist_ok=True)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(out), str(src)], check=True)
    return out
