"""The controller's CPU per host, step by step: what one more host costs `orch`.

In one process, over N hosts of the test cluster (default 16 and 32), the steps every
command takes, each timed by the CPU this process spent (all its threads):

- connect:   `HostGroup.connect()`: one SSH connection per host, in parallel;
- preflight: what `orch submit` runs before it starts anything (probe, port test);
- command:   one agent command on every host (`status` of no job: a channel, the
             agent archive on stdin, a JSON reply), as start and kill are;
- idle:      the connections held open for 10 s with nothing to do;
- database:  one job's node records moved to a new state, one write per node, as
             submit and kill do (wall time: most of it is the disk's).

Per host: the step's CPU divided by the host count. Needs root. Usage:

    .venv/bin/python bench/controller.py [--hosts 16 32] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import machine, median, write_section
from orchestrator.check.run import preflight
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job
from orchestrator.models.states import JobState
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.plan import select_hosts
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.transport import ConnectOptions
from tests.cluster import Cluster

JOB_DIR = Path(__file__).resolve().parent / "jobs" / "first_line"
IDLE_S = 10.0


@dataclass(frozen=True)
class Costs:
    """Milliseconds per host: CPU for the SSH steps, wall time for the database."""

    hosts: int
    connect: float
    preflight: float
    command: float
    idle_per_s: float
    database: float


def cpu_ms_per_host(step: Callable[[], object], hosts: int, runs: int = 1) -> float:
    """Run `step` `runs` times; this process's CPU ms per host and run."""
    started = time.process_time()
    for _ in range(runs):
        step()
    return (time.process_time() - started) / hosts / runs * 1000


def database_ms_per_node(hosts: list[str], runs: int) -> float:
    """Wall ms per node record written, one write each, on this machine's temp disk."""
    with tempfile.TemporaryDirectory() as home:
        store = JobDB(Path(home))
        nodes = [NodeRecord(h, i, i, 1, f"~/.orch/jobs/b/{h.name}") for i, h in enumerate(hosts)]
        store.add(JobRecord("bench-1", "bench", JobState.PENDING, "10.0.0.1", 29500, {}, nodes))
        started = time.monotonic()
        for _ in range(runs):
            for node in nodes:
                store.update_node("bench-1", node.host.name, JobState.RUNNING)
        return (time.monotonic() - started) / len(nodes) / runs * 1000


def measure(cluster: Cluster, home: Path, n: int, repeat: int) -> Costs:
    inventory = cluster.write_inventory(
        home / f"inv{n}.yaml", hosts=[h.name for h in cluster.hosts[:n]]
    )
    job_file = home / f"job{n}.yaml"
    job_file.write_text(
        f"name: costs\nworkdir: {JOB_DIR}\nscript: first_line.py\nnodes: {n}\n"
        f"inventory: {inventory}\n"
    )
    job = load_job(job_file)
    hosts = select_hosts(job, load_inventory(inventory))
    group = HostGroup(hosts, ConnectOptions(notice=lambda _: None))
    with group:
        connect = cpu_ms_per_host(group.connect, n)
        checked = cpu_ms_per_host(lambda: preflight(job, hosts, group), n, repeat)
        command = cpu_ms_per_host(
            lambda: group.each(lambda h, t: agent.run(h, t, ["status", "/no-such-job"])),
            n,
            repeat,
        )
        idle = cpu_ms_per_host(lambda: time.sleep(IDLE_S), n) / IDLE_S
    return Costs(n, connect, checked, command, idle, database_ms_per_node(hosts, repeat))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each step (median)")
    args = parser.parse_args()

    rows = []
    with Cluster(max(args.hosts)) as cluster:
        controller = cluster.new_controller()
        for key, value in controller.env().items():  # known_hosts, ORCH_HOME: as the CLI's
            if key.startswith("ORCH_") or key == "HOME":
                os.environ[key] = value
        for n in args.hosts:
            runs = [measure(cluster, controller.home, n, 1) for _ in range(args.repeat)]
            row = Costs(
                n,
                *(
                    median([getattr(r, field) for r in runs])
                    for field in ("connect", "preflight", "command", "idle_per_s", "database")
                ),
            )
            rows.append(row)
            print(row)

    table = [
        "| hosts | connect (CPU ms/host) | preflight (CPU ms/host) | one agent command "
        "(CPU ms/host) | idle connections (CPU ms/host/s) | job database (wall ms/node) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    table += [
        f"| {r.hosts} | {r.connect:.1f} | {r.preflight:.1f} | {r.command:.2f} "
        f"| {r.idle_per_s:.2f} | {r.database:.1f} |"
        for r in rows
    ]
    print("\n".join(table))
    body = "\n".join(
        [
            "## The controller's CPU per host, step by step",
            "",
            "What one more host costs the controller in each step every command takes: the CPU",
            "this one process spent (all its threads) divided by the host count. Connect: one SSH",
            "connection per host, in parallel (key exchange, the host certificate's check, the",
            "user key's signature). Preflight: what `orch submit` runs before it starts anything.",
            "One agent command: a channel, the agent archive on stdin, a JSON reply, as start and",
            f"kill are. Idle: the connections held {IDLE_S:.0f} s with nothing to do (paramiko wakes",
            "each one's thread every 0.1 s). Job database: one node record written, as submit and",
            "kill do once per node (wall time, mostly the disk's). Median of "
            f"{args.repeat} runs; {machine()}.",
            "",
            *table,
            "",
            "Reproduce: `sudo .venv/bin/python bench/controller.py --hosts "
            f"{' '.join(map(str, args.hosts))} --repeat {args.repeat}`",
        ]
    )
    write_section("controller", body)


if __name__ == "__main__":
    main()
