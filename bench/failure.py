"""Failure teardown: from a rank's crash to the job's last process gone, everywhere.

For 2, 4 and 8 hosts (one rank each), the last rank SIGKILLs itself while every
other rank waits in `time.sleep` loops before a barrier (`workload.py --hang`):

- orch:      `orch submit job.yaml` tears the job down on every host;
- baseline:  bare torchrun started over parallel OpenSSH: the time until the
             survivors exit on their own, capped at 120 s (then they are killed).

The crash time is printed by the crashing rank; processes are found by their
environment tag in this machine's /proc, which sees every test host's processes.
It also measures `orch kill` at 8 hosts against parallel `ssh host pkill -f`.
Needs root. Usage: .venv/bin/python bench/failure.py [--hosts 2 4 8] [--cap 120]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from bench.common import place_file, ssh_argv, tagged_pids, wait_gone, wait_ranks_ready
from bench.report import machine, write_section
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


def orch_teardown(controller: Controller, job: Path, inventory: Path) -> float:
    proc = subprocess.Popen(
        [*orch_command(), "submit", str(job), "-i", str(inventory)],
        env=controller.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    job_id = proc.stdout.readline().split()[1]
    crashed = crash_time([proc])
    gone = wait_gone(f"ORCH_JOB_ID={job_id}".encode(), 60)
    proc.wait(timeout=60)
    if gone is None:
        raise RuntimeError("orch left processes behind")
    return gone - crashed


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
    job_id = subprocess.run(
        [*orch_command(), "submit", "-d", str(job), "-i", str(inventory)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    wait_ranks_ready(cluster, job_id, n)
    time.sleep(1)
    return job_id, f"ORCH_JOB_ID={job_id}".encode()


def kill_latency(
    cluster: Cluster, controller: Controller, job: Path, inventory: Path, n: int
) -> tuple[float, float]:
    """(orch kill wall time, parallel ssh pkill wall time) at n hosts."""
    env = controller.env()
    job_id, tag = running_job(cluster, env, job, inventory, n)
    started = time.monotonic()
    subprocess.run([*orch_command(), "kill", job_id], env=env, capture_output=True, check=True)
    orch_s = time.monotonic() - started
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
    return orch_s, ssh_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--cap", type=float, default=120.0)
    args = parser.parse_args()

    rows = []
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
            orch_s = orch_teardown(controller, job, inventory)
            port += 1
            base_s, capped = baseline_teardown(
                cluster, controller, n, port, " ".join(fail), args.cap
            )
            rows.append((n, orch_s, base_s, capped))
            print(
                f"{n} hosts: orch {orch_s:.2f} s, bare torchrun {'>=' if capped else ''}{base_s:.1f} s"
            )
        n = max(args.hosts)
        hang = controller.home / "hang.yaml"
        hang.write_text(
            f"name: hang\nworkdir: {WORKLOAD.parent}\nscript: workload.py\nnodes: {n}\nargs: [--hang]\n"
        )
        inventory = cluster.write_inventory(
            controller.home / "inv-kill.yaml", hosts=[h.name for h in cluster.hosts[:n]]
        )
        kill_s, pkill_s = kill_latency(cluster, controller, hang, inventory, n)
        print(f"orch kill at {n} hosts: {kill_s:.2f} s; parallel ssh pkill: {pkill_s:.2f} s")

    table = [
        "| hosts | orch: crash to last process gone (s) | bare torchrun over ssh (s) |",
        "|---:|---:|---:|",
    ]
    table += [
        f"| {n} | {o:.2f} | {'≥ ' if c else ''}{b:.1f}{' (capped: survivors still hung)' if c else ''} |"
        for n, o, b, c in rows
    ]
    body = "\n".join(
        [
            "## Failure teardown: a rank's crash to the job's last process gone",
            "",
            "One rank per host; the last rank SIGKILLs itself while the others wait before a",
            "barrier. orch's time runs from the crash (printed by the rank) until no process",
            "carrying the job's tag is left on any host. The baseline is bare torchrun started",
            f"over parallel ssh: the survivors' time until they exit on their own, capped at {args.cap:.0f} s.",
            f"{machine()}. Target: at most 2 s at 8 hosts.",
            "",
            *table,
            "",
            f"`orch kill` of a running job (every rank printed its first line) at {n} hosts: **{kill_s:.2f} s**",
            "wall time for the whole command (start, connect, TERM, give the ranks their grace, KILL torchrun",
            "once its ranks are gone, confirm every process and the port gone); parallel `ssh host pkill -9 -f`",
            f"(kills only the workers, leaves torchrun and confirms nothing): {pkill_s:.2f} s. Target: under 1.5 s.",
            "",
            f"Reproduce: `sudo .venv/bin/python bench/failure.py --hosts {' '.join(map(str, args.hosts))} --cap {args.cap:.0f}`",
        ]
    )
    write_section("failure", body)
    print("\n".join(table))


if __name__ == "__main__":
    main()
