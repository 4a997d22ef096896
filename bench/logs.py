"""Log throughput and latency: orch's log path against raw `ssh host cat`.

N hosts (default 4; `--hosts 16 32` for more) x 2 ranks each write --lines lines of
100 bytes per rank as fast as they can. Then, side by side in the same run, with the
job's files finished on the hosts:

- orch:      `orch logs <id>` with an empty local copy: every byte comes from the
             hosts over orch's framed stream, is mirrored locally and printed with
             its `[host rN]` prefix;
- baseline:  one `ssh host 'cat <job dir>/logs/rank-*.log'` per host, in parallel.

Also: the attached `orch submit` streaming the same job live (lines/s as seen), and
`orch logs -f` following a running job: the latency from a rank's print to the
controller's stdout (every rank prints a timestamp every 20 ms, all at once, once
the controller follows), with --idle S, first S seconds of following a quiet job.
Each orch command's CPU seconds and peak RSS come from the kernel's accounting of
the process (wait4, /proc/PID/stat). Host counts above the default go to a section
of their own. Needs root. Usage:

    .venv/bin/python bench/logs.py [--hosts 4] [--lines N] [--repeat 3] [--idle S]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Usage, cpu_seconds, ssh_argv, wait_ranks_ready, wait_usage
from bench.report import machine, median, write_section
from tests.cluster import Cluster, Controller, orch_command

PRINTER = Path(__file__).resolve().parent / "jobs" / "printer"
DEFAULT_HOSTS, SLOTS = 4, 2
PROBE_S = 5.0


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int, Usage, str]:
    """Run a command; (seconds, stdout bytes, stdout lines, its usage, its first line)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    size, lines = len(first), first.count(b"\n")
    while chunk := proc.stdout.read(1 << 20):
        size += len(chunk)
        lines += chunk.count(b"\n")
    usage = wait_usage(proc)
    return time.monotonic() - started, size, lines, usage, first.decode(errors="replace")


def raw_cat(
    cluster: Cluster, controller: Controller, job_id: str, n: int
) -> tuple[float, int, int, Usage]:
    """Every host's rank logs through `ssh host cat`, all at once: (seconds, bytes, lines,
    the ssh clients' usage together: CPU, the sum of their peak RSS)."""
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            ssh_argv(
                cluster,
                controller,
                h.address,
                f"cat ~/.orch/jobs/{job_id}/{h.name}/logs/rank-*.log",
            ),
            stdout=subprocess.PIPE,
        )
        for h in cluster.hosts[:n]
    ]
    size = lines = 0
    usages = []
    for p in procs:
        assert p.stdout is not None
        while chunk := p.stdout.read(1 << 20):
            size += len(chunk)
            lines += chunk.count(b"\n")
        usages.append(wait_usage(p))
    used = Usage(sum(u.cpu_s for u in usages), sum(u.peak_rss_mb for u in usages))
    return time.monotonic() - started, size, lines, used


@dataclass(frozen=True)
class Follow:
    """`orch logs -f` of a job whose ranks print a timestamp every 20 ms."""

    delays: list[float]  # seconds from each rank's print to the controller's stdout
    idle_cpu_s: float  # CPU seconds the controller spent in the idle window
    probe_cpu_s: float  # from the ranks' first print to its exit
    usage: Usage  # the whole command
    threads: int  # the controller's threads while following every host
    fds: int  # and its open file descriptors

    def percentile(self, p: float) -> float:
        return sorted(self.delays)[int(len(self.delays) * p)]


def follow_latency(
    cluster: Cluster, controller: Controller, inventory: Path, n: int, idle_s: float
) -> Follow:
    """Submit a probe job detached; once every rank waits, follow it with `orch logs
    -f`, let it idle `idle_s`, then start every rank's timestamps at once."""
    env = controller.env()
    go = controller.home / f"go-{uuid.uuid4().hex}"
    probe = controller.home / f"probe{n}.yaml"
    probe.write_text(
        f"name: probe\nworkdir: {PRINTER}\nscript: printer.py\nnodes: {n}\n"
        f"args: [--probe, '{PROBE_S}', --start-file, '{go}']\n"
    )
    job_id = subprocess.run(
        [*orch_command(), "submit", "-d", str(probe), "-i", str(inventory)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    wait_ranks_ready(cluster, job_id, n * SLOTS)
    proc = subprocess.Popen(
        [*orch_command(), "logs", "-f", job_id],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    ready = 0
    while ready < n * SLOTS:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("orch logs -f ended before every rank's ready line")
        ready += "] ready r" in line
    idle_from = cpu_seconds(proc.pid)
    time.sleep(idle_s)
    probe_from = cpu_seconds(proc.pid)
    threads, fds = threads_and_fds(proc.pid)
    go.touch()
    delays = []
    for line in proc.stdout:
        if "] lat " in line:
            delays.append(time.time() - float(line.rsplit(" ", 1)[1]))
    usage = wait_usage(proc, timeout=60)
    if proc.returncode != 0 or not delays:
        raise RuntimeError(f"orch logs -f exited {proc.returncode} with {len(delays)} lines")
    return Follow(delays, probe_from - idle_from, usage.cpu_s - probe_from, usage, threads, fds)


def threads_and_fds(pid: int) -> tuple[int, int]:
    """A running process's threads and open file descriptors."""
    with open(f"/proc/{pid}/status") as f:
        threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


@dataclass(frozen=True)
class LogsRow:
    """One host count's figures."""

    hosts: int
    lines: int
    payload: int  # bytes of the ranks' logs
    orch_s: float
    orch: Usage
    raw_s: float
    raw: Usage
    live_s: float
    live_lines: int
    live: Usage
    follow: Follow


def measure(
    cluster: Cluster, controller: Controller, n: int, lines_per_rank: int, repeat: int, idle: float
) -> LogsRow:
    env = controller.env()
    inventory = cluster.write_inventory(
        controller.home / f"inv{n}.yaml",
        hosts=[h.name for h in cluster.hosts[:n]],
        defaults={"slots": SLOTS},
    )
    flood = controller.home / f"flood{n}.yaml"
    flood.write_text(
        f"name: flood\nworkdir: {PRINTER}\nscript: printer.py\nnodes: {n}\n"
        f"args: [--lines, '{lines_per_rank}']\n"
    )
    live_s, _, live_lines, live, first = timed(
        [*orch_command(), "submit", str(flood), "-i", str(inventory)], env
    )
    job_id = first.split()[1]  # `job <id>`
    orch_runs, raw_runs = [], []
    for _ in range(repeat):
        shutil.rmtree(controller.state_dir / "logs" / job_id, ignore_errors=True)
        orch_runs.append(timed([*orch_command(), "logs", job_id], env))
        raw_runs.append(raw_cat(cluster, controller, job_id, n))
    lines = n * SLOTS * lines_per_rank
    assert all(r[2] >= lines for r in orch_runs), "orch logs lost lines"
    follow = follow_latency(cluster, controller, inventory, n, idle)
    return LogsRow(
        n,
        lines,
        raw_runs[0][1],
        median([r[0] for r in orch_runs]),
        Usage(
            median([r[3].cpu_s for r in orch_runs]), median([r[3].peak_rss_mb for r in orch_runs])
        ),
        median([r[0] for r in raw_runs]),
        Usage(median([r[3].cpu_s for r in raw_runs]), median([r[3].peak_rss_mb for r in raw_runs])),
        live_s,
        live_lines,
        live,
        follow,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[DEFAULT_HOSTS])
    parser.add_argument("--lines", type=int, default=200_000, help="lines per rank")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--idle", type=float, default=0.0, help="seconds `orch logs -f` follows a quiet job first"
    )
    args = parser.parse_args()

    rows = []
    with Cluster(max(args.hosts)) as cluster:
        controller = cluster.new_controller()
        for n in args.hosts:
            row = measure(cluster, controller, n, args.lines, args.repeat, args.idle)
            rows.append(row)
            f = row.follow
            print(
                f"{n} hosts: orch logs {row.orch_s:.2f} s (CPU {row.orch.cpu_s:.2f} s, RSS "
                f"{row.orch.peak_rss_mb:.0f} MB), ssh cat {row.raw_s:.2f} s (CPU "
                f"{row.raw.cpu_s:.2f} s); live submit {row.live_lines / row.live_s:,.0f} lines/s "
                f"(CPU {row.live.cpu_s:.2f} s, RSS {row.live.peak_rss_mb:.0f} MB); logs -f latency "
                f"median {statistics.median(f.delays) * 1000:.0f} ms, p95 "
                f"{f.percentile(0.95) * 1000:.0f} ms over {len(f.delays)} lines, idle CPU "
                f"{f.idle_cpu_s:.2f} s, probe CPU {f.probe_cpu_s:.2f} s, RSS "
                f"{f.usage.peak_rss_mb:.0f} MB, {f.threads} threads, {f.fds} fds"
            )
    if max(args.hosts) > DEFAULT_HOSTS:
        write_section("logs-scale", scale_body(rows, args))
    else:
        write_section("logs", default_body(rows[-1], args))


def default_body(row: LogsRow, args: argparse.Namespace) -> str:
    """The section of the default run: one host count, two paths."""
    n = row.hosts
    table = [
        "| path | seconds | lines/s | MB/s (payload) | CPU (s) | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s, usage in (
        ("`orch logs` (from the hosts)", row.orch_s, row.orch),
        (f"`ssh host cat` x{n} in parallel", row.raw_s, row.raw),
    ):
        table.append(
            f"| {name} | {s:.2f} | {row.lines / s:,.0f} | {row.payload / s / 1e6:.1f} "
            f"| {usage.cpu_s:.2f} | {usage.peak_rss_mb:.0f} |"
        )
    for line in table:
        print(line)
    f = row.follow
    p50, p95 = statistics.median(f.delays) * 1000, f.percentile(0.95) * 1000
    return "\n".join(
        [
            "## Logs: throughput and latency",
            "",
            f"{n} hosts x {SLOTS} ranks, {args.lines:,} lines of 100 bytes per rank "
            f"({row.lines:,} lines, {row.payload / 1e6:.0f} MB). Both paths read the same finished files on",
            "the hosts, side by side in the same run (median of "
            f"{args.repeat}): orch's includes its framing, the local copy it writes and the",
            "per-line `[host rN]` prefixes; the baseline is raw `cat` over OpenSSH, one per host.",
            "CPU and peak RSS: the `orch` process's, against the ssh clients' together (the sum",
            f"of their peaks). {machine()}. Target: at least 50% of raw ssh.",
            "",
            *table,
            "",
            f"orch reaches **{row.raw_s / row.orch_s:.0%}** of raw ssh throughput. Streaming the same job live with an",
            "attached `orch submit` (writers and readers sharing the 2 cores): "
            f"{row.live_lines / row.live_s:,.0f} lines/s",
            f"over the whole run, job start included ({row.live_s:.1f} s; the controller's CPU "
            f"{row.live.cpu_s:.2f} s, peak RSS {row.live.peak_rss_mb:.0f} MB).",
            "",
            f"Latency from a rank's print to the stdout of `orch logs -f` ({len(f.delays)} timestamped "
            f"lines from {n * SLOTS}",
            "ranks, one every 20 ms each, all started once the controller was following; the hosts",
            f"share this machine's clock): median **{p50:.0f} ms**, p95 {p95:.0f} ms. Target: median < 200 ms.",
            "",
            f"Reproduce: `sudo .venv/bin/python bench/logs.py --lines {args.lines} --repeat {args.repeat}`",
        ]
    )


def scale_body(rows: list[LogsRow], args: argparse.Namespace) -> str:
    """The section of a run at many hosts: one row per host count."""
    drain = [
        "| hosts x ranks | lines (MB) | `orch logs` (s) | lines/s | its CPU (s) | its peak RSS (MB) "
        "| `ssh host cat`, all hosts (s) | ssh clients' CPU (s) | orch / raw ssh |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    drain += [
        f"| {r.hosts} x {SLOTS} | {r.lines:,} ({r.payload / 1e6:.0f}) | {r.orch_s:.2f} "
        f"| {r.lines / r.orch_s:,.0f} | {r.orch.cpu_s:.2f} | {r.orch.peak_rss_mb:.0f} "
        f"| {r.raw_s:.2f} | {r.raw.cpu_s:.2f} | {r.raw_s / r.orch_s:.0%} |"
        for r in rows
    ]
    live = [
        "| hosts x ranks | attached `orch submit`, live (lines/s) | whole run (s) | its CPU (s) "
        "| its peak RSS (MB) | CPU per MB of log (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    live += [
        f"| {r.hosts} x {SLOTS} | {r.live_lines / r.live_s:,.0f} | {r.live_s:.1f} "
        f"| {r.live.cpu_s:.2f} | {r.live.peak_rss_mb:.0f} "
        f"| {r.live.cpu_s / (r.payload / 1e6) * 1000:.1f} |"
        for r in rows
    ]
    follow = [
        "| hosts x ranks | lines timed | median (ms) | p95 (ms) "
        f"| CPU, {PROBE_S:.0f} s of timestamps (s) "
        + (f"| CPU, {args.idle:.0f} s idle (s) " if args.idle else "")
        + "| `orch logs -f` CPU, all of it (s) | its peak RSS (MB) | its threads | its open fds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if args.idle else ""),
    ]
    follow += [
        f"| {r.hosts} x {SLOTS} | {len(r.follow.delays):,} "
        f"| {statistics.median(r.follow.delays) * 1000:.0f} "
        f"| {r.follow.percentile(0.95) * 1000:.0f} | {r.follow.probe_cpu_s:.2f} "
        + (f"| {r.follow.idle_cpu_s:.2f} " if args.idle else "")
        + f"| {r.follow.usage.cpu_s:.2f} | {r.follow.usage.peak_rss_mb:.0f} "
        f"| {r.follow.threads} | {r.follow.fds} |"
        for r in rows
    ]
    for table in (drain, live, follow):
        print("\n".join(table))
    hosts = " and ".join(str(r.hosts) for r in rows)
    return "\n".join(
        [
            f"## Logs at {hosts} hosts: one controller, every host's streams",
            "",
            f"The measurements of the section above at {hosts} hosts x {SLOTS} ranks, "
            f"{args.lines:,} lines of 100 bytes per rank.",
            "Every host's writers, sshd and agent share this machine's 2 cores with the controller:",
            "the controller's CPU seconds and peak RSS (the `orch` process's own, from the kernel)",
            f"are what carries over to a real cluster. {machine()}.",
            "",
            f"The finished job's logs read back (median of {args.repeat}): `orch logs` with an empty",
            "local copy, against one `ssh host cat` per host, all at once.",
            "",
            *drain,
            "",
            "The same job streamed live by the attached `orch submit` (job start included):",
            "",
            *live,
            "",
            "`orch logs -f` following a running job: every rank prints a timestamp every 20 ms for",
            f"{PROBE_S:.0f} s, all starting at once once the controller follows"
            + (
                f" (after {args.idle:.0f} s of following the quiet job: heartbeats only)"
                if args.idle
                else ""
            )
            + "; latency from the print to the controller's stdout (the hosts share its clock).",
            "Target: median < 200 ms.",
            "",
            *follow,
            "",
            f"Reproduce: `sudo .venv/bin/python bench/logs.py --hosts {' '.join(map(str, args.hosts))} "
            f"--lines {args.lines} --repeat {args.repeat}"
            + (f" --idle {args.idle:.0f}" if args.idle else "")
            + "`",
        ]
    )


if __name__ == "__main__":
    main()
