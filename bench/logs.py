"""Log throughput and latency: orch's log path against raw `ssh host cat`.

4 hosts x 2 ranks each write N lines of 100 bytes as fast as they can. Then, side
by side in the same run, with the job's files finished on the hosts:

- orch:      `orch logs <id>` with an empty local copy: every byte comes from the
             hosts over orch's framed stream, is mirrored locally and printed with
             its `[host rN]` prefix;
- baseline:  one `ssh host 'cat <job dir>/logs/rank-*.log'` per host, in parallel.

Also: the attached `orch submit` streaming the same job live (lines/s as seen), and
the latency from a rank's print to the controller's stdout (8 ranks printing a
timestamp every 20 ms). Needs root. Usage: .venv/bin/python bench/logs.py [--lines N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ssh_argv
from bench.report import machine, median, write_section
from tests.cluster import Cluster, Controller, orch_command

PRINTER = Path(__file__).resolve().parent / "jobs" / "printer"
HOSTS, SLOTS = 4, 2


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int, int]:
    """Run a command; (seconds, stdout bytes, stdout lines)."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    size = lines = 0
    while chunk := proc.stdout.read(1 << 20):
        size += len(chunk)
        lines += chunk.count(b"\n")
    proc.wait()
    return time.monotonic() - started, size, lines


def raw_cat(cluster: Cluster, controller: Controller, job_id: str) -> tuple[float, int, int]:
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
        for h in cluster.hosts[:HOSTS]
    ]
    size = lines = 0
    for p in procs:
        assert p.stdout is not None
        while chunk := p.stdout.read(1 << 20):
            size += len(chunk)
            lines += chunk.count(b"\n")
        p.wait()
    return time.monotonic() - started, size, lines


def latency(controller: Controller, job: Path, inventory: Path) -> list[float]:
    proc = subprocess.Popen(
        [*orch_command(), "submit", str(job), "-i", str(inventory)],
        env=controller.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    delays = []
    following_since = None
    for line in proc.stdout:
        if "] lat " not in line:
            continue
        now, printed = time.time(), float(line.rsplit(" ", 1)[1])
        following_since = following_since or now
        # Lines printed before the controller was following every node are backlog
        # from the job's start, not the latency of the log path.
        if printed >= following_since + 0.5:
            delays.append(now - printed)
    proc.wait()
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=200_000, help="lines per rank")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with Cluster(HOSTS) as cluster:
        controller = cluster.new_controller()
        env = controller.env()
        inventory = cluster.write_inventory(
            controller.home / "inv.yaml", **{h.name: {"slots": SLOTS} for h in cluster.hosts}
        )
        flood = controller.home / "flood.yaml"
        flood.write_text(
            f"name: flood\nworkdir: {PRINTER}\nscript: printer.py\nnodes: {HOSTS}\n"
            f"args: [--lines, '{args.lines}']\n"
        )
        live_s, _, live_lines = timed(
            [*orch_command(), "submit", str(flood), "-i", str(inventory)], env
        )
        job_id = (
            subprocess.run(
                [*orch_command(), "status", "--json"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.split('"id": "')[1]
            .split('"')[0]
        )
        orch_runs, raw_runs = [], []
        for _ in range(args.repeat):
            shutil.rmtree(controller.state_dir / "logs" / job_id, ignore_errors=True)
            orch_runs.append(timed([*orch_command(), "logs", job_id], env))
            raw_runs.append(raw_cat(cluster, controller, job_id))
        probe = controller.home / "probe.yaml"
        probe.write_text(
            f"name: probe\nworkdir: {PRINTER}\nscript: printer.py\nnodes: {HOSTS}\n"
            "args: [--probe, '5']\n"
        )
        delays = latency(controller, probe, inventory)

    lines = HOSTS * SLOTS * args.lines
    payload = raw_runs[0][1]
    orch_s, raw_s = median([r[0] for r in orch_runs]), median([r[0] for r in raw_runs])
    assert all(r[2] >= lines for r in orch_runs), "orch logs lost lines"
    rows = [
        ("`orch logs` (from the hosts)", orch_s, lines / orch_s, payload / orch_s / 1e6),
        ("`ssh host cat` x4 in parallel", raw_s, lines / raw_s, payload / raw_s / 1e6),
    ]
    table = ["| path | seconds | lines/s | MB/s (payload) |", "|---|---:|---:|---:|"]
    table += [f"| {name} | {s:.2f} | {ls:,.0f} | {mb:.1f} |" for name, s, ls, mb in rows]
    ratio = raw_s / orch_s
    p50 = statistics.median(delays) * 1000
    p95 = sorted(delays)[int(len(delays) * 0.95)] * 1000
    for line in table:
        print(line)
    print(
        f"orch throughput {ratio:.0%} of raw ssh; live submit {live_lines / live_s:,.0f} lines/s; "
        f"latency median {p50:.0f} ms, p95 {p95:.0f} ms over {len(delays)} lines"
    )
    body = "\n".join(
        [
            "## Logs: throughput and latency",
            "",
            f"{HOSTS} hosts x {SLOTS} ranks, {args.lines:,} lines of 100 bytes per rank "
            f"({lines:,} lines, {payload / 1e6:.0f} MB). Both paths read the same finished files on",
            "the hosts, side by side in the same run (median of "
            f"{args.repeat}): orch's includes its framing, the local copy it writes and the",
            "per-line `[host rN]` prefixes; the baseline is raw `cat` over OpenSSH, one per host.",
            f"{machine()}. Target: at least 50% of raw ssh.",
            "",
            *table,
            "",
            f"orch reaches **{ratio:.0%}** of raw ssh throughput. Streaming the same job live with an",
            f"attached `orch submit` (writers and readers sharing the 2 cores): {live_lines / live_s:,.0f} lines/s",
            f"over the whole run, job start included ({live_s:.1f} s).",
            "",
            f"Latency from a rank's print to the controller's stdout ({len(delays)} timestamped lines from",
            "8 ranks, one every 20 ms each, printed once the controller was following; the hosts share",
            f"this machine's clock): median **{p50:.0f} ms**, p95 {p95:.0f} ms. Target: median < 200 ms.",
            "",
            f"Reproduce: `sudo .venv/bin/python bench/logs.py --lines {args.lines} --repeat {args.repeat}`",
        ]
    )
    write_section("logs", body)


if __name__ == "__main__":
    main()
