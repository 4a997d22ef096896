"""Launch latency: `orch submit` vs hand-written parallel ssh + torchrun.

For 2, 4 and 8 hosts, time from the command's start until every rank has printed its
first line (after the whole world met in init_process_group):

- orch:      `orch submit job.yaml -i inventory.yaml` (code push included);
- baseline:  one `ssh host 'cd dir && GLOO_SOCKET_IFNAME=eth0 python -m
             torch.distributed.run --nnodes N --node-rank i ...'` per host, all in
             parallel (OpenSSH), with the code already on the hosts.

Runs alternate between the two, and the median of each is reported, with what the
controller used: the `orch` process's CPU seconds and peak RSS, against the ssh
clients' together. Host counts above 8 (`--hosts 16 32`) go to a section of their own.
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Usage, place_file, ssh_argv, wait_usage
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
) -> tuple[float, Usage]:
    """Start the commands together; seconds until `ranks` distinct 'ready rank' lines
    were read, and what the commands used together (CPU seconds, the sum of their peak
    RSS: they all run from start to end)."""
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
    usages = [wait_usage(p, timeout=timeout) for p in procs]
    for t in threads:
        t.join(timeout=10)
    failed = [p.returncode for p in procs if p.returncode != 0]
    if not done.is_set() or failed:
        raise RuntimeError(
            f"run failed: saw ranks {sorted(seen)}, exit codes {[p.returncode for p in procs]}"
        )
    used = Usage(sum(u.cpu_s for u in usages), sum(u.peak_rss_mb for u in usages))
    return finished_at[0], used


def baseline_commands(
    cluster: Cluster,
    controller: Controller,
    n: int,
    port: int,
    directory: str = BASELINE_DIR,
    script: str = SCRIPT,
) -> list[list[str]]:
    """One `ssh host 'cd DIR && python -m torch.distributed.run ... SCRIPT'` per host:
    launching by hand, the code already in place."""
    python = shlex.quote(str(repo_python()))
    master = cluster.hosts[0].address
    commands = []
    for i, host in enumerate(cluster.hosts[:n]):
        remote = (
            f"cd {directory} && GLOO_SOCKET_IFNAME=eth0 {python} -m torch.distributed.run "
            f"--nnodes {n} --node-rank {i} --nproc-per-node 1 --master-addr {master} "
            f"--master-port {port} --local-addr {host.address} {script}"
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
            orch_runs, base_runs = [], []
            for _ in range(args.repeat):
                port += 1
                base_runs.append(
                    time_to_all_ranks(baseline_commands(cluster, controller, n, port), n)
                )
                orch_runs.append(
                    time_to_all_ranks(
                        [[*orch_command(), "submit", str(job), "-i", str(inventory)]], n, env=env
                    )
                )
            row = LaunchRow.of(n, orch_runs, base_runs)
            rows.append(row)
            print(
                f"{n} hosts: orch {row.orch_s:.2f} s  ssh+torchrun {row.base_s:.2f} s  "
                f"ratio {row.orch_s / row.base_s:.2f}  orch CPU {row.orch.cpu_s:.2f} s, "
                f"RSS {row.orch.peak_rss_mb:.0f} MB; ssh clients CPU {row.base.cpu_s:.2f} s, "
                f"RSS {row.base.peak_rss_mb:.0f} MB  "
                f"(orch {[round(t, 2) for t, _ in orch_runs]}, "
                f"baseline {[round(t, 2) for t, _ in base_runs]})"
            )

    scale = max(args.hosts) > 8
    table = [
        "| hosts | orch submit (s) | parallel ssh + torchrun (s) | ratio "
        "| orch CPU (s) | orch peak RSS (MB) | ssh clients' CPU (s) | ssh clients' RSS (MB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    table += [
        f"| {r.hosts} | {r.orch_s:.2f} | {r.base_s:.2f} | {r.orch_s / r.base_s:.2f}x "
        f"| {r.orch.cpu_s:.2f} | {r.orch.peak_rss_mb:.0f} | {r.base.cpu_s:.2f} "
        f"| {r.base.peak_rss_mb:.0f} |"
        for r in rows
    ]
    body = "\n".join(
        [
            "## Launch: submit to every rank's first line"
            + (f" ({' and '.join(str(r.hosts) for r in rows)} hosts)" if scale else ""),
            "",
            "Time from starting the command until every rank has printed its first line (after",
            "`init_process_group`), one process per host. orch includes connecting, probing,",
            "pushing the code and starting the supervisors; the baseline is one hand-written",
            "`ssh host 'cd dir && python -m torch.distributed.run ...'` per host, in parallel,",
            "with the code already on the hosts. Median of "
            f"{args.repeat} alternating runs; {machine()}. Target: at most 1.3x at "
            f"{max(args.hosts) if scale else 8} hosts.",
            "",
            "What the controller used (medians, the whole command: until the job ended, just",
            "after the first lines): the `orch` process's CPU seconds (user + system) and peak",
            "RSS, against the baseline's ssh clients together (the sum of their peak RSS).",
            *(
                [
                    "Every host's sshd, torchrun and rank share this machine's 2 cores, so the wall",
                    "times stretch with the host count; the controller's CPU and memory are what a",
                    "real cluster's controller would spend.",
                ]
                if scale
                else []
            ),
            "",
            *table,
            "",
            f"Reproduce: `sudo .venv/bin/python bench/launch.py --hosts {' '.join(map(str, args.hosts))} "
            f"--repeat {args.repeat}`",
        ]
    )
    write_section("launch-scale" if scale else "launch", body)
    print("\n".join(table))


@dataclass(frozen=True)
class LaunchRow:
    """One host count's medians."""

    hosts: int
    orch_s: float
    base_s: float
    orch: Usage
    base: Usage

    @staticmethod
    def of(
        hosts: int, orch_runs: list[tuple[float, Usage]], base_runs: list[tuple[float, Usage]]
    ) -> LaunchRow:
        def usage(runs: list[tuple[float, Usage]]) -> Usage:
            return Usage(
                median([u.cpu_s for _, u in runs]), median([u.peak_rss_mb for _, u in runs])
            )

        return LaunchRow(
            hosts,
            median([t for t, _ in orch_runs]),
            median([t for t, _ in base_runs]),
            usage(orch_runs),
            usage(base_runs),
        )


if __name__ == "__main__":
    main()
