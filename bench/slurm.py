"""orch on a Slurm cluster against what a user does by hand, on the same cluster.

The cluster is tests/cluster/slurm.py's: a login node (slurmctld) and 3 compute nodes
(slurmd), one shared home. The same 3-node torchrun job (one rank per node) runs:

- through orch: `orch submit job.yaml -i hpc.yaml`, which pushes the code, writes the
  batch script, runs sbatch and streams the ranks' lines back over ssh;
- by hand: the wiki's batch script (`scontrol show hostnames`, NodeAddr, `srun
  --kill-on-bad-exit=1 torchrun ...`), code already on the shared home, `ssh login
  sbatch` and then `ssh login tail -F` of its output file.

Three figures, each the median of the runs:
1. submit -> first rank line: until a rank's `ready` line reaches this machine's stdout,
   in two parts: submit -> the first rank process running (its first statement prints
   the time), and a rank's line printed -> here (each line says when it was printed);
2. rank failure -> allocation gone: from the failing rank's own timestamp until squeue
   on the login node no longer lists the job as pending, running or completing;
3. Ctrl-C -> allocation gone: from the interrupt (orch: SIGINT to `orch submit`; by hand:
   Ctrl-C on `tail -F`, then `ssh login scancel ID`) until squeue has no allocation.

    sudo .venv/bin/python bench/slurm.py --repeat 3
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.common import ssh_argv
from bench.report import write_section
from tests.cluster import Cluster, SlurmCluster, orch_command, repo_python

WORKLOAD = """\
import time
print(f"born {time.time():.3f}", flush=True)
import os, sys
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = os.environ.get("ORCH_ATTEMPT", os.environ.get("ATTEMPT", "0"))
print(f"ready r{rank} attempt {attempt} {time.time():.3f}", flush=True)
if attempt != "0":
    sys.exit(0)
if os.environ.get("FAIL_RANK") == str(rank):
    time.sleep(1)
    print(f"failing at {time.time():.3f}", flush=True)
    sys.exit(3)
# Wait as a training loop does: a collective every 0.2 s (a lost peer fails it).
until = time.time() + float(os.environ.get("SLEEP", "0"))
while time.time() < until:
    dist.barrier()
    time.sleep(0.2)
dist.barrier()
"""

HAND_BATCH = """\
#!/bin/sh
#SBATCH --job-name=byhand
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --no-requeue
#SBATCH --output=byhand-%j.out
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$head" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
srun --kill-on-bad-exit=1 sh -c "cd $PWD && GLOO_SOCKET_IFNAME=eth0 {python} -m torch.distributed.run \\
    --nnodes {nodes} --nproc-per-node 1 --node-rank \\$SLURM_NODEID \\
    --master-addr $addr --master-port 29400 --local-addr \\$(hostname -I | cut -d' ' -f1) train.py"
"""


class Reader:
    """A process's stdout lines, read in a thread, each with when it came."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append((time.time(), line))

    def wait(self, pattern: str, timeout: float = 120) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for when, line in list(self.lines):
                if re.search(pattern, line):
                    return when, line
            time.sleep(0.01)
        raise RuntimeError(f"no line matching {pattern!r} within {timeout} s")


def allocation_gone(slurm: SlurmCluster, name: str, timeout: float = 120) -> float:
    """When squeue on the login node stopped listing a job named `name` as live."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(j["name"] == name for j in slurm.active_jobs()):
            return time.time()
        time.sleep(0.05)
    raise RuntimeError(f"job {name} still in squeue after {timeout} s")


SETTLE_S = 3.5  # before each first-line submit: longer than Slurm's batch_sched_delay


class Bench:
    def __init__(self, slurm: SlurmCluster, tmp: Path) -> None:
        self.slurm = slurm
        self.controller = slurm.new_controller()
        self.inventory = slurm.write_inventory(tmp / "hpc.yaml")
        work = tmp / "work"
        work.mkdir()
        (work / "train.py").write_text(WORKLOAD)
        self.work = work
        self.tmp = tmp
        # first_line's parts: (submit -> first rank running, rank line printed -> here)
        self.parts: dict[str, list[tuple[float, float]]] = {"orch": [], "hand": []}
        # The baseline's code and batch script, on the shared home (not timed).
        assert slurm.home is not None
        self.hand_dir = slurm.home / "byhand"
        self.hand_dir.mkdir()
        (self.hand_dir / "train.py").write_text(WORKLOAD)
        (self.hand_dir / "batch.sh").write_text(HAND_BATCH.format(python=repo_python(), nodes=3))
        (self.hand_dir / "restart.sh").write_text(HAND_BATCH.format(python=repo_python(), nodes=2))

    def ssh(self, command: str) -> list[str]:
        return ssh_argv(self.slurm.cluster, self.controller, self.slurm.login.address, command)

    # -- the two ways --------------------------------------------------------------

    def orch(
        self, env: dict[str, str], nodes: int = 3, restarts: int = 0
    ) -> tuple[subprocess.Popen[str], Reader, float, str]:
        name = f"orch{time.monotonic_ns() % 10**8}"
        job = self.tmp / f"{name}.yaml"
        spec = {"name": name, "workdir": str(self.work), "script": "train.py", "nodes": nodes}
        if restarts:
            spec["restarts"] = restarts
        job.write_text(yaml.safe_dump({**spec, "env": env}))
        started = time.time()
        proc = subprocess.Popen(
            [*orch_command(), "submit", str(job), "-i", str(self.inventory)],
            env=self.controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        return proc, Reader(proc), started, name

    def by_hand(
        self, env: dict[str, str], batch: str = "batch.sh"
    ) -> tuple[subprocess.Popen[str], Reader, float, str]:
        """sbatch over ssh, then tail -F of the output file over ssh: what users do."""
        proc, reader, started, slurm_id = self.hand_submit(env, batch)
        return proc, reader, started, slurm_id

    def hand_submit(
        self, env: dict[str, str], batch: str, exclude: str = ""
    ) -> tuple[subprocess.Popen[str], Reader, float, str]:
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        options = f"--exclude={exclude} " if exclude else ""
        started = time.time()
        submitted = subprocess.run(
            self.ssh(f"cd ~/byhand && {exports} sbatch --parsable {options}{batch}"),
            capture_output=True,
            text=True,
            check=True,
        )
        slurm_id = submitted.stdout.strip()
        tail = subprocess.Popen(
            self.ssh(f"cd ~/byhand && tail -n +1 -F byhand-{slurm_id}.out 2>/dev/null"),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        return tail, Reader(tail), started, slurm_id

    # -- the three figures -----------------------------------------------------------

    def settle(self) -> None:
        """An idle partition, as a first submit of the day meets it: no job left, and
        none for SETTLE_S. Slurm may hold a batch job submitted just after a scheduling
        pass (a job's end runs one) for the next, up to batch_sched_delay (3 s by
        default): measured, 0.25 to 0.6 s from sbatch to allocation, or 2.0 to 2.7 s,
        whichever way submitted, as the other way's job had just ended or not."""
        self.slurm.wait_for(lambda: not self.slurm.active_jobs(), "an idle partition", 120)
        time.sleep(SETTLE_S)

    def first_line(self, way: str) -> float:
        self.settle()
        start = self.orch if way == "orch" else self.by_hand
        proc, reader, started, ident = start({"SLEEP": "0"})
        when, line = reader.wait(r"ready r\d attempt \d [\d.]+")
        printed = float(line.split()[-1])
        self._finish(way, proc, ident)
        born = [float(t) for _, text in reader.lines for t in re.findall(r"born ([\d.]+)", text)]
        self.parts[way].append((min(born) - started, when - printed))
        return when - started

    def failure(self, way: str) -> float:
        start = self.orch if way == "orch" else self.by_hand
        proc, reader, _, ident = start({"FAIL_RANK": "2", "SLEEP": "60"})
        _, line = reader.wait(r"failing at [\d.]+")
        failed_at = float(line.rsplit(" ", 1)[1])
        gone = allocation_gone(self.slurm, ident if way == "orch" else "byhand")
        self._finish(way, proc, ident)
        return gone - failed_at

    def interrupt(self, way: str) -> float:
        start = self.orch if way == "orch" else self.by_hand
        proc, reader, _, ident = start({"SLEEP": "120"})
        reader.wait(r"ready r2")
        pressed = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        if way != "orch":  # Ctrl-C ends only the tail: the user cancels the job next
            subprocess.run(self.ssh(f"scancel {ident}"), check=True)
        gone = allocation_gone(self.slurm, ident if way == "orch" else "byhand")
        self._finish(way, proc, ident)
        return gone - pressed

    def restart(self, way: str) -> float:
        """A compute node's slurmd and job processes killed under a 2-node job on the
        3-node partition: from the kill until every rank of the second attempt printed
        its ready line (each line says when). By hand: the person watching `tail -F`
        reacts to the first error line at once: scancel, then sbatch again with
        --exclude of the node (what `scontrol show job` names), then tail -F again."""
        env = {"SLEEP": "600"}
        if way == "orch":
            proc, reader, _, ident = self.orch(env, nodes=2, restarts=1)
        else:
            proc, reader, _, ident = self.by_hand(env, batch="restart.sh")
        reader.wait(r"ready r1 attempt 0", timeout=180)
        name = ident if way == "orch" else "byhand"
        listed = [
            j["nodes"] for j in self.slurm.squeue() if j["name"] == name and j["state"] == "RUNNING"
        ]
        hosts = self.slurm.run_on_login(f"scontrol show hostnames {listed[0]}").stdout.split()
        victim = next(h for h in self.slurm.compute if h.name == hosts[1])
        killed = time.time()
        self.slurm.fail_node(victim)
        procs = [proc]
        try:
            if way == "orch":
                readers = [reader]
            else:
                reader.wait(r"error|Error|exited|Exited", timeout=300)
                subprocess.run(self.ssh(f"scancel {ident}"), check=True)
                again = self.hand_submit({"ATTEMPT": "1", **env}, "restart.sh", victim.name)
                readers = [again[1]]
                procs.append(again[0])
            times = []
            for rank in (0, 1):
                line = next_match(readers, rf"ready r{rank} attempt 1 [\d.]+", 300)
                times.append(float(line.rsplit(" ", 1)[1]))
        finally:
            subprocess.run(self.ssh("scancel --user=root"), check=False)
            allocation_gone(self.slurm, name)
            if way == "orch":
                proc.wait(timeout=120)
            else:
                for one in procs:
                    os.killpg(one.pid, signal.SIGTERM)
                    one.wait(timeout=30)
            self.slurm.revive_node(victim)
        return max(times) - killed

    def _finish(self, way: str, proc: subprocess.Popen[str], ident: str) -> None:
        if way == "orch":
            proc.wait(timeout=120)
        else:
            allocation_gone(self.slurm, "byhand")
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)


def next_match(readers: list[Reader], pattern: str, timeout: float) -> str:
    """The first line matching `pattern` in any of the readers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for reader in readers:
            for _, line in list(reader.lines):
                if re.search(pattern, line):
                    return line
        time.sleep(0.05)
    raise RuntimeError(f"no line matching {pattern!r} within {timeout} s")


def median_of(runs: int, measure: Callable[[str], float]) -> tuple[float, float]:
    """Median seconds of orch and by hand, alternating runs."""
    orch, hand = [], []
    for _ in range(runs):
        orch.append(measure("orch"))
        hand.append(measure("hand"))
    return statistics.median(orch), statistics.median(hand)


def median(values: list[float]) -> float:
    return statistics.median(values)


def ratio(orch: float, hand: float) -> str:
    return f"{orch / hand:.2f}x" if hand >= 0.05 else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--restarts", type=int, default=3, help="runs of the node-lost restart figure (0: none)"
    )
    args = parser.parse_args()
    with (
        Cluster(4) as cluster,
        SlurmCluster(cluster) as slurm,
        tempfile.TemporaryDirectory(prefix="orch-bench-slurm-") as tmp,
    ):
        bench = Bench(slurm, Path(tmp))
        rows = [
            ("submit -> first rank line", median_of(args.repeat, bench.first_line)),
            ("rank failure -> allocation gone", median_of(args.repeat, bench.failure)),
            ("Ctrl-C -> allocation gone", median_of(args.repeat, bench.interrupt)),
        ]
        if args.restarts:
            rows.append(
                (
                    "node lost -> every rank of attempt 2 running",
                    median_of(args.restarts, bench.restart),
                )
            )
        for i, part in enumerate(("submit -> a rank runs", "a rank's line -> here")):
            orch, hand = ([p[i] for p in bench.parts[way]] for way in ("orch", "hand"))
            rows.insert(1 + i, (f"  of which {part}", (median(orch), median(hand))))
    lines = [
        "| step | orch (s) | by hand (s) | ratio |",
        "|---|---:|---:|---:|",
        *(f"| {step} | {o:.2f} | {h:.2f} | {ratio(o, h)} |" for step, (o, h) in rows),
    ]
    print("\n".join(lines))
    if args.no_write:
        return
    body = f"""\
## Slurm: orch against sbatch + tail -f by hand

A 3-node torchrun job (one rank per node, gloo) on the Slurm test cluster
(tests/cluster/slurm.py: slurmctld on a login node, slurmd on 3 compute nodes, one
shared home), through `orch submit -i hpc.yaml` and by hand: the usual batch script
(`scontrol show hostnames`, NodeAddr, `srun --kill-on-bad-exit=1 torchrun ...`) with
the code already on the shared home, `ssh login sbatch`, then `ssh login tail -F` of
its output. orch's submit includes connecting, pushing the code, writing the batch
script and its launcher. Allocation gone: squeue on the login node no longer lists the
job (polled every 50 ms); by hand, Ctrl-C on `tail` is followed at once by `ssh login
scancel` (a lower bound for a person). By hand, the first line waits for `tail -F`, which
looks at its file once a second; orch's follow looks every 50 ms. Each first-line
submit, either way, meets an idle partition: no job for {SETTLE_S} s before it. Slurm
may hold a batch job submitted just after a scheduling pass until the next one (its
batch_sched_delay): measured, sbatch to allocation took 0.25 to 0.6 s, or 2.0 to 2.7 s
where the other way's job had just ended, which decided the ratio more than either way
did. Both failure and
Ctrl-C are Slurm's own work once it knows (kill-on-bad-exit, scancel, KillWait): orch
adds nothing there but its squeue polls.
Restart: a 2-node job with `restarts: 1` on the 3-node partition; one compute node's
slurmd and every job process on it SIGKILLed mid-job (the ranks run a barrier every
0.2 s), until every rank of the second attempt printed its ready line. orch: nothing
to do (each attempt queued the next with --dependency=afternotok; the batch script ends
the attempt once the surviving nodes recorded their end, without waiting for Slurm to
declare the node down, and leaves the node out with scontrol update ExcNodeList). By
hand: the person reacts to the first error line in `tail -F` at once with `ssh login
scancel` and `ssh login sbatch --exclude=NODE`, then `tail -F` again (a lower bound).
Median of {args.repeat} alternating runs ({args.restarts} for the restart); {platform.machine()}, {os.cpu_count()} cores,
Python {platform.python_version()}, Slurm 22.05 (KillWait=5).
Target: in each of three runs of five, every median within 1.1x of the hand-written
script (the restart has no target: it is measured).

{chr(10).join(lines)}

Reproduce: `sudo .venv/bin/python bench/slurm.py --repeat {args.repeat}`
"""
    write_section("slurm", body)


if __name__ == "__main__":
    main()
