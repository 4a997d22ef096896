"""Failure teardown: from a rank's crash to the job's last process gone, everywhere.

For each host count (default 2, 4 and 8; one rank each), the last rank SIGKILLs
itself while every other rank waits in `time.sleep` loops before a barrier
(`workload.py --hang`):

- orch:      `orch submit job.yaml` tears the job down on every host;
- baseline:  bare torchrun started over parallel OpenSSH: the time until the
             survivors exit on their own, capped at 120 s (then they are killed).

The crash time is printed by the crashing rank; processes are found by their
environment tag in this machine's /proc, which sees every test host's processes.
The controller's CPU seconds and peak RSS come from the kernel's accounting of the
`orch` process (wait4, /proc/PID/stat).

It also measures `orch kill` at each host count of 8 or more (else the largest)
against parallel `ssh host pkill -f`; and at the largest, a partitioned host
(partition to the job stopped on the others) and the laptop's network down for 20 s
(this machine's side of the bridge), from its coming back to every host's output
flowing again, for `orch submit` and for plain OpenSSH sessions that print a line
every 0.5 s, side by side in the same outage. Host counts above 8 (`--hosts 16 32`)
go to a section of their own. Needs root. Usage:

    .venv/bin/python bench/failure.py [--hosts 2 4 8] [--cap 120] [--repeat 1]
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from bench.common import (
    Usage,
    cpu_seconds,
    machine_busy_s,
    place_file,
    run_usage,
    ssh_argv,
    tagged_pids,
    wait_gone,
    wait_ranks_ready,
    wait_usage,
)
from bench.report import machine, median, write_section
from tests.cluster import Cluster, Controller, orch_command, repo_python

WORKLOAD = (
    Path(__file__).resolve().parents[1]
    / "tests"
    / "integration"
    / "jobs"
    / "workload"
    / "workload.py"
)
REMOTE_DIR = "/root/bench-failure"


def crash_time(procs: list[subprocess.Popen[str]], timeout: float = 120) -> float:
    """Read the outputs until a rank says when it crashed."""
    found: list[float] = []
    done = threading.Event()

    def read(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "crash at " in line and not done.is_set():
                found.append(float(line.rsplit("crash at ", 1)[1]))
                done.set()

    for p in procs:
        threading.Thread(target=read, args=(p,), daemon=True).start()
    if not done.wait(timeout):
        raise RuntimeError("no rank crashed")
    return found[0]


def kill_tagged(tag: bytes) -> None:
    for pid in tagged_pids(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def submit_attached(controller: Controller, job: Path, inventory: Path) -> subprocess.Popen[str]:
    """`orch submit` of a job, attached, its output read as it comes (text)."""
    return subprocess.Popen(
        [*orch_command(), "submit", str(job), "-i", str(inventory)],
        env=controller.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@dataclass(frozen=True)
class Teardown:
    """One crash under an attached `orch submit`."""

    gone_s: float  # from the crash until no process of the job is left on any host
    exited_s: float  # from the crash until `orch submit` exited
    cpu_after_s: float  # the controller's CPU seconds from the crash on
    usage: Usage  # the whole `orch submit`: launch, watching, teardown
    cores_busy: float  # the machine's busy cores, on average, until the job was gone


def orch_teardown(controller: Controller, job: Path, inventory: Path) -> Teardown:
    proc = submit_attached(controller, job, inventory)
    assert proc.stdout is not None and proc.stderr is not None
    errors: list[str] = []
    threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True).start()
    first = proc.stdout.readline().split()
    if len(first) < 2:
        proc.wait()
        raise SystemExit(f"orch submit failed:\n{''.join(errors)}")
    job_id = first[1]
    crashed = crash_time([proc])
    cpu_at_crash, busy_at_crash, seen = cpu_seconds(proc.pid), machine_busy_s(), time.time()
    gone = wait_gone(f"ORCH_JOB_ID={job_id}".encode(), 60)
    busy = (machine_busy_s() - busy_at_crash) / max(time.time() - seen, 1e-3)
    usage = wait_usage(proc, timeout=60)
    exited = time.time()
    if gone is None:
        raise RuntimeError("orch left processes behind")
    return Teardown(gone - crashed, exited - crashed, usage.cpu_s - cpu_at_crash, usage, busy)


def baseline_teardown(
    cluster: Cluster, controller: Controller, n: int, port: int, args: str, cap: float
) -> tuple[float, bool]:
    tag = f"BENCH_TAG={uuid.uuid4().hex}"
    python = shlex.quote(str(repo_python()))
    procs = []
    for i, host in enumerate(cluster.hosts[:n]):
        remote = (
            f"cd {REMOTE_DIR} && {tag} GLOO_SOCKET_IFNAME=eth0 {python} -m torch.distributed.run "
            f"--nnodes {n} --node-rank {i} --nproc-per-node 1 --master-addr {cluster.hosts[0].address} "
            f"--master-port {port} --local-addr {host.address} workload.py {args}"
        )
        procs.append(
            subprocess.Popen(
                ssh_argv(cluster, controller, host.address, remote),
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    crashed = crash_time(procs)
    gone = wait_gone(tag.encode(), cap - (time.time() - crashed), poll=0.05)
    kill_tagged(tag.encode())
    for p in procs:
        p.kill()
        p.wait()
    return (cap, True) if gone is None else (gone - crashed, False)


def running_job(
    cluster: Cluster, env: dict[str, str], job: Path, inventory: Path, n: int
) -> tuple[str, bytes]:
    """Submit a detached job and wait until every rank runs; its id and process tag."""
    submitted = subprocess.run(
        [*orch_command(), "submit", "-d", str(job), "-i", str(inventory)],
        env=env,
        capture_output=True,
        text=True,
    )
    if submitted.returncode != 0:
        raise SystemExit(f"orch submit -d failed at {n} hosts:\n{submitted.stderr}")
    job_id = submitted.stdout.split()[1]
    wait_ranks_ready(cluster, job_id, n)
    time.sleep(1)
    return job_id, f"ORCH_JOB_ID={job_id}".encode()


@dataclass(frozen=True)
class Kill:
    """`orch kill` of a running job, and parallel ssh pkill of another."""

    orch_s: float
    usage: Usage
    cores_busy: float  # the machine's busy cores, on average, during `orch kill`
    pkill_s: float


def kill_latency(
    cluster: Cluster, controller: Controller, job: Path, inventory: Path, n: int
) -> Kill:
    """orch kill's wall time and usage, and parallel ssh pkill's wall time, at n hosts."""
    env = controller.env()
    job_id, tag = running_job(cluster, env, job, inventory, n)
    busy_before = machine_busy_s()
    orch_s, usage = run_usage([*orch_command(), "kill", job_id], env=env)
    busy = (machine_busy_s() - busy_before) / orch_s
    if tagged_pids(tag):
        raise RuntimeError("orch kill left processes")
    job_id, tag = running_job(cluster, env, job, inventory, n)
    started = time.monotonic()
    pkills = [
        subprocess.Popen(ssh_argv(cluster, controller, h.address, "pkill -9 -f workload.py"))
        for h in cluster.hosts[:n]
    ]
    for p in pkills:
        p.wait()
    wait_gone(tag, 30)
    ssh_s = time.monotonic() - started
    subprocess.run(
        [*orch_command(), "kill", job_id], env=env, capture_output=True
    )  # torchruns, records
    return Kill(orch_s, usage, busy, ssh_s)


class LineTimes:
    """When each line of a process's stdout arrived, by the host it names."""

    def __init__(self, proc: subprocess.Popen[str], host_of: Callable[[str], str | None]) -> None:
        self.times: list[tuple[float, str]] = []
        assert proc.stdout is not None
        threading.Thread(target=self._read, args=(proc.stdout, host_of), daemon=True).start()

    def _read(self, stdout: IO[str], host_of: Callable[[str], str | None]) -> None:
        for line in stdout:
            host = host_of(line)
            if host is not None:
                self.times.append((time.monotonic(), host))

    def hosts_since(self, since: float) -> dict[str, float]:
        """Each host's first line after `since`: seconds after it."""
        first: dict[str, float] = {}
        for at, host in list(self.times):
            if at > since and host not in first:
                first[host] = at - since
        return first


def _named(name: str, _line: str) -> str:
    return name


RANK_PREFIX = re.compile(r"^\[(\S+) r\d+\] ")


def rank_line_host(line: str) -> str | None:
    """The host of a rank's line (`[node2 r3] ...`); None for anything else, torchrun's
    own lines (`[node2] ...`) included: at 32 hosts those come a minute before the
    ranks print, and the outage must fall where every rank is printing."""
    match = RANK_PREFIX.match(line)
    return match.group(1) if match else None


def network_back(
    cluster: Cluster, controller: Controller, inventory: Path, n: int, outage_s: float = 20
) -> tuple[float, float | None, float]:
    """This machine off the cluster for `outage_s`, then back: seconds until every
    host's output flows again, for orch (attached submit) and for parallel OpenSSH
    sessions (None if some never came back within 60 s); and orch's own outage notice
    delay after the cut."""
    job = controller.home / "lines.yaml"
    job.write_text(
        f"name: lines\nworkdir: {WORKLOAD.parent}\nscript: workload.py\nnodes: {n}\n"
        "args: [--lines, '150', --interval, '0.5']\n"
    )
    orch = submit_attached(controller, job, inventory)
    orch_lines = LineTimes(orch, rank_line_host)
    loop = "i=0; while [ $i -lt 200 ]; do echo line $i; i=$((i+1)); sleep 0.5; done"
    ssh = {
        h.name: subprocess.Popen(
            ssh_argv(cluster, controller, h.address, loop),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for h in cluster.hosts[:n]
    }
    ssh_lines = [LineTimes(p, functools.partial(_named, name)) for name, p in ssh.items()]
    deadline = time.monotonic() + 120
    while len(orch_lines.hosts_since(0)) < n or any(not t.times for t in ssh_lines):
        if time.monotonic() > deadline:
            raise RuntimeError("the job's output never came from every host")
        time.sleep(0.2)
    time.sleep(2)
    cut = time.monotonic()
    cluster.cut_controller()
    try:
        time.sleep(outage_s)
    finally:
        cluster.reconnect_controller()
    back = time.monotonic()
    wait_until = back + 60
    while time.monotonic() < wait_until:
        ssh_back = {h: t for lines in ssh_lines for h, t in lines.hosts_since(back).items()}
        if len(orch_lines.hosts_since(back)) == n and len(ssh_back) == n:
            break
        time.sleep(0.1)
    orch_back = orch_lines.hosts_since(back)
    ssh_back = {h: t for lines in ssh_lines for h, t in lines.hosts_since(back).items()}
    _, err = orch.communicate(timeout=180)
    for p in ssh.values():
        p.kill()
        p.wait()
    if orch.returncode != 0 or len(orch_back) != n:
        raise RuntimeError(f"orch did not follow on: exit {orch.returncode}: {err[-2000:]}")
    notice = err.find("lost contact with every host")
    if notice < 0:
        raise RuntimeError(f"orch never said it lost contact: {err[-2000:]}")
    return max(orch_back.values()), max(ssh_back.values()) if len(ssh_back) == n else None, cut


def partition_teardown(
    cluster: Cluster, controller: Controller, inventory: Path, n: int
) -> tuple[float, float]:
    """The last host partitioned under a running attached job: seconds until orch
    declares it lost, and until the job is stopped on every other host."""
    job = controller.home / "hang-part.yaml"
    job.write_text(
        f"name: part\nworkdir: {WORKLOAD.parent}\nscript: workload.py\nnodes: {n}\nargs: [--hang]\n"
    )
    orch = submit_attached(controller, job, inventory)
    assert orch.stdout is not None and orch.stderr is not None
    job_id = orch.stdout.readline().split()[1]
    wait_ranks_ready(cluster, job_id, n)
    stderr: list[tuple[float, str]] = []

    def read() -> None:
        assert orch.stderr is not None
        for line in orch.stderr:
            stderr.append((time.monotonic(), line))

    threading.Thread(target=read, daemon=True).start()
    last = cluster.hosts[n - 1]
    cut = time.monotonic()
    cluster.partition(last.index)
    try:
        deadline = cut + 60
        lost = stopped = None
        while (lost is None or stopped is None) and time.monotonic() < deadline:
            for at, line in list(stderr):
                if lost is None and f"lost node {last.name}" in line:
                    lost = at - cut
                if stopped is None and "not reachable; stopping the job there" in line:
                    stopped = at - cut  # printed once the others are stopped
            time.sleep(0.05)
        orch.send_signal(signal.SIGINT)  # stop trying to reach the partitioned host
        orch.wait(timeout=60)
    finally:
        cluster.heal(last.index)
    subprocess.run([*orch_command(), "kill", job_id], env=controller.env(), capture_output=True)
    if lost is None or stopped is None:
        raise RuntimeError("orch did not find the partitioned host lost")
    return lost, stopped


@dataclass(frozen=True)
class TeardownRow:
    """One host count's crashes: orch's runs and the baseline's one."""

    hosts: int
    runs: list[Teardown]
    base_s: float
    capped: bool

    def median(self, value: Callable[[Teardown], float]) -> float:
        return median([value(r) for r in self.runs])

    def cells(self) -> str:
        base = f"{'≥ ' if self.capped else ''}{self.base_s:.1f}"
        base += " (capped: survivors still hung)" if self.capped else ""
        return (
            f"| {self.hosts} | {self.median(lambda r: r.gone_s):.2f} "
            f"| {self.median(lambda r: r.exited_s):.2f} "
            f"| {self.median(lambda r: r.cpu_after_s):.2f} "
            f"| {self.median(lambda r: r.usage.cpu_s):.2f} "
            f"| {self.median(lambda r: r.usage.peak_rss_mb):.0f} "
            f"| {self.median(lambda r: r.cores_busy):.1f} | {base} |"
        )


@dataclass(frozen=True)
class KillRow:
    """One host count's `orch kill` runs."""

    hosts: int
    runs: list[Kill]

    def cells(self) -> str:
        return (
            f"| {self.hosts} | {median([r.orch_s for r in self.runs]):.2f} "
            f"| {median([r.usage.cpu_s for r in self.runs]):.2f} "
            f"| {median([r.usage.peak_rss_mb for r in self.runs]):.0f} "
            f"| {median([r.cores_busy for r in self.runs]):.1f} "
            f"| {median([r.pkill_s for r in self.runs]):.2f} "
            f"| {median([r.orch_s for r in self.runs]) / median([r.pkill_s for r in self.runs]):.2f}x |"
        )


def kill_row(cluster: Cluster, controller: Controller, n: int, repeat: int) -> KillRow:
    """`orch kill` and parallel ssh pkill at n hosts, `repeat` times each."""
    hang = controller.home / f"hang{n}.yaml"
    hang.write_text(
        f"name: hang\nworkdir: {WORKLOAD.parent}\nscript: workload.py\nnodes: {n}\nargs: [--hang]\n"
    )
    inventory = cluster.write_inventory(
        controller.home / f"inv-kill{n}.yaml", hosts=[h.name for h in cluster.hosts[:n]]
    )
    killed = [kill_latency(cluster, controller, hang, inventory, n) for _ in range(repeat)]
    print(
        f"orch kill at {n} hosts: {[round(k.orch_s, 2) for k in killed]} s, CPU "
        f"{[round(k.usage.cpu_s, 2) for k in killed]} s, RSS "
        f"{[round(k.usage.peak_rss_mb) for k in killed]} MB, cores busy "
        f"{[round(k.cores_busy, 1) for k in killed]}; parallel ssh pkill: "
        f"{[round(k.pkill_s, 2) for k in killed]} s"
    )
    return KillRow(n, killed)


def kill_rows(kills: list[KillRow]) -> list[str]:
    return [
        "| hosts | `orch kill` (s) | its CPU (s) | its peak RSS (MB) | machine's busy cores "
        "| parallel `ssh host pkill -9 -f` (s) | orch / pkill |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(row.cells() for row in kills),
    ]


def kill_only(hosts: list[int], repeat: int) -> None:
    """The kill measurements alone, at each host count, into their own section."""
    with Cluster(max(hosts)) as cluster:
        controller = cluster.new_controller()
        place_file(cluster, controller, WORKLOAD, REMOTE_DIR)
        kills = [kill_row(cluster, controller, n, repeat) for n in hosts]
    table = kill_rows(kills)
    every = [
        f"{row.hosts} hosts: orch "
        + ", ".join(f"{r.orch_s:.2f}" for r in row.runs)
        + "; pkill "
        + ", ".join(f"{r.pkill_s:.2f}" for r in row.runs)
        for row in kills
    ]
    body = "\n".join(
        [
            "## `orch kill` against a parallel `ssh pkill`",
            "",
            "`orch kill` of a running job, one rank per host, every rank past its first line:",
            "wall time for the whole command (start the CLI, connect, TERM, give the ranks their",
            "grace, KILL torchrun once its ranks are gone, confirm every process and the port",
            "gone, record it), its CPU and peak RSS. The baseline, in the same run against",
            "another job of the same shape: one `ssh host pkill -9 -f` per host, all at once,",
            "until the job's processes are gone; it kills only the workers, leaves torchrun and",
            f"confirms nothing. Median of {repeat} runs each; {machine()}. Targets: at most 1.0x",
            "the pkill at 8 hosts, at most 1.5 s at 32. Every host's sshd and agent share this",
            "machine's 2 cores (the busy cores column), which a cluster's hosts would not.",
            "",
            *table,
            "",
            "Every run (s): " + "; ".join(every) + ".",
            "",
            f"Reproduce: `sudo .venv/bin/python bench/failure.py --only kill --hosts "
            f"{' '.join(map(str, hosts))} --repeat {repeat}`",
        ]
    )
    write_section("kill", body)
    print("\n".join(table))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--cap", type=float, default=120.0)
    parser.add_argument(
        "--repeat", type=int, default=1, help="orch's runs per host count (crash, kill): median"
    )
    parser.add_argument(
        "--only",
        choices=["kill"],
        help="only `orch kill` against parallel ssh pkill, at every --hosts count "
        "(its own section, kill)",
    )
    args = parser.parse_args()
    if args.only == "kill":
        kill_only(args.hosts, args.repeat)
        return
    scale = max(args.hosts) > 8
    kill_at = [n for n in args.hosts if n >= 8] or [max(args.hosts)]

    rows: list[TeardownRow] = []
    kills: list[KillRow] = []
    with Cluster(max(args.hosts)) as cluster:
        controller = cluster.new_controller()
        place_file(cluster, controller, WORKLOAD, REMOTE_DIR)
        port = 29800
        for n in args.hosts:
            inventory = cluster.write_inventory(
                controller.home / f"inv{n}.yaml", hosts=[h.name for h in cluster.hosts[:n]]
            )
            fail = [
                "--fail-rank",
                str(n - 1),
                "--fail-how",
                "sigkill",
                "--fail-after",
                "2",
                "--hang",
            ]
            job = controller.home / f"fail{n}.yaml"
            job.write_text(
                f"name: fail\nworkdir: {WORKLOAD.parent}\nscript: workload.py\nnodes: {n}\n"
                f"args: [{', '.join(fail)}]\n"
            )
            runs = [orch_teardown(controller, job, inventory) for _ in range(args.repeat)]
            port += 1
            base_s, capped = baseline_teardown(
                cluster, controller, n, port, " ".join(fail), args.cap
            )
            rows.append(TeardownRow(n, runs, base_s, capped))
            print(
                f"{n} hosts: orch {[round(r.gone_s, 2) for r in runs]} s "
                f"(exited {[round(r.exited_s, 2) for r in runs]} s, CPU after the crash "
                f"{[round(r.cpu_after_s, 2) for r in runs]} s, submit CPU "
                f"{[round(r.usage.cpu_s, 2) for r in runs]} s, RSS "
                f"{[round(r.usage.peak_rss_mb) for r in runs]} MB, cores busy "
                f"{[round(r.cores_busy, 1) for r in runs]}), "
                f"bare torchrun {'>=' if capped else ''}{base_s:.1f} s"
            )
        kills = [kill_row(cluster, controller, n, args.repeat) for n in kill_at]
        n = max(args.hosts)
        inventory = cluster.write_inventory(
            controller.home / "inv-all.yaml", hosts=[h.name for h in cluster.hosts[:n]]
        )
        lost_s, stopped_s = partition_teardown(cluster, controller, inventory, n)
        print(
            f"partition at {n} hosts: lost after {lost_s:.1f} s, others stopped {stopped_s:.1f} s"
        )
        orch_back_s, ssh_back_s, _ = network_back(cluster, controller, inventory, n)
        ssh_text = "never (60 s)" if ssh_back_s is None else f"{ssh_back_s:.2f} s"
        print(f"network back at {n} hosts: orch following in {orch_back_s:.2f} s; ssh {ssh_text}")

    table = [
        "| hosts | orch: crash to last process gone (s) | crash to `orch submit`'s exit (s) "
        "| controller CPU from the crash on (s) | `orch submit` CPU, all of it (s) "
        "| its peak RSS (MB) | machine's busy cores, crash to gone | bare torchrun over ssh (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    table += [row.cells() for row in rows]
    kill_table = kill_rows(kills)
    runs = "median of " + (f"{args.repeat} runs" if args.repeat > 1 else "1 run")
    every = [
        f"{row.hosts} hosts: " + ", ".join(f"{r.gone_s:.2f}" for r in row.runs) for row in rows
    ] + [
        f"`orch kill` at {row.hosts} hosts: " + ", ".join(f"{r.orch_s:.2f}" for r in row.runs)
        for row in kills
    ]
    target_at = max(args.hosts) if scale else 8
    body = "\n".join(
        [
            "## Failure teardown: a rank's crash to the job's last process gone"
            + (f" ({' and '.join(str(r.hosts) for r in rows)} hosts)" if scale else ""),
            "",
            "One rank per host; the last rank SIGKILLs itself while the others wait before a",
            "barrier. orch's time runs from the crash (printed by the rank) until no process",
            "carrying the job's tag is left on any host. The baseline is bare torchrun started",
            f"over parallel ssh: the survivors' time until they exit on their own, capped at {args.cap:.0f} s.",
            "The controller's share: the attached `orch submit`'s CPU seconds from the crash until",
            "it exited, and for the whole command (connecting, pushing, starting, following),",
            f"with its peak RSS. orch's figures: {runs}; {machine()}. The machine's busy cores:",
            "all of this machine's CPU time over the window (the hosts' agents, torchruns and",
            "sshds with the controller), in cores; near 2, the hosts' work queued for the 2",
            "cores, as it would not on a cluster where each host has its own.",
            f"Target: at most 2 s at {target_at} hosts.",
            "",
            *table,
            "",
            "`orch kill` of a running job (every rank printed its first line): wall time for the",
            "whole command (start, connect, TERM, give the ranks their grace, KILL torchrun once",
            "its ranks are gone, confirm every process and the port gone, record it), its CPU and",
            "peak RSS; parallel `ssh host pkill -9 -f` kills only the workers, leaves torchrun and",
            "confirms nothing."
            + (
                f" Target: at most 2 s at {target_at} hosts. Here every host's sshd and agent"
                " queue for this machine's 2 cores (the busy cores column), which a cluster's"
                " hosts would not: the parallel pkill, doing less, takes nearly as long; what"
                " carries over is the controller's CPU and memory per host (docs/SCALE.md)."
                if scale
                else f" Target: under 1.5 s at {target_at} hosts."
            ),
            "",
            *kill_table,
            "",
            *(
                ["Every run, crash to last process gone (s): " + "; ".join(every) + ".", ""]
                if args.repeat > 1
                else []
            ),
            f"A host partitioned (its link down) under a running job at {n} hosts: orch declares it lost "
            f"after **{lost_s:.1f} s** (`lost_after` 12 s of silence, confirmed by a failed fresh connection "
            f"while the other hosts answer) and has stopped the job on the others {stopped_s:.1f} s after "
            "the cut. Bare torchrun over ssh: the survivors hang in the collective until its timeout "
            "(gloo 30 min, NCCL 10 min).",
            "",
            f"This machine's network down for 20 s (its side of the bridge) under a running attached job "
            f"at {n} hosts, the ranks printing a line every 0.5 s: from the network coming back to every "
            f"host's output flowing again, orch **{orch_back_s:.2f} s** (fresh connections, following on "
            f"from the byte offsets; the job succeeds, no line lost or doubled); plain OpenSSH sessions "
            f"printing the same way, in the same outage: {ssh_text} (their TCP connections wait for "
            "the next retransmission). Target: under 2 s.",
            "",
            f"Reproduce: `sudo .venv/bin/python bench/failure.py --hosts {' '.join(map(str, args.hosts))} "
            f"--cap {args.cap:.0f}" + (f" --repeat {args.repeat}" if args.repeat > 1 else "") + "`",
        ]
    )
    write_section("failure-scale" if scale else "failure", body)
    print("\n".join(table))
    print("\n".join(kill_table))


if __name__ == "__main__":
    main()
