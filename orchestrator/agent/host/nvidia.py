"""nvidia-smi, the agent's one way to ask about GPUs: a CSV query run (or started, to
run beside other work) under a timeout, its rows, and which process holds which GPU.

nvidia-smi comes with the driver on every GPU host; NVML has no binding in the
standard library. Every query asks for csv,noheader,nounits: one line per GPU or
process, memory a plain MiB number. A line that is not such a row (a warning, `No
devices were found`, a GPU that fell off the bus) is kept apart, as what nvidia-smi
said besides. A wedged driver makes nvidia-smi hang: each caller bounds its wait.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from typing import Any, NamedTuple

CSV = "--format=csv,noheader,nounits"
# Each compute process, the GPU it runs on (the apps query has no index: the UUID ties
# a process to its GPU) and the memory it holds there.
APPS_QUERY = "compute-apps=pid,gpu_uuid,used_memory"
TIMEOUT_S = 10.0


class Answer(NamedTuple):
    """What a query printed (its complaints too) and its exit code; `error` where it
    gave no answer at all (it could not run, or timed out)."""

    text: str
    returncode: int | None
    error: str | None = None


def find(path: str | None = None) -> str | None:
    """nvidia-smi on `path` (directories joined by os.pathsep; default: $PATH), or None."""
    return shutil.which("nvidia-smi", path=path)


def start(smi: str, query: str) -> subprocess.Popen[bytes]:
    """Start `nvidia-smi --query-QUERY` (`gpu=index,uuid`, APPS_QUERY), its stderr in
    its stdout.

    Raises:
        OSError: it cannot be run.
    """
    return subprocess.Popen(
        [smi, f"--query-{query}", CSV],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finish(query: subprocess.Popen[bytes], timeout: float = TIMEOUT_S) -> Answer:
    """The answer of a started query, waited for `timeout` seconds at most."""
    try:
        out, _ = query.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        query.kill()
        query.communicate()
        return Answer("", None, f"nvidia-smi gave no answer in {timeout:.0f} s")
    return Answer(out.decode("utf-8", "replace"), query.returncode)


def run(smi: str, query: str, timeout: float = TIMEOUT_S) -> Answer:
    """Run one query to its end (`start`, then `finish`)."""
    try:
        started = start(smi, query)
    except OSError as exc:
        return Answer("", None, f"nvidia-smi: {exc}")
    return finish(started, timeout)


def rows(text: str, width: int) -> tuple[list[list[str]], list[str]]:
    """The rows of a CSV answer (at least `width` cells, the first a number: an index, a
    pid), and its other lines, stripped."""
    found: list[list[str]] = []
    notes: list[str] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= width and cells[0].isdigit():
            found.append(cells)
        elif line.strip():
            notes.append(line.strip())
    return found, notes


def number(value: str) -> int | None:
    """A value of nvidia-smi's CSV: `[N/A]`, `[Not Supported]` and the like are None."""
    value = value.strip()
    try:
        return int(float(value))
    except ValueError:
        return None


def processes(text: str) -> list[dict[str, Any]]:
    """The rows of an APPS_QUERY answer, `81234, GPU-5d1e..., 40530`: pid, gpu_uuid,
    used_memory_mib (None where nvidia-smi cannot tell). Nothing at all when no process
    uses a GPU."""
    return [
        {"pid": int(cells[0]), "gpu_uuid": cells[1], "used_memory_mib": number(cells[2])}
        for cells in rows(text, 3)[0]
    ]


def held(
    gpus: Sequence[dict[str, Any]], apps: Sequence[dict[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Which process holds which GPU: (gpu, process) for each process of `apps`
    (`processes`) on one of `gpus` (each with its `uuid`), in the order of `apps`."""
    by_uuid = {gpu["uuid"]: gpu for gpu in gpus}
    return [(by_uuid[app["gpu_uuid"]], app) for app in apps if app["gpu_uuid"] in by_uuid]
