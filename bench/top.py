"""What `orch top` costs the ranks it watches.

A 2-node job of one CPU-bound rank per host (node1, node2 of the test cluster): each
rank repeats a fixed unit of pure-Python work and prints, every 0.5 s, the wall time
and how many units it has done. Both ranks together keep this machine's 2 cores busy,
so anything top costs anywhere (the controller, sshd, the agent on each host) is taken
from them: the worst case.

1. Iteration rate, side by side: `--pairs` pairs of short phases (`--phase` s) without
   and with `orch top JOB --json` refreshing at the default interval (2 s), in
   alternating order (off/on, on/off, ...), each pair compared on the ranks' units per
   second (TRIM_S trimmed at either end of a phase). One orch top runs throughout,
   stopped (SIGSTOP) in the phases without it: what is compared is its steady cost,
   every refresh on every host; its start is measured apart (`--once`'s CPU).
2. Its cost in CPU, over one `--cost-run` of orch top: its own process once started
   (CPU seconds per minute), and everything it makes a host do (sshd's session and
   every agent command it runs: the CPU the host's sshd reaps from its sessions),
   handshake included; and one sample alone on a host (the agent's start, the /proc
   scan, the log reads), the agent's `top` run there 20 times.

Needs root (it starts the namespace test cluster). Usage:

    .venv/bin/python bench/top.py [--pairs 30] [--phase 4] [--cost-run 30]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.common import cpu_seconds, run_usage, wait_usage
from bench.report import machine, median, write_section
from orchestrator.agent.kernel import layout
from orchestrator.nodes import agent
from tests.cluster import Cluster, Controller, orch_command, repo_python

RANK = r"""
import time
done, report = 0, time.time() + 0.5
while True:
    total = 0
    for i in range(20000):
        total += i * i
    done += 1
    now = time.time()
    if now >= report:
        print(f"{now:.3f} {done}", flush=True)
        report += 0.5
"""
SAMPLES = 20
STARTED_S = 5.0  # orch top has started and connected by then
CORES = os.cpu_count() or 1
TRIM_S = 0.5  # of each phase's start and end: a refresh in flight when it changed


def submit(controller: Controller, tmp: Path, inventory: Path) -> str:
    work = tmp / "work"
    work.mkdir()
    (work / "rank.py").write_text(RANK)
    job = tmp / "job.yaml"
    spec = {"name": "top-bench", "workdir": str(work), "script": "rank.py", "nodes": 2}
    job.write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [*orch_command(), "submit", "-d", str(job), "-i", str(inventory)],
        env=controller.env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout.split()[1]


def start_top(controller: Controller, job_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*orch_command(), "top", job_id, "--json"],
        env=controller.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def stop_top(watcher: subprocess.Popen[bytes]) -> None:
    watcher.send_signal(signal.SIGINT)
    wait_usage(watcher, timeout=30)


def phases(
    controller: Controller, job_id: str, pairs: int, phase_s: float
) -> list[tuple[bool, float, float]]:
    """Run the phases: (with top?, start, end) of each, in wall time. One orch top runs
    throughout, connected; in the phases without it, it is stopped (SIGSTOP): no
    refresh, no agent command, the connections idle. Its start-up is measured apart."""
    done: list[tuple[bool, float, float]] = []
    watcher = start_top(controller, job_id)
    try:
        time.sleep(STARTED_S)
        for i in range(pairs):
            for with_top in (False, True) if i % 2 == 0 else (True, False):
                watcher.send_signal(signal.SIGCONT if with_top else signal.SIGSTOP)
                start = time.time()
                time.sleep(phase_s)
                done.append((with_top, start, time.time()))
    finally:
        watcher.send_signal(signal.SIGCONT)
        stop_top(watcher)
    return done


def start_cost_s(controller: Controller, job_id: str) -> float:
    """CPU seconds of `orch top --once --json`: its start, imports, SSH handshakes and
    two samples: what each start of orch top costs the controller."""
    argv = [*orch_command(), "top", job_id, "--once", "--json"]
    _, usage = run_usage(argv, env=controller.env(), timeout=120)
    return usage.cpu_s


def reaped_cpu_s(cluster: Cluster, i: int) -> float:
    """CPU seconds host i's sshd (its PID 1) has reaped from ended sessions: each
    session's own work and that of every command it ran."""
    stat = cluster.exec_on(i, ["cat", "/proc/1/stat"]).stdout
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def cost_run(
    cluster: Cluster, controller: Controller, job_id: str, seconds: float
) -> tuple[float, list[float]]:
    """orch top's own CPU s per minute once started, and each host's CPU s per minute
    for it (sessions end, and are reaped, when orch top has quit)."""
    before = [reaped_cpu_s(cluster, i) for i in (1, 2)]
    start = time.time()
    watcher = start_top(controller, job_id)
    time.sleep(STARTED_S)
    cpu_started, started = cpu_seconds(watcher.pid), time.time()
    time.sleep(max(0.0, seconds - STARTED_S))
    own = (cpu_seconds(watcher.pid) - cpu_started) / (time.time() - started) * 60
    stop_top(watcher)
    ran = time.time() - start
    time.sleep(1.0)  # the sessions close and sshd reaps them
    hosts = [(reaped_cpu_s(cluster, i) - b) / ran * 60 for i, b in zip((1, 2), before, strict=True)]
    return own, hosts


def rank_rate(log: Path, start: float, end: float) -> float:
    """Units per second between start+TRIM_S and end-TRIM_S, from the rank's lines."""
    points = []
    for line in log.read_text().splitlines():
        when, _, units = line.partition(" ")
        try:
            t, n = float(when), int(units)
        except ValueError:
            continue
        if start + TRIM_S <= t <= end - TRIM_S:
            points.append((t, n))
    if len(points) < 2:
        raise RuntimeError(f"too few lines in {log} between {start} and {end}")
    (t0, n0), (t1, n1) = points[0], points[-1]
    return (n1 - n0) / (t1 - t0)


def sample_cost_ms(cluster: Cluster, job_id: str) -> float:
    """CPU milliseconds one agent `top` sample takes on node1 (start to reply)."""
    script = f"/root/.orch/agent/{agent.version()}/{layout.RUN_SCRIPT}"
    job_dir = f"/root/.orch/jobs/{job_id}/node1"
    request = json.dumps({"job_id": job_id, "offsets": {}})
    argv = [str(repo_python()), "-I", "-S", script, "top", job_dir]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(SAMPLES):
        result = cluster.exec_on(1, argv, input=request)
        if result.returncode != 0 or '"ranks"' not in result.stdout:
            raise RuntimeError(f"agent top failed: {result.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return used / SAMPLES * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--phase", type=float, default=4.0, help="seconds per phase")
    parser.add_argument("--cost-run", type=float, default=30.0, help="seconds of orch top")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orch-bench-top-") as tmp_dir, Cluster(2) as cluster:
        tmp = Path(tmp_dir)
        controller = cluster.new_controller()
        inventory = cluster.write_inventory(tmp / "inv.yaml")
        job_id = submit(controller, tmp, inventory)
        logs = [
            cluster.home(i) / ".orch" / "jobs" / job_id / f"node{i}" / "logs" / f"rank-{i - 1}.log"
            for i in (1, 2)
        ]
        deadline = time.monotonic() + 60
        while not all(p.exists() and p.stat().st_size for p in logs):
            if time.monotonic() > deadline:
                raise RuntimeError("the ranks did not start")
            time.sleep(0.2)
        try:
            done = phases(controller, job_id, args.pairs, args.phase)
            own, hosts = cost_run(cluster, controller, job_id, args.cost_run)
            once_s = start_cost_s(controller, job_id)
            sample_ms = sample_cost_ms(cluster, job_id)
            rates = [(on, sum(rank_rate(log, s, e) for log in logs)) for on, s, e in done]
        finally:
            subprocess.run(
                [*orch_command(), "kill", job_id],
                env=controller.env(),
                capture_output=True,
                timeout=120,
            )
    rows = []
    for i in range(0, len(rates), 2):
        pair = dict(rates[i : i + 2])
        rows.append((pair[False], pair[True], pair[True] / pair[False]))
    for n, (off, on, ratio) in enumerate(rows, 1):
        print(f"pair {n}: without top {off:8.1f} units/s  with top {on:8.1f}  ratio {ratio:.3f}")
    figures = Figures(rows, own, hosts, sample_ms, once_s)
    print(
        f"median ratio {figures.ratio:.3f} (quartiles {figures.quartiles[0]:.3f}"
        f" .. {figures.quartiles[1]:.3f}); orch top {own:.2f} CPU s/min, start {once_s:.2f} s; hosts "
        + ", ".join(f"{h:.2f}" for h in hosts)
        + f" CPU s/min; one sample {sample_ms:.1f} ms"
    )
    write_section("top", body(figures, args))


@dataclass(frozen=True)
class Figures:
    rows: list[tuple[float, float, float]]  # without, with, ratio
    own_per_min: float
    hosts_per_min: list[float]
    sample_ms: float
    once_s: float

    @property
    def ratio(self) -> float:
        return median([r for _, _, r in self.rows])

    @property
    def quartiles(self) -> tuple[float, float]:
        q = statistics.quantiles([r for _, _, r in self.rows], n=4)
        return q[0], q[2]


def body(f: Figures, args: argparse.Namespace) -> str:
    lines = [
        "## orch top: what watching costs the ranks",
        "",
        "A 2-node job, one CPU-bound rank per host (a fixed unit of pure-Python work in a "
        "loop); both ranks together keep the machine's 2 cores busy, so whatever `orch top` "
        "costs anywhere (its own process, sshd and the agent on each host) is taken from "
        f"them. {args.pairs} pairs of {args.phase:g} s phases without and with "
        "`orch top JOB --json` refreshing at the default 2 s interval, in alternating "
        "order; one orch top runs throughout, stopped (SIGSTOP) in the phases without it. "
        f"The ranks' units per second are compared pair by pair, {TRIM_S:g} s trimmed at "
        "each end of a phase.",
        "",
        f"{machine()}; other sessions share this machine: single pairs are noisy, the "
        "median and quartiles say more.",
        "",
        "| pair | without top (units/s, both ranks) | with top | with / without |",
        "|---:|---:|---:|---:|",
    ]
    for n, (off, on, r) in enumerate(f.rows, 1):
        lines.append(f"| {n} | {off:.1f} | {on:.1f} | {r:.3f} |")
    low, high = f.quartiles
    lines += [
        f"| median (quartiles) | | | **{f.ratio:.3f}** ({low:.3f} .. {high:.3f}) |",
        "",
        f"What it costs in CPU, over {args.cost_run:g} s of `orch top` (interval 2 s):",
        "",
        "| where | CPU s per minute | % of one core |",
        "|---|---:|---:|",
        f"| orch top's own process, once started (controller) | {f.own_per_min:.2f} |"
        f" {f.own_per_min / 60 * 100:.1f} |",
    ]
    for i, h in enumerate(f.hosts_per_min, 1):
        lines.append(
            f"| node{i}: sshd's session and every agent command (handshake included) |"
            f" {h:.2f} | {h / 60 * 100:.1f} |"
        )
    lines += [
        f"| of which one agent `top` sample alone: {f.sample_ms:.1f} ms of CPU |"
        f" {f.sample_ms / 1000 * 30:.2f} | {f.sample_ms / 1000 / 2 * 100:.1f} |",
        "",
        f"Each start of `orch top` (imports, SSH handshakes, two samples: `--once --json`)"
        f" costs the controller {f.once_s:.2f} CPU s, once.",
        "",
        f"All together, {f.own_per_min + sum(f.hosts_per_min):.2f} CPU s per minute: "
        f"{(f.own_per_min + sum(f.hosts_per_min)) / 60 / CORES * 100:.1f}% of this "
        f"machine's {CORES} cores, which here also run both hosts and the controller; on a "
        "host of its own, one sample every 2 s is the figure per host above, divided by "
        "its cores. The rate ratio moves from pair to pair with other sessions' load on "
        "this machine; the CPU share is the steadier figure.",
        "",
        f"Reproduce: `sudo .venv/bin/python bench/top.py --pairs {args.pairs} "
        f"--phase {args.phase:g} --cost-run {args.cost_run:g}`",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
