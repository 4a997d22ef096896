"""Restarts and outputs, side by side with what they replace.

1. Restart: a 2-node job with `restarts: 1` and a spare host; node2 is crashed while
   the job runs. Timed: from the crash to every rank of the next attempt running (on
   node1 and the spare). Against, in the same run: the same crash with `restarts: 0`
   (to the job stopped everywhere: the teardown a user waits for before resubmitting)
   plus a fresh `orch submit` of the job to every rank running (the launch). Target:
   the restart at most teardown + launch.
2. Pull: 50 MB of outputs (200 files of random bytes) on node1; `orch pull` into an
   empty directory against `rsync -az` from the host, alternating which goes first.

Needs root (it starts the namespace test cluster) and rsync. Usage:

    .venv/bin/python bench/restart.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ssh_client
from bench.report import machine, median, write_section
from tests.cluster import Cluster, Controller, orch_command

JOB = r"""
import os, time, warnings
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch.distributed as dist
dist.init_process_group("gloo")
print("running attempt", os.environ["ORCH_ATTEMPT"], flush=True)
while True:
    dist.barrier()
    time.sleep(0.2)
"""
WRITER = r"""
import os, random, time
out = os.environ["ORCH_OUTPUT_DIR"]
rng = random.Random(5)
for i in range(200):
    with open(os.path.join(out, f"shard{i:03d}.bin"), "wb") as f:
        f.write(rng.randbytes(50 * 2**20 // 200))
print("written", flush=True)
time.sleep(600)
"""


class Submit:
    """An attached `orch submit`, its lines timestamped as they come."""

    def __init__(self, controller: Controller, job: Path, inventory: Path) -> None:
        self.proc = subprocess.Popen(
            [*orch_command(), "submit", str(job), "-i", str(inventory)],
            env=controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def when(self, text: str, count: int = 1, timeout: float = 120) -> float:
        """When the `count`-th line holding `text` came."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [t for t, line in self.lines if text in line]
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None and self.lines and len(found) < count:
                time.sleep(0.2)
                found = [t for t, line in self.lines if text in line]
                if len(found) >= count:
                    return found[count - 1]
                raise RuntimeError("".join(line for _, line in self.lines)[-2000:])
            time.sleep(0.02)
        raise RuntimeError(f"no {text!r} within {timeout} s")

    def ended(self, timeout: float = 120) -> float:
        self.proc.wait(timeout)
        return time.monotonic()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def write_job(where: Path, script: str, **keys: object) -> Path:
    work = where / "work"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(script)
    path = where / f"job-{time.monotonic_ns()}.yaml"
    path.write_text(
        yaml.safe_dump({"name": "bench", "workdir": str(work), "script": "job.py", **keys})
    )
    return path


def restart_round(
    cluster: Cluster, controller: Controller, tmp: Path, inventory: Path
) -> dict[str, float]:
    """One crash with restarts (timed to the next attempt running), one without (to
    the teardown's end), and a plain launch (to every rank running)."""
    keys = {"nodes": 2, "nproc_per_node": 1, "lost_after": 3}
    result = {}
    job = write_job(tmp, JOB, restarts=1, **keys)
    run = Submit(controller, job, inventory)
    run.when("running attempt 0", 2)
    crashed = time.monotonic()
    cluster.crash(2)
    result["restart"] = run.when("running attempt 1", 2) - crashed
    run.stop()
    subprocess.run([*orch_command(), "kill", "--all"], env=controller.env(), capture_output=True)
    cluster.ensure_healthy()

    job = write_job(tmp, JOB, restarts=0, **keys)
    run = Submit(controller, job, inventory)
    run.when("running attempt 0", 2)
    crashed = time.monotonic()
    cluster.crash(2)
    result["teardown"] = run.ended() - crashed
    cluster.ensure_healthy()

    started = time.monotonic()
    run = Submit(controller, job, inventory)
    result["launch"] = run.when("running attempt 0", 2) - started
    run.stop()
    subprocess.run([*orch_command(), "kill", "--all"], env=controller.env(), capture_output=True)
    return result


def detached_round(cluster: Cluster, controller: Controller, tmp: Path, inventory: Path) -> float:
    """The crash of `restart_round`, the job detached: timed from the crash to both
    ranks of attempt 2 running (their logs on the hosts), with no orch process on the
    controller; the job's keeper on node1 restarts it."""
    job = write_job(tmp, JOB, restarts=1, nodes=2, nproc_per_node=1, lost_after=3)
    submitted = subprocess.run(
        [*orch_command(), "submit", "-d", str(job), "-i", str(inventory)],
        env=controller.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = submitted.stdout.split()[1]

    def running(node: str, rank: int) -> Path:
        host = 3 if node.startswith("node3") else int(node[4])
        return cluster.home(host) / ".orch/jobs" / job_id / node / "logs" / f"rank-{rank}.log"

    def wait(paths: list[Path], text: str) -> float:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(p.exists() and text in p.read_text() for p in paths):
                return time.monotonic()
            time.sleep(0.02)
        raise RuntimeError(f"no {text!r} in {paths} within 120 s")

    wait([running("node1", 0), running("node2", 1)], "running attempt 0")
    crashed = time.monotonic()
    cluster.crash(2)
    ran = wait([running("node1.attempt1", 0), running("node3.attempt1", 1)], "attempt 1")
    subprocess.run([*orch_command(), "kill", job_id], env=controller.env(), capture_output=True)
    cluster.ensure_healthy()
    return ran - crashed


def pull_rounds(
    cluster: Cluster, controller: Controller, tmp: Path, inventory: Path, repeat: int
) -> tuple[list[float], list[float]]:
    job = write_job(tmp, WRITER, nodes=1)
    submitted = subprocess.run(
        [*orch_command(), "submit", "-d", str(job), "-i", str(inventory)],
        env=controller.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = submitted.stdout.split()[1]
    outputs = cluster.home(1) / ".orch" / "jobs" / job_id / "outputs"
    deadline = time.monotonic() + 120
    while len(list(outputs.glob("shard*.bin"))) < 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1)
    ssh = shlex.join(ssh_client(cluster, controller))
    remote = f"root@{cluster.host(1).address}:.orch/jobs/{job_id}/outputs/"
    orch_s, rsync_s = [], []
    for r in range(repeat):

        def by_orch(r: int = r) -> None:
            started = time.monotonic()
            subprocess.run(
                [*orch_command(), "pull", job_id, "--outputs-dir", str(tmp / f"orch{r}")],
                env=controller.env(),
                capture_output=True,
                check=True,
            )
            orch_s.append(time.monotonic() - started)

        def by_rsync(r: int = r) -> None:
            started = time.monotonic()
            subprocess.run(
                ["rsync", "-az", "-e", ssh, remote, str(tmp / f"rsync{r}")],
                capture_output=True,
                check=True,
            )
            rsync_s.append(time.monotonic() - started)

        for case in (by_orch, by_rsync) if r % 2 == 0 else (by_rsync, by_orch):
            case()
        print(f"pull: orch {orch_s[-1]:.2f} s, rsync {rsync_s[-1]:.2f} s", flush=True)
    subprocess.run([*orch_command(), "kill", job_id], env=controller.env(), capture_output=True)
    return orch_s, rsync_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-restart-") as tmp, Cluster(3) as cluster:
        controller = cluster.new_controller()
        inventory = cluster.write_inventory(Path(tmp) / "inventory.yaml")
        for r in range(args.repeat):
            work = Path(tmp) / f"r{r}"
            work.mkdir()
            rounds.append(restart_round(cluster, controller, work, inventory))
            rounds[-1]["detached"] = detached_round(cluster, controller, work, inventory)
            print({k: round(v, 2) for k, v in rounds[-1].items()}, flush=True)
        orch_s, rsync_s = pull_rounds(cluster, controller, Path(tmp), inventory, args.repeat)
    med = {k: median([r[k] for r in rounds]) for k in rounds[0]}
    pull_o, pull_r = median(orch_s), median(rsync_s)
    table = [
        "| case | seconds | against |",
        "|---|---:|---:|",
        f"| restart: node crash to every rank of attempt 2 running (spare host) | {med['restart']:.2f} "
        f"| {med['restart'] / (med['teardown'] + med['launch']):.2f}x teardown + launch |",
        f"| detached (orch submit -d): the same, restarted by the job's keeper on node1 | "
        f"{med['detached']:.2f} | {med['detached'] / (med['teardown'] + med['launch']):.2f}x teardown + launch |",
        f"| teardown: node crash to the job stopped everywhere (restarts: 0) | {med['teardown']:.2f} | |",
        f"| launch: orch submit to every rank running | {med['launch']:.2f} | |",
        f"| orch pull, 50 MB in 200 files, into an empty directory | {pull_o:.2f} | {pull_o / pull_r:.2f}x rsync |",
        f"| rsync -az from the host | {pull_r:.2f} | |",
    ]
    body = "\n".join(
        [
            "## Restarts and outputs",
            "",
            "A 2-node job (`nodes: 2` of 3 hosts, `lost_after: 3`) whose node2 is crashed (its sshd "
            "and every process of it killed) while every rank runs. With `restarts: 1`, orch stops the "
            "job and starts attempt 2 at once on node1 and the spare node3: timed from the crash to "
            "both ranks of attempt 2 printing. What a user does without it, timed in the same run: the "
            "same crash with `restarts: 0` until the job is stopped everywhere (teardown), then a new "
            "`orch submit` until both ranks print (launch). Then `orch pull` of 50 MB of outputs (200 "
            "files of random bytes) from node1 into an empty directory, against `rsync -az` of the "
            "same directory, alternating which goes first. Detached: the same crash of a job "
            "submitted with `orch submit -d`, timed from the crash to both ranks of attempt 2 "
            "writing to their logs on the hosts, with no orch process on the controller: the job's "
            "keeper on node1 restarts it.",
            "",
            f"Median of {args.repeat} runs; {machine()}. Target: the restart at most teardown + launch.",
            "",
            *table,
            "",
            f"Reproduce: `sudo .venv/bin/python bench/restart.py --repeat {args.repeat}`",
        ]
    )
    write_section("restart", body)
    print("\n".join(table))


if __name__ == "__main__":
    main()
