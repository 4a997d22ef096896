"""Preflight cost: what `orch submit` adds to check a job before it starts anything.

At 8 hosts (the issue's target: "well under a second of added time for 8 hosts"),
on the same connected hosts (one SSH connection each, as submit holds them):

- preflight:   check.preflight(), what submit runs now: each host's probe (versions,
               GPUs where declared, route to the master, the master's port and its
               holder) and the port test (a listener on the master, a TCP connection
               from every other node);
- bare probe:  the probe alone, as submit ran it before (versions and route);
- by hand:     what users do today, `ssh host python -c 'import torch; print(torch.__version__)'`
               to every host in parallel (OpenSSH, a new connection each);
- orch check:  the whole `orch check job.yaml` command, connecting included.

Runs alternate between the four; medians are reported. Needs root (it starts the
namespace test cluster). Usage:

    .venv/bin/python bench/preflight.py [--hosts 8] [--repeat 7]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.nodes.group import HostGroup
from orchestrator.nodes.probe import probe
from orchestrator.ssh.check.run import preflight
from orchestrator.ssh.plan import select_hosts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ssh_argv
from bench.report import machine, median, write_section
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job
from orchestrator.transport import ConnectOptions
from tests.cluster import Cluster, Controller, orch_command, repo_python

JOB_DIR = Path(__file__).resolve().parent / "jobs" / "first_line"


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def by_hand(cluster: Cluster, controller: Controller, n: int) -> None:
    """`ssh host python -c 'import torch; ...'` to every host at once."""
    command = f"{shlex.quote(str(repo_python()))} -c 'import torch; print(torch.__version__)'"
    procs = [
        subprocess.Popen(
            ssh_argv(cluster, controller, host.address, command),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for host in cluster.hosts[:n]
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0 or not out.strip():
            raise RuntimeError(f"ssh + import torch failed: {proc.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    n = args.hosts

    with Cluster(n) as cluster:
        controller = cluster.new_controller()
        inventory_path = cluster.write_inventory(controller.home / "inventory.yaml")
        job_path = controller.home / "job.yaml"
        job_path.write_text(f"name: bench\nworkdir: {JOB_DIR}\nscript: first_line.py\nnodes: {n}\n")
        job = load_job(job_path)
        hosts = select_hosts(job, load_inventory(inventory_path))
        check_argv = [*orch_command(), "check", str(job_path), "-i", str(inventory_path)]
        times: dict[str, list[float]] = {"preflight": [], "bare": [], "hand": [], "check": []}
        options = ConnectOptions(known_hosts=controller.known_hosts)
        with HostGroup(hosts, options) as group:
            group.connect()
            master = hosts[0].address

            def bare() -> None:
                group.each(lambda h, t: probe(h, t, master))

            bare()  # warm the hosts' page cache once, for every contender alike
            for _ in range(args.repeat):
                times["bare"].append(timed(bare))
                times["preflight"].append(timed(lambda: preflight(job, hosts, group)))
                times["hand"].append(timed(lambda: by_hand(cluster, controller, n)))
                times["check"].append(
                    timed(
                        lambda: subprocess.run(
                            check_argv, env=controller.env(), check=True, capture_output=True
                        )
                    )
                )
    m = {name: median(values) for name, values in times.items()}
    added = m["preflight"] - m["bare"]
    for name, values in times.items():
        print(f"{name:10s} median {m[name] * 1000:7.0f} ms  {[round(v * 1000) for v in values]}")
    print(f"added by the preflight at {n} hosts: {added * 1000:.0f} ms")

    rows = [
        ("submit's preflight (probe + port test)", m["preflight"]),
        ("the bare probe it replaces", m["bare"]),
        ("by hand: parallel `ssh host python -c 'import torch'`", m["hand"]),
        ("`orch check job.yaml`, connecting included", m["check"]),
    ]
    table = ["| step, 8 hosts in parallel | median (ms) |", "|---|---:|"]
    table += [f"| {what} | {seconds * 1000:.0f} |" for what, seconds in rows]
    intro = (
        f"At {n} hosts, over connections already open (as submit holds them): the "
        "preflight submit runs now (each host's probe with the master's port and its "
        "holder, then a listener on the master's rendezvous port and a TCP connection to "
        "it from every other node), against the bare probe it replaces, and against what "
        "users type today to compare torch versions. The hosts have no GPUs: on GPU hosts "
        "add nvidia-smi's own time, which runs alongside the probe and only where the "
        f"inventory declares GPUs. Median of {args.repeat} alternating runs; {machine()}."
    )
    verdict = (
        f"Added to `orch submit` by the preflight: **{added * 1000:.0f} ms** at {n} hosts "
        "(target: well under a second). The check by hand costs "
        f"{m['hand'] / m['preflight']:.0f}x the whole preflight, and finds only torch versions."
    )
    body = "\n".join(
        [
            "## Preflight: what submit adds to refuse a job that would hang",
            "",
            textwrap.fill(intro, 88),
            "",
            *table,
            "",
            textwrap.fill(verdict, 88),
            "",
            f"Reproduce: `sudo .venv/bin/python bench/preflight.py --hosts {n} "
            f"--repeat {args.repeat}`",
        ]
    )
    write_section("preflight", body)
    print("\n".join(table))


if __name__ == "__main__":
    main()
