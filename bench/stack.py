"""What `orch stack` takes, beside what a person does by hand today.

A detached job of `--ranks` torch-free ranks per host on `--hosts` hosts of the test
cluster: each rank prints `ready r<RANK>` and sleeps in a function, as a hung rank
would. Then, alternating, `--runs` times each:

- **orch**: `orch stack JOB --json`, every host at once (py-spy already carried: the
  first call, which carries it, is timed apart);
- **by hand, in parallel**: one `ssh HOST 'for each rank-N.pid: py-spy dump --pid'`
  per host, all started at once and waited for, py-spy put on each host beforehand
  (not timed), as a person with a parallel ssh would.

Reported: the median wall time of each, their ratio, and orch's own CPU and peak
memory (every host shares this machine's cores: CONTRIBUTING.md). Needs root (it
starts the namespace test cluster). Usage:

    .venv/bin/python bench/stack.py [--hosts 8] [--ranks 2] [--runs 5]
    .venv/bin/python bench/stack.py --hosts 32 --ranks 1 --section stack-32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.common import place_file, ssh_argv, wait_ranks_ready, wait_usage
from bench.report import machine, median, write_section
from orchestrator.nodes.tools import own_pyspy
from tests.cluster import Cluster, Controller, orch_command

RANK = """\
import os, time
def load_batch():
    time.sleep(3600)
print(f"ready r{os.environ['RANK']}", flush=True)
load_batch()
"""
REMOTE_BIN = "/root/bench-bin"


def submit(controller: Controller, tmp: Path, inventory: Path, hosts: int) -> str:
    work = tmp / "work"
    work.mkdir()
    (work / "rank.py").write_text(RANK)
    job = tmp / "job.yaml"
    spec = {"name": "stack-bench", "workdir": str(work), "script": "rank.py", "nodes": hosts}
    job.write_text(yaml.safe_dump({**spec, "warm": False}))
    done = subprocess.run(
        [*orch_command(), "submit", "-d", str(job), "-i", str(inventory)],
        env=controller.env(),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return done.stdout.split()[1]


def by_hand(cluster: Cluster, controller: Controller, job_id: str) -> float:
    """Every host's ranks dumped with py-spy over plain ssh, the hosts in parallel."""
    started = time.monotonic()
    procs = []
    for host in cluster.hosts:
        logs = f"~/.orch/jobs/{job_id}/{host.name}/logs"
        line = (
            f"for f in {logs}/rank-*.pid; do read pid rest < $f; "
            f"{REMOTE_BIN}/py-spy dump --pid $pid; done"
        )
        argv = ssh_argv(cluster, controller, host.address, line)
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 0 or b"Thread" not in out:
            raise RuntimeError(f"by hand: {err.decode(errors='replace')[-500:]}")
    return time.monotonic() - started


def with_orch(controller: Controller, job_id: str, ranks: int) -> tuple[float, float, float]:
    """`orch stack --json`: wall seconds, CPU seconds, peak RSS (MB); every rank read."""
    argv = [*orch_command(), "stack", job_id, "--json"]
    with tempfile.TemporaryFile() as out:
        started = time.monotonic()
        proc = subprocess.Popen(argv, env=controller.env(), stdout=out, stderr=subprocess.DEVNULL)
        usage = wait_usage(proc, timeout=120)
        seconds = time.monotonic() - started
        out.seek(0)
        text = out.read().decode(errors="replace")
    read = [r for r in json.loads(text)["ranks"] if r["via"] == "py-spy"] if text else []
    if proc.returncode != 0 or len(read) != ranks:
        raise RuntimeError(f"orch stack read {len(read)} of {ranks} ranks: {text[-500:]}")
    return seconds, usage.cpu_s, usage.peak_rss_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=2, help="ranks per host")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--section", default="stack", help="the BENCHMARKS.md section")
    args = parser.parse_args()
    pyspy = own_pyspy()
    if pyspy is None:
        raise SystemExit("no py-spy beside this Python: make setup")
    with Cluster(args.hosts) as cluster, tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        controller = cluster.new_controller()
        inventory = cluster.write_inventory(
            tmp / "inv.yaml", **{h.name: {"slots": args.ranks} for h in cluster.hosts}
        )
        place_file(cluster, controller, pyspy, REMOTE_BIN)
        for host in cluster.hosts:
            cluster.exec_on(host.index, ["chmod", "700", f"{REMOTE_BIN}/py-spy"])
        job_id = submit(controller, tmp, inventory, args.hosts)
        total = args.hosts * args.ranks
        try:
            wait_ranks_ready(cluster, job_id, total, timeout=600)
            first, _, _ = with_orch(controller, job_id, total)  # carries py-spy
            orch, hand, cpu, rss = [], [], [], []
            for i in range(args.runs):
                for which in ("orch", "hand") if i % 2 == 0 else ("hand", "orch"):
                    if which == "orch":
                        seconds, cpu_s, peak = with_orch(controller, job_id, total)
                        orch.append(seconds)
                        cpu.append(cpu_s)
                        rss.append(peak)
                    else:
                        hand.append(by_hand(cluster, controller, job_id))
        finally:
            subprocess.run(
                [*orch_command(), "kill", job_id],
                env=controller.env(),
                capture_output=True,
                timeout=300,
            )
    ratio = median(orch) / median(hand)
    rows = [
        "| hosts x ranks | orch stack | by hand (ssh + py-spy dump, parallel) | ratio | "
        "orch CPU | orch peak RSS | first orch stack (carries py-spy) |",
        "|---|---|---|---|---|---|---|",
        f"| {args.hosts} x {args.ranks} | {median(orch):.2f} s | {median(hand):.2f} s | "
        f"{ratio:.2f}x | {median(cpu):.2f} s | {median(rss):.0f} MB | {first:.2f} s |",
    ]
    command = f".venv/bin/python bench/stack.py --hosts {args.hosts} --ranks {args.ranks} --runs {args.runs}"
    if args.section != "stack":
        command += f" --section {args.section}"
    body = "\n".join(
        [
            f"### `orch stack` at {args.hosts} hosts x {args.ranks} ranks",
            "",
            f"Every rank's stack of a running job: `orch stack --json` beside one `ssh HOST "
            f"'py-spy dump'` loop per host, all hosts in parallel, in the same run, "
            f"alternating, median of {args.runs} each ({machine()}). The controller's own "
            "CPU and memory are orch's process alone; every host shares this machine's "
            "cores.",
            "",
            *rows,
            "",
            f"`{command}`",
        ]
    )
    print(body)
    write_section(args.section, body)


if __name__ == "__main__":
    main()
