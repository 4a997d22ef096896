"""Launch latency: `orch submit` vs hand-written parallel ssh + torchrun.

For 2, 4 and 8 hosts, time from the command's start until every rank has printed its
first line (after the whole world met in init_process_group):

- orch:      `orch submit job.yaml -i inventory.yaml` (code push included);
- baseline:  one `ssh host 'cd dir && GLOO_SOCKET_IFNAME=eth0 python -m
             torch.distributed.run --nnodes N --node-rank i ...'` per host, all in
             parallel (OpenSSH), with the code already on the hosts.

Runs alternate between the two, and the median of each is reported.
Needs root (it starts the namespace test cluster). Usage:

    .venv/bin/python bench/launch.py [--hosts 2 4 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import place_file, ssh_argv
from bench.report import machine, median, write_section
from tests.cluster import Cluster, Controller, orch_command, repo_python

JOB_DIR = Path(__file__).resolve().parent / "jobs" / "first_line"
SCRIPT = "first_line.py"
BASELINE_DIR = "/root/bench-launch"  # on the hosts: each has a private /root


def time_to_all_ranks(
    commands: Sequence[list[str]],
    ranks: int,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> float:
    """Start the commands together; seconds until `ranks` distinct 'ready rank' lines were read."""
    seen: set[str] = set()
    done = threading.Event()
    lock = threading.Lock()
    start = time.monotonic()
    finished_at = [0.0]
    procs = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        for c in commands
    ]

    def read(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "ready rank" in line:
                with lock:
                    seen.add(line.split("ready rank", 1)[1].strip())
                    if len(seen) == ranks and not done.is_set():
                        finished_at[0] = time.monotonic() - start
                        done.set()

    threads = [threading.Thread(target=read, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    for p in procs:
        p.wait(timeout=timeout)
    for t in threads:
        t.join(timeout=10)
    failed = [p.returncode for p in procs if p.returncode != 0]
    if not done.is_set() or failed:
        raise RuntimeError(
            f"run failed: saw ranks {sorted(seen)}, exit codes {[p.returncode for p in procs]}"
        )
    return finished_at[0]


def baseline_commands(
    cluster: Cluster, controller: Controller, n: int, port: int
) -> list[list[str]]:
    python = shlex.quote(str(repo_python()))
    master = cluster.hosts[0].address
    commands = []
    for i, host in enumerate(cluster.hosts[:n]):
        remote = (
            f"cd {BASELINE_DIR} && GLOO_SOCKET_IFNAME=eth0 {python} -m torch.distributed.run "
            f"--nnodes {n} --node-rank {i} --nproc-per-node 1 --master-addr {master} "
            f"--master-port {port} --local-addr {host.address} {SCRIPT}"
        )
        commands.append(ssh_argv(cluster, controller, host.address, remote))
    return commands


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    rows = []
    with Cluster(max(args.hosts)) as cluster:
        controller = cluster.new_controller()
        env = controller.env()
        place_file(cluster, controller, JOB_DIR / SCRIPT, BASELINE_DIR)
        job = controller.home / "job.yaml"
        port = 29700
        for n in args.hosts:
            inventory = cluster.write_inventory(
                controller.home / f"inv{n}.yaml", hosts=[h.name for h in cluster.hosts[:n]]
            )
            job.write_text(f"name: launch\nworkdir: {JOB_DIR}\nscript: {SCRIPT}\nnodes: {n}\n")
            orch_times, base_times = [], []
            for _ in range(args.repeat):
                port += 1
                base_times.append(
                    time_to_all_ranks(baseline_commands(cluster, controller, n, port), n)
                )
                orch_times.append(
                    time_to_all_ranks(
                        [[*orch_command(), "submit", str(job), "-i", str(inventory)]], n, env=env
                    )
                )
            o, b = median(orch_times), median(base_times)
            rows.append((n, o, b, o / b))
            print(
                f"{n} hosts: orch {o:.2f} s  ssh+torchrun {b:.2f} s  ratio {o / b:.2f}  "
                f"(orch {[round(t, 2) for t in orch_times]}, baseline {[round(t, 2) for t in base_times]})"
            )

    table = [
        "| hosts | orch submit (s) | parallel ssh + torchrun (s) | ratio |",
        "|---:|---:|---:|---:|",
    ]
    table += [f"| {n} | {o:.2f} | {b:.2f} | {r:.2f}x |" for n, o, b, r in rows]
    body = "\n".join(
        [
            "## Launch: submit to every rank's first line",
            "",
            "Time from starting the command until every rank has printed its first line (after",
            "`init_process_group`), one process per host. orch includes connecting, probing,",
            "pushing the code and starting the supervisors; the baseline is one hand-written",
            "`ssh host 'cd dir && python -m torch.distributed.run ...'` per host, in parallel,",
            "with the code already on the hosts. Median of "
            f"{args.repeat} alternating runs; {machine()}. Target: at most 1.3x at 8 hosts.",
            "",
            *table,
            "",
            f"Reproduce: `sudo .venv/bin/python bench/launch.py --hosts {' '.join(map(str, args.hosts))} "
            f"--repeat {args.repeat}`",
        ]
    )
    write_section("launch", body)
    print("\n".join(table))


if __name__ == "__main__":
    main()
