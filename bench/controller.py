"""The controller's CPU per host, step by step: what one more host costs `orch`.

In one process, over N hosts of the test cluster (default 16 and 32), the steps every
command takes, each timed by the CPU this process spent (all its threads):

- connect:   `HostGroup.connect()`: one SSH connection per host, in parallel;
- preflight: what `orch submit` runs before it starts anything (probe, port test);
- command:   one agent command on every host (`status` of no job: a channel and a
             JSON reply; the agent archive goes only to a host that lacks its
             version), as start and kill are;
- idle:      the connections held open for 10 s with nothing to do;
- database:  one job's node records moved to a new state, one write per node, as
             submit and kill do (wall time: most of it is the disk's).

Per host: the step's CPU divided by the host count.

And the whole launch as `orch submit` spends it (default at 8, 32 and 48 hosts; the
test cluster holds 64, but 64 hosts' torchruns and ranks need more memory than this
machine's 23 GB, so 64 hosts is for the steps): the
`orch` process's CPU (user + system, every thread, from the kernel's accounting of
the child) for a one-rank-per-host job that prints a line and ends, divided by the
host count; with `--before DIR`, the `orch` of another checkout (its .venv) runs the
same job in the same run, alternating, for the figure before a change. Needs root.
Usage:

    .venv/bin/python bench/controller.py [--hosts 16 32] [--repeat 5]
        [--launch 8 32 48] [--launch-repeat 1] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import wait_usage
from bench.report import machine, median, write_section
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job
from orchestrator.models.states import JobState
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.ssh.check.run import preflight
from orchestrator.ssh.plan import select_hosts
from orchestrator.transport import ConnectOptions
from tests.cluster import Cluster, Controller, orch_command

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


@dataclass(frozen=True)
class Launch:
    """One host count's whole launch: `orch submit`'s CPU ms per host (medians)."""

    hosts: int
    wall_s: float
    cpu_ms: float
    before_wall_s: float | None = None
    before_cpu_ms: float | None = None


def submit_usage(
    orch: list[str], controller: Controller, job: Path, inventory: Path
) -> tuple[float, float]:
    """Run `orch submit` to the job's end; its wall seconds and CPU seconds.

    Raises:
        RuntimeError: it failed.
    """
    argv = [*orch, "submit", str(job), "-i", str(inventory)]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, env=controller.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    usage = wait_usage(proc, timeout=900)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        assert proc.stderr is not None
        raise RuntimeError(
            f"{argv[0]} submit exited {proc.returncode}: {proc.stderr.read()[-2000:]!r}"
        )
    return wall, usage.cpu_s


def launches(
    cluster: Cluster, controller: Controller, n: int, repeat: int, before: Path | None
) -> Launch:
    """The whole launch at n hosts, `repeat` times (alternating with `before`'s orch)."""
    inventory = cluster.write_inventory(
        controller.home / f"launch{n}.yaml", hosts=[h.name for h in cluster.hosts[:n]]
    )
    job = controller.home / f"launch-job{n}.yaml"
    job.write_text(f"name: costs\nworkdir: {JOB_DIR}\nscript: first_line.py\nnodes: {n}\n")
    old = [str(before / ".venv" / "bin" / "orch")] if before is not None else None
    if old is not None:  # its first launch unpacks its agent on the hosts: not timed
        submit_usage(old, controller, job, inventory)
    now, then = [], []
    for _ in range(repeat):
        if old is not None:
            then.append(submit_usage(old, controller, job, inventory))
        now.append(submit_usage(orch_command(), controller, job, inventory))
        wall, cpu = now[-1]
        # The first launch starts cold; the ones after it fork from the warm
        # interpreters the first left on the hosts, as a resubmit does.
        print(f"launch at {n} hosts: {wall:.1f} s wall, {cpu / n * 1000:.0f} ms CPU per host")
    row = Launch(
        n,
        median([w for w, _ in now]),
        median([c for _, c in now]) / n * 1000,
        median([w for w, _ in then]) if then else None,
        median([c for _, c in then]) / n * 1000 if then else None,
    )
    print(row, flush=True)
    return row


def unpack_agent(cluster: Cluster, controller: Controller) -> None:
    """This orch's agent unpacked on every host, as any launch but a version's first
    finds it (that first one also sends the archive: one more round trip per host)."""
    inventory = cluster.write_inventory(controller.home / "all.yaml")
    hosts = load_inventory(inventory).hosts
    env = controller.env()
    options = ConnectOptions(known_hosts=Path(env["ORCH_KNOWN_HOSTS"]), notice=lambda _: None)
    with HostGroup(hosts, options) as group:
        group.connect()
        group.each(lambda h, t: agent.run(h, t, ["status", "/no-such-job"]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each step (median)")
    parser.add_argument("--launch", type=int, nargs="*", default=[8, 32, 48])
    parser.add_argument("--launch-repeat", type=int, default=1, help="timed launches (median)")
    parser.add_argument("--before", type=Path, help="a checkout whose orch runs beside")
    args = parser.parse_args()

    rows = []
    launched: list[Launch] = []
    with Cluster(max([*args.hosts, *args.launch])) as cluster:
        controller = cluster.new_controller()
        unpack_agent(cluster, controller)
        launched = [
            launches(cluster, controller, n, args.launch_repeat, args.before) for n in args.launch
        ]
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
    before = any(r.before_cpu_ms is not None for r in launched)
    launch_table = [
        "| hosts | `orch submit` (wall s) | its CPU per host (ms) |"
        + (" before: wall (s) | before: CPU per host (ms) |" if before else ""),
        "|---:|---:|---:|" + ("---:|---:|" if before else ""),
    ]
    launch_table += [
        f"| {r.hosts} | {r.wall_s:.1f} | {r.cpu_ms:.0f} |"
        + (f" {r.before_wall_s:.1f} | {r.before_cpu_ms:.0f} |" if before else "")
        for r in launched
    ]
    print("\n".join(launch_table))
    body = "\n".join(
        [
            "## The controller's CPU per host, step by step",
            "",
            "The whole launch first, as `orch submit` spends it: a job of one rank per host",
            "that prints a line once every rank met and ends, from the command's start to its",
            "exit (connect, probe, push, start, follow, record); the `orch` process's CPU",
            "(user + system, all its threads, from the kernel) divided by the host count. The",
            "wall time stretches with the host count (every host's torch import shares this",
            "machine's 2 cores) and the idle connections' cost with it. Target: at most 60 ms",
            f"per host at 32 hosts. Median of {args.launch_repeat}, the agent already unpacked"
            " on the hosts (as for every launch but a version's first)"
            + (
                "; before: the orch of the checkout before the change, alternating with it in"
                " the same run, after an untimed first launch of its own."
                if before
                else "."
            ),
            "",
            *launch_table,
            "",
            "Then each step every command takes:",
            "",
            "What one more host costs the controller in each step every command takes: the CPU",
            "this one process spent (all its threads) divided by the host count. Connect: one SSH",
            "connection per host, in parallel (key exchange, the host certificate's check, the",
            "user key's signature). Preflight: what `orch submit` runs before it starts anything.",
            "One agent command: a channel and a JSON reply (the agent archive goes only to a host",
            "that lacks its version), as start and kill are. Idle: the connections held "
            f"{IDLE_S:.0f} s",
            "with nothing to do (paramiko's thread wakes every 5 s, a keepalive every 15 s).",
            "Job database: one node record written, as submit and",
            "kill do once per node (wall time, mostly the disk's). Median of "
            f"{args.repeat} runs; {machine()}.",
            "",
            *table,
            "",
            "Reproduce: `sudo .venv/bin/python bench/controller.py --hosts "
            f"{' '.join(map(str, args.hosts))} --repeat {args.repeat} --launch "
            f"{' '.join(map(str, args.launch))} --launch-repeat {args.launch_repeat}"
            + (" --before <checkout of the commit before>" if before else "")
            + "`",
        ]
    )
    write_section("controller", body)


if __name__ == "__main__":
    main()
