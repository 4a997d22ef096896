"""Host command start: what one orch command on a host costs before it does anything.

Every orch step on a host (status, kill, each push round trip, the probe) starts the
agent through its loader: read the archive from stdin, find the unpacked version,
import the command's module. Timed here as a whole process, `status` of a job
directory that does not exist (the smallest command), against the floor: the same
interpreter starting with the same flags and doing nothing (`python -I -S -c pass`).
Alternating runs, median; no SSH (that is the same for both).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import machine, median, write_section
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent


def timed(command: str, stdin: bytes) -> float:
    started = time.perf_counter()
    subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        host = Host(name="here", address="localhost", python=sys.executable, workdir=workdir)
        status = agent.command(host, "status", f"{workdir}/no-such-job")
        floor = f"{shlex.quote(sys.executable)} -I -S -c pass"
        timed(status, agent.packed())  # the first run unpacks and compiles the version
        agent_s, floor_s = [], []
        for _ in range(args.repeat):
            agent_s.append(timed(status, agent.packed()))
            floor_s.append(timed(floor, b""))
    a, f = median(agent_s) * 1000, median(floor_s) * 1000
    print(f"agent status: {a:.1f} ms, bare interpreter: {f:.1f} ms, agent's own: {a - f:.1f} ms")
    write_section(
        "agent_start",
        f"""## Host command start: the agent's cost on every step

One orch command on a host, as a whole process: the loader reads the agent's archive
from stdin, finds its unpacked version and imports only the command's module; timed on
`status` of a job that does not exist. The floor is the same interpreter starting with
the same flags and doing nothing. Median of {args.repeat} alternating runs, no SSH;
{machine()}.

| | ms |
|---|---:|
| agent `status` through the loader | {a:.1f} |
| `python -I -S -c pass` | {f:.1f} |
| the agent's own part | {a - f:.1f} |

Before the agent became a package (one 1,420-line supervisor module, commit 20697b6),
the same command took 25 ms where the package takes 23 ms (farm-bench, 40 paired runs:
0.91x wall). Importing `dataclasses` in the protocol module cost 6 ms a command, so the
replies there are plain classes.

Reproduce: `.venv/bin/python bench/agent_start.py --repeat 40`""",
    )


if __name__ == "__main__":
    main()
