"""Shared by the benchmarks: timing helpers and writing a section of docs/BENCHMARKS.md."""

from __future__ import annotations

import platform
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "BENCHMARKS.md"
HEADER = """# Benchmarks

Each figure comes from a script in `bench/` that runs orch and the baseline (what users
do by hand today) side by side in the same run, on the same hosts: these machines are
noisy, and only ratios carry over. Hosts are network namespaces with their own sshd on
one machine (the test cluster of `tests/cluster/`), so every host shares the same
CPUs: absolute times include that contention.
"""


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}"


def write_section(name: str, body: str) -> None:
    """Replace (or add) the section between `<!-- bench:NAME -->` markers."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = DOC.read_text() if DOC.exists() else HEADER
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    text = (
        pattern.sub(lambda _: block, text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + block + "\n"
    )
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(text)
