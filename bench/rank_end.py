"""A rank's end: what ending costs a rank forked from a warm interpreter, against a
cold rank, on this machine (no test cluster: the ranks of one host).

One "warm interpreter" imports torch and freezes its objects as orch's does
(`gc.freeze()`), then forks RANKS ranks at once. Each runs a short script (a tensor
sum, a line printed) through orch's own `run_script` and ends:

- orch:   through `rank_end.end_rank`: the interpreter's own exit, whose C `exit()`
          stops before the handlers the warm interpreter registered (torch's static
          destructors), as a warm rank ends now;
- before: through the interpreter's own exit in full (`sys.exit`: every module torn
          down, then C's `exit()` with every handler), as a warm rank ended before;
- cold:   RANKS `python -u script` processes started at once (what torchrun starts, and
          what a job started by hand runs): the import of torch included.

Each rank's CPU-seconds and minor page faults come from `wait4`: for orch and before,
from the fork to the rank's exit, the script's own work included (the same in both, so
their difference is the end's); for cold, the whole process, its import of torch
included. A fork's minor faults are mostly its copies of pages it shares with the warm
interpreter (4 KiB each), some first touches of new memory. Runs alternate; medians of
REPEAT.

    .venv/bin/python bench/rank_end.py [--ranks 4] [--repeat 7]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import machine, median, write_section

SCRIPT = """\
import torch
print("rank", int(torch.arange(1000).sum()))
"""

# The warm side, in a process of its own: imports torch, freezes, forks the ranks at
# once, prints each rank's CPU-seconds and minor faults.
WARM = """\
import gc, os, sys
import torch
from orchestrator.agent.node.warm import launch
from orchestrator.agent.node.warm.rank_end import end_rank
script, ranks, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
gc.collect()
gc.freeze()
pids = []
for _ in range(ranks):
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.argv = [script]
        if how == "orch":
            end_rank(lambda: launch.run_script(script))
        launch.run_script(script)
        sys.exit(0)
    pids.append(pid)
for pid in pids:
    _, status, usage = os.wait4(pid, 0)
    assert status == 0, status
    print(usage.ru_utime + usage.ru_stime, usage.ru_minflt)
"""

COLD = """\
import os, subprocess, sys
script, ranks = sys.argv[1], int(sys.argv[2])
procs = [subprocess.Popen([sys.executable, "-u", script], stdout=subprocess.DEVNULL)
         for _ in range(ranks)]
for proc in procs:
    _, status, usage = os.wait4(proc.pid, 0)
    assert status == 0, status
    print(usage.ru_utime + usage.ru_stime, usage.ru_minflt)
"""


def one(kind: str, script: Path, ranks: int) -> list[tuple[float, int]]:
    """One run of `kind`: each rank's (CPU-seconds, minor faults)."""
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-c", COLD if kind == "cold" else WARM, str(script), str(ranks)]
    if kind != "cold":
        argv.append(kind)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=root, check=True)
    rows = [line.split() for line in done.stdout.splitlines()]
    return [(float(cpu), int(faults)) for cpu, faults in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    kinds = ("orch", "before", "cold")
    cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
    faults: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(SCRIPT)
        for _ in range(args.repeat):
            for kind in kinds:
                ranks = one(kind, script, args.ranks)
                cpu[kind].append(sum(c for c, _ in ranks) / len(ranks))
                faults[kind].append(sum(f for _, f in ranks) / len(ranks))
    row = {kind: (median(cpu[kind]), median(faults[kind])) for kind in kinds}
    for kind in kinds:
        print(f"{kind:7} {row[kind][0]:.3f} CPU-s/rank  {row[kind][1]:8.0f} faults/rank")
    mb = {kind: row[kind][1] * 4096 / 1e6 for kind in kinds}
    body = f"""## A warm rank's end: CPU and copied pages per rank

{args.ranks} ranks forked at once from one process that imported torch and froze its
objects (`gc.collect()`, `gc.freeze()`, as a warm interpreter does), each running a short script
(a tensor sum, a line) through orch's `run_script`. orch: the rank ends through
`rank_end.end_rank`: the interpreter's own exit, whose C `exit()` stops before the
handlers the warm interpreter registered (torch's C++ static destructors), as a warm
rank ends now; before: the interpreter's exit in full, as a warm rank ended before; cold:
{args.ranks} `python -u script` processes at once, what torchrun starts for a job by
hand, the import of torch included (it says what a rank costs cold, not what its end
costs). Per rank, from the fork (cold: the start) to the exit, the script's work
included (the same for orch and before: their difference is the end's): CPU-seconds
and minor page faults, from `wait4` (for a fork, mostly its copies of the pages it
shares with the warm interpreter, 4 KiB each). Median of {args.repeat} alternating
runs; {machine()}.

| per rank | orch (now) | warm, before | cold (by hand) | orch / before |
|---|---:|---:|---:|---:|
| CPU-seconds | {row["orch"][0]:.3f} | {row["before"][0]:.3f} | {row["cold"][0]:.3f} | {row["orch"][0] / row["before"][0]:.2f}x |
| minor faults | {row["orch"][1]:.0f} | {row["before"][1]:.0f} | {row["cold"][1]:.0f} | {row["orch"][1] / row["before"][1]:.2f}x |
| memory faulted in (MB) | {mb["orch"]:.0f} | {mb["before"]:.0f} | {mb["cold"]:.0f} | |

Reproduce: `.venv/bin/python bench/rank_end.py --ranks {args.ranks} --repeat {args.repeat}`
"""
    write_section("rank-end", body)


if __name__ == "__main__":
    main()
