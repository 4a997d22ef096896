"""Waiting in line: many small jobs onto a few shared hosts.

20 one-node jobs of 2 processes that each hold their slots for 2 s, submitted at
once (`orch submit -d`, each its own process) onto 2 hosts with `slots: 4`, 10 per
host (a job names its host: orch does not pick the least busy one). At most two
jobs fit on a host at a time; the rest wait in the host's line and start there,
without their controller, as slots free.

Twice in the same run (and again, `--rounds`, alternating: the machine is noisy):
today's line (first come, first served: no policy file, every job `normal`) and the
fair line (a policy file on every host: `age 1`, `high root`, `limit * slots 4`,
so that every look reads and applies it; the jobs' priorities cycle low, normal,
high). Measured, against the ideal in the same run:
- makespan: from the submits' start to the last job's end, against the ideal
  (total slot-seconds / slots = 10 s), and from the first job's start to the last
  job's end (what the line itself costs, without the submits' own launch);
- slot free to next start: for every job that waited, from the end of the job
  whose slots it took (its `end` line) to its own `start` line (target: median
  under 1 s), for the jobs whose submit had returned (its ticket in line) by then;
  on a loaded machine some submits come later than the slots free, and are counted
  apart (`late`).

Needs root (it starts the namespace test cluster). Usage:

    .venv/bin/python bench/waiting_line.py [--jobs 20] [--seconds 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.report import machine, median, write_section
from tests.cluster import POLICY_FILE, REPO_ROOT, Cluster, Controller, OrchRunner, orch_command

HOSTS, SLOTS, NPROC = 2, 4, 2
# The fair line's policy: every rule in play, none that holds a job back here (a
# user's limit of the host's 4 slots; one level a minute, longer than a run).
POLICY = f"age 1\nhigh root\nlimit * slots {SLOTS}\n"
PRIORITIES = ("low", "normal", "high")
START = re.compile(r"start gpus=\S+ slots=(\S+) node=\S+ t=([\d.]+)")
END = re.compile(r"end t=([\d.]+)")


def orch(
    controller: Controller, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return OrchRunner(controller)(*args, timeout=timeout)


def set_policy(cluster: Cluster, text: str | None) -> None:
    """Every host's policy file (POLICY_FILE), or none."""
    folder = POLICY_FILE.rsplit("/", 1)[0]
    for i in range(1, HOSTS + 1):
        script = f"rm -rf {folder}"
        if text is not None:
            script += f" && install -d -m 755 {folder} && cat > {POLICY_FILE}"
        done = cluster.exec_on(i, ["sh", "-c", script], input=text or "")
        if done.returncode != 0:
            raise SystemExit(f"cannot write the policy on node{i}: {done.stderr}")


def run(cluster: Cluster, jobs: int, seconds: float, work: Path, fair: bool) -> dict[str, float]:
    controller = cluster.new_controller()
    inventory = cluster.write_inventory(work / "inv.yaml", defaults={"slots": SLOTS})
    set_policy(cluster, POLICY if fair else None)
    files = []
    for i in range(jobs):
        spec = {
            "name": f"q{i:02d}",
            "priority": PRIORITIES[i % len(PRIORITIES)] if fair else "normal",
            "workdir": str(REPO_ROOT / "tests" / "fake_gpu"),
            "script": "hold.py",
            "launcher": "python",
            "args": [str(seconds)],
            "nproc_per_node": NPROC,
            "hosts": [f"node{1 + i % HOSTS}"],
        }
        path = work / f"{'fair' if fair else 'fifo'}-q{i:02d}.yaml"
        path.write_text(yaml.safe_dump(spec))
        files.append(path)
    began = time.time()
    procs = [
        subprocess.Popen(
            [*orch_command(), "submit", "-d", str(f), "-i", str(inventory)],
            env=controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in files
    ]
    # When each submit returned: its node's ticket was in its host's line by then.
    returned: dict[int, float] = {}
    while len(returned) < len(procs):
        for i, proc in enumerate(procs):
            if i not in returned and proc.poll() is not None:
                returned[i] = time.time()
        if time.time() - began > 300:
            raise SystemExit("the submits did not return within 300 s")
        time.sleep(0.05)
    ids = []
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise SystemExit(f"submit failed: {err}")
        ids.append(out.split()[1])
    runs: dict[str, list[tuple[float, float, str, float]]] = {}
    for i, (job_id, path) in enumerate(zip(ids, files, strict=True)):
        followed = orch(controller, "logs", job_id, "-f", timeout=300)
        start, end = START.search(followed.stdout), END.search(followed.stdout)
        if not (start and end):
            raise SystemExit(f"{job_id}: no start/end line: {followed.stdout}{followed.stderr}")
        host = yaml.safe_load(path.read_text())["hosts"][0]
        span = (float(start.group(2)), float(end.group(1)), start.group(1), returned[i])
        runs.setdefault(host, []).append(span)
    gaps, late = [], 0
    for spans in runs.values():
        for began_at, _, slots, queued_at in spans:
            # The job that held these slots last before this one: its end freed them.
            before = [e for _, e, held, _ in spans if held == slots and e <= began_at]
            if not before:
                continue
            if queued_at > max(before):  # its submit came after the slots were free
                late += 1
                continue
            gaps.append(began_at - max(before))
    starts = [s for spans in runs.values() for s, _, _, _ in spans]
    ends = [e for spans in runs.values() for _, e, _, _ in spans]
    ideal = jobs * NPROC * seconds / (HOSTS * SLOTS)
    return {
        "makespan": max(ends) - began,
        "line": max(ends) - min(starts),
        "ideal": ideal,
        "gap_median": median(gaps) if gaps else float("nan"),
        "gap_max": max(gaps) if gaps else float("nan"),
        "waited": len(gaps),
        "late": late,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with Cluster(HOSTS) as cluster, tempfile.TemporaryDirectory(prefix="orch-bench-q-") as tmp:
        for r in range(args.rounds):
            for fair in (False, True) if r % 2 == 0 else (True, False):  # neither always first
                work = Path(tmp) / f"{r}-{int(fair)}"
                work.mkdir()
                results[fair].append(run(cluster, args.jobs, args.seconds, work, fair))
                print(json.dumps({"fair": fair, **results[fair][-1]}), flush=True)
        set_policy(cluster, None)

    def mid(fair: bool, key: str) -> float:
        return median([r[key] for r in results[fair]])

    fifo_gap, fair_gap = mid(False, "gap_median"), mid(True, "gap_median")
    command = [
        "bench/waiting_line.py",
        *("--jobs", str(args.jobs), "--seconds", str(args.seconds), "--rounds", str(args.rounds)),
    ]
    rows = [
        ("makespan, from the submits' start", "makespan", "s", f"{mid(False, 'ideal'):.1f} s"),
        ("makespan, first job's start to last end", "line", "s", f"{mid(False, 'ideal'):.1f} s"),
        ("slot free to next start, median", "gap_median", "s", "target < 1 s"),
        ("slot free to next start, worst", "gap_max", "s", ""),
    ]
    table = "\n".join(
        f"| {label} | {mid(False, key):.2f} {unit} | {mid(True, key):.2f} {unit} | {ideal} |"
        for label, key, unit, ideal in rows
    )
    body = f"""## Waiting in line: {args.jobs} one-node jobs onto {HOSTS} hosts with {SLOTS} slots

`{" ".join(command)}` on {machine()}.
{args.jobs} jobs of {NPROC} processes holding their slots {args.seconds:g} s each, submitted at
once with `orch submit -d` ({args.jobs // HOSTS} per host); two fit on a host at a time, the
others wait in the host's line and start there without their controller. Each round
runs today's line (first come, first served: no policy file, every job `normal`)
and the fair line, in turn first (a policy file on every host, `{POLICY.strip().replace(chr(10), "; ")}`,
read at every look; the jobs' priorities cycle low, normal, high); medians of
{args.rounds} rounds.

| measure | first come, first served | fair line | ideal |
|---|---|---|---|
{table}

Slot free to next start under the fair line: {fair_gap / fifo_gap:.2f} times first come,
first served's ({fair_gap:.2f} s against {fifo_gap:.2f} s: the median of each round's
median; {sum(int(r["waited"]) for r in results[False])} and {sum(int(r["waited"]) for r in results[True])} waits in all, and
{sum(int(r["late"]) for r in results[False])} and {sum(int(r["late"]) for r in results[True])} jobs whose submit came after their slots were free, left out). Other sessions shared this machine's cores: the
makespans vary from round to round by more than the two lines differ.
The first figure includes every submit's own launch (20 `orch` processes connecting,
checking and pushing at once on this machine's {machine().split(", ")[1]}); the gap is a
waiting supervisor's poll (0.1 s), its look under the host's lock (and, in the fair
line, its read of the policy file), and the job's start.
"""
    write_section("queue", body)


if __name__ == "__main__":
    main()
