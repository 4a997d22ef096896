"""Soak: many jobs, each with a random fault, on 8 shared hosts; every one must end right.

Jobs of 2 or 3 nodes (one rank each, `tests/integration/jobs/workload/workload.py`)
run several at once on an 8-host test cluster whose hosts have `slots: 1`, so that
every job leases its hosts. Each gets one fault, drawn with `--seed`:

- none:             runs to its end                     -> succeeded, exit 0
- rank-crash:       a rank raises, exits or SIGKILLs itself -> failed, exit 1
- host-crash:       one of its hosts crashed (PID 1 killed) -> failed or lost, exit 1 or 3
- partition:        one of its hosts cut off; healed after the submit gave up, then
                    `orch status` stops what ran on behind it -> failed or lost, exit 1 or 3
- controller-kill:  the attached `orch submit` SIGKILLed while the ranks print
                    -> still running, then `orch logs -f` follows it to succeeded, exit 0
- ctrl-c:           SIGINT to the attached submit -> killed, exit 130
- orch-kill:        detached job, `orch kill` -> killed
- second-user:      a second controller (another user's laptop: its own state and
                    job records; the same login on the hosts) holds the same hosts'
                    slots with a detached job; this job waits in line, then both succeed

After each job ends (and its fault is undone: host rebooted, partition healed) the
soak checks, from this machine: the final `orch status --json` state (and the exit
code); every numbered line `r<RANK> <i>` once and in order, in what the user saw (the
attached submit's output, or `orch logs -f`) and in `orch logs`; no process of the job
left on any host (its `ORCH_JOB_ID` tag); its rendezvous port not listening on the
master; no lease or ticket file of it left in its hosts' lease directory. At the end,
with every job ended: nothing but sshd and orch's warm interpreters (no job's: each
waits for the next submit, and ends after its idle time) runs on any host, and every
lease directory is empty.

Jobs start at a steady pace (`--jobs` over `--minutes`) whenever enough hosts are
free and fewer than `--parallel` run. Needs root. Usage:

    .venv/bin/python bench/soak.py [--jobs 100] [--minutes 15] [--seed 1] [--parallel 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import tagged_pids, wait_ranks_ready
from bench.report import machine, write_section
from tests.cluster import REPO_ROOT, Cluster, ClusterError, Controller, OrchRunner, orch_command

WORKLOAD_DIR = REPO_ROOT / "tests" / "integration" / "jobs" / "workload"
HOSTS = 8
LINES = 30
LEASE_DIR = "/run/lock/orch-leases"
FAULTS = (
    "none",
    "rank-crash",
    "host-crash",
    "partition",
    "controller-kill",
    "ctrl-c",
    "orch-kill",
    "second-user",
)
STARTED: list[Attached] = []  # every attached submit: none may outlive the soak
HOLDER = "(second user's job)"  # the row of the jobs the second controller ran
CHECKS = ("state", "seen", "logs", "processes", "port", "leases")
EXPECTED = {
    "none": "succeeded, exit 0",
    "rank-crash": "failed, exit 1",
    "host-crash": "failed or lost, exit 1 or 3",
    "partition": "failed or lost, exit 1 or 3",
    "controller-kill": "running after the kill, then succeeded (logs -f exit 0)",
    "ctrl-c": "killed, exit 130",
    "orch-kill": "killed (orch kill exit 0)",
    "second-user": "waited in line (`queued:`) behind a second controller's detached job "
    "on the same hosts, started after it ended, then succeeded, exit 0",
    HOLDER: "succeeded (logs -f exit 0)",
}

# Run inside a host: is the port listening, and which lease or ticket files name the job.
WARM_SERVE = " warm serve "  # a warm interpreter's command line (agent/node/warm/serve.py)
PROBE = r"""
import json, os, sys
job, port = sys.argv[1], int(sys.argv[2])
listening = False
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        rows = open(table).read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        cols = row.split()
        if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
            listening = True
found, others = [], []
root = sys.argv[3]
for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    if not name.endswith(".json"):
        continue
    try:
        record = json.load(open(os.path.join(root, name)))
    except (OSError, ValueError):
        others.append(name)
        continue
    (found if record.get("job") == job else others).append(name)
print(json.dumps({"listening": listening, "leases": found, "others": others}))
"""


@dataclass
class Result:
    """One job of the soak: what it should end as, and each check's outcome (None: not
    applicable)."""

    index: int
    fault: str
    hosts: list[str]
    job_id: str = "?"
    got: str = ""
    checks: dict[str, bool | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0  # from its submit to its checks' end
    submits: list[Attached] = field(default_factory=list)  # to stop should the soak fail

    def check(self, name: str, ok: bool, why: str = "") -> None:
        self.checks[name] = ok and self.checks.get(name, True) is not False
        if not ok:
            self.notes.append(f"{name}: {why}")

    @property
    def ok(self) -> bool:
        return all(v is not False for v in self.checks.values()) and bool(self.checks)


class Attached:
    """An attached `orch submit` in a session of its own, its output read as it comes."""

    def __init__(self, controller: Controller, job: Path, inventory: Path, result: Result) -> None:
        result.submits.append(self)
        STARTED.append(self)
        self.proc = subprocess.Popen(
            [*orch_command(), "submit", str(job), "-i", str(inventory)],
            env=controller.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(s, d), daemon=True)
            for s, d in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                time.sleep(0.5)
                if condition():
                    return
                raise RuntimeError(
                    f"submit exited {self.proc.returncode} before {what}: {self.stderr[-1500:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout:.0f} s: {self.stderr[-1500:]}")
            time.sleep(0.1)

    def job_id(self) -> str:
        self.wait_for(lambda: bool(self.out), "job id")
        first = self.out[0].split()
        if len(first) < 2 or first[0] != "job":
            raise RuntimeError(f"first line {self.out[0]!r}")
        return first[1]

    def wait_ready(self, ranks: dict[int, str]) -> None:
        want = {f"[{host} r{rank}] ready r{rank}" for rank, host in ranks.items()}
        self.wait_for(lambda: want <= {line.rstrip("\n") for line in self.out}, "every rank ready")

    def wait(self, timeout: float = 300) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise RuntimeError(f"submit still running after {timeout:.0f} s") from None
        for reader in self._readers:
            reader.join(30)
        return code

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)


def orch(
    controller: Controller, *args: str, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return OrchRunner(controller)(*args, timeout=timeout)


def status(controller: Controller, job_id: str) -> dict[str, Any]:
    shown = orch(controller, "status", job_id, "--json")
    if shown.returncode != 0:
        raise RuntimeError(f"orch status {job_id} exited {shown.returncode}: {shown.stderr}")
    record: dict[str, Any] = json.loads(shown.stdout)[0]
    return record


def lines_problem(text: str, ranks: dict[int, str], count: int) -> str | None:
    """Why the numbered lines of some rank are not each there once, in order; or None."""
    for rank, host in ranks.items():
        prefix = f"[{host} r{rank}] r{rank} "
        numbers = [
            int(line[len(prefix) :].split()[0])
            for line in text.splitlines()
            if line.startswith(prefix)
        ]
        if numbers != list(range(count)):
            gap = next((i for i, n in enumerate(numbers) if n != i), len(numbers))
            return f"rank {rank} ({host}): {len(numbers)} of {count} lines, first off at {gap}"
    return None


class Soak:
    """The cluster, the two controllers, the free hosts, and every job's result."""

    def __init__(self, cluster: Cluster, work: Path, seed: int) -> None:
        self.cluster = cluster
        self.work = work
        self.seed = seed
        self.hosts_rng = random.Random(seed)  # the scheduler's: which free hosts
        self.local = threading.local()  # each job's own draws: `rng`
        self.users = {"a": cluster.new_controller(), "b": cluster.new_controller()}
        self.inventories = {
            user: cluster.write_inventory(work / f"inv-{user}.yaml", defaults={"slots": 1})
            for user in self.users
        }
        self.faults = threading.Lock()  # one fault (or its undoing) on the cluster at a time
        self.results: list[Result] = []
        self.results_lock = threading.Lock()

    # -- a job -----------------------------------------------------------------------

    def job_file(self, name: str, hosts: list[str], args: list[str], **keys: Any) -> Path:
        spec = {
            "name": name,
            "workdir": str(WORKLOAD_DIR),
            "script": "workload.py",
            "hosts": hosts,
            "nproc_per_node": 1,
            "args": args,
            **keys,
        }
        path = self.work / f"{name}-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    def finish(self, result: Result, user: str, seen: str | None, ranks: dict[int, str]) -> None:
        """The checks every job gets once it ended and its fault is undone."""
        controller = self.users[user]
        record = status(controller, result.job_id)
        if seen is not None:
            problem = lines_problem(seen, ranks, LINES)
            result.check("seen", problem is None, problem or "")
        logs = orch(controller, "logs", result.job_id)
        problem = lines_problem(logs.stdout, ranks, LINES)
        result.check("logs", logs.returncode == 0 and problem is None, problem or logs.stderr)
        tag = f"ORCH_JOB_ID={result.job_id}".encode()
        deadline = time.monotonic() + 15
        while tagged_pids(tag) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = tagged_pids(tag)
        result.check("processes", not left, f"{len(left)} processes left: pids {left}")
        port = int(record.get("master_port") or 0)
        master = record["nodes"][0]["host"] if record.get("nodes") else result.hosts[0]
        for host in result.hosts:
            probe = self.cluster.exec_on(
                host, [sys.executable, "-I", "-S", "-c", PROBE, result.job_id, str(port), LEASE_DIR]
            )
            if probe.returncode != 0:
                result.check("leases", False, f"probe on {host} failed: {probe.stderr[-300:]}")
                continue
            found = json.loads(probe.stdout)
            result.check("leases", not found["leases"], f"{host}: {found['leases']}")
            if host == master and port:
                result.check("port", not found["listening"], f"{port} still listening on {host}")

    @staticmethod
    def expect(result: Result, ok: bool, got: str) -> None:
        """The job ended as its fault should leave it (`ok`); `got` says how it ended."""
        result.got = got
        result.check("state", ok, f"got {got}")

    def run_job(self, index: int, fault: str, hosts: list[str]) -> None:
        result = Result(index, fault, hosts)
        self.local.rng = random.Random(f"{self.seed}-{index}")
        began = time.monotonic()
        ranks = dict(enumerate(hosts))
        try:
            getattr(self, "fault_" + fault.replace("-", "_"))(result, ranks)
        except Exception as error:  # the soak goes on; the job counts as bad
            result.check("state", False, f"error: {error}")
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            for sub in result.submits:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(sub.proc.pid, signal.SIGKILL)
            if result.job_id != "?":  # nothing of it may run on
                orch(self.users["a"], "kill", result.job_id)
        result.seconds = time.monotonic() - began
        with self.results_lock:
            self.results.append(result)
        mark = "ok " if result.ok else "BAD"
        print(
            f"{mark} #{index:03d} {fault:<16} {result.job_id:<28} {','.join(hosts):<20} "
            f"{result.seconds:5.1f} s "
            f"{result.got}" + (f"  [{'; '.join(result.notes)}]" if result.notes else ""),
            flush=True,
        )

    def rng(self) -> random.Random:
        rng: random.Random = self.local.rng
        return rng

    def lines_args(self, *more: str) -> list[str]:
        return ["--lines", str(LINES), "--interval", "0.01", *more]

    # -- the faults ----------------------------------------------------------------------

    def fault_none(self, result: Result, ranks: dict[int, str]) -> None:
        job = self.job_file("soak-none", result.hosts, self.lines_args())
        sub = Attached(self.users["a"], job, self.inventories["a"], result)
        result.job_id = sub.job_id()
        code = sub.wait()
        state = status(self.users["a"], result.job_id)["state"]
        self.expect(result, (code, state) == (0, "succeeded"), f"exit {code}, {state}")
        self.finish(result, "a", sub.stdout, ranks)

    def fault_rank_crash(self, result: Result, ranks: dict[int, str]) -> None:
        rank = self.rng().randrange(len(ranks))
        how = self.rng().choice(["raise", "exit", "sigkill"])
        after = f"{self.rng().uniform(0, 2):.1f}"
        args = self.lines_args("--fail-rank", str(rank), "--fail-how", how, "--fail-after", after)
        job = self.job_file("soak-crash", result.hosts, [*args, "--hang"])
        sub = Attached(self.users["a"], job, self.inventories["a"], result)
        result.job_id = sub.job_id()
        code = sub.wait()
        state = status(self.users["a"], result.job_id)["state"]
        got = f"exit {code}, {state} (rank {rank} {how})"
        self.expect(result, (code, state) == (1, "failed"), got)
        self.finish(result, "a", sub.stdout, ranks)

    def host_fault(self, result: Result, ranks: dict[int, str], partition: bool) -> None:
        victim = self.cluster.host(self.rng().choice(result.hosts)).index
        job = self.job_file(
            "soak-part" if partition else "soak-hostcrash",
            result.hosts,
            self.lines_args("--hang"),
            lost_after=3,
        )
        sub = Attached(self.users["a"], job, self.inventories["a"], result)
        result.job_id = sub.job_id()
        sub.wait_ready(ranks)
        with self.faults:
            (self.cluster.partition if partition else self.cluster.crash)(victim)
        try:
            code = sub.wait()
        finally:
            with self.faults:  # this host only: another job's fault may be under way
                (self.cluster.heal if partition else self.cluster.restart)(victim)
        stopped = ""
        if partition:  # what ran on behind the partition: the next status stops it
            shown = orch(self.users["a"], "status", result.job_id)
            stopped = (
                " (status stopped it)"
                if "stopped the job on" in shown.stdout + shown.stderr
                else ""
            )
        state = status(self.users["a"], result.job_id)["state"]
        got = f"exit {code}, {state} ({'partitioned' if partition else 'crashed'} node{victim}){stopped}"
        self.expect(result, code in (1, 3) and state in ("failed", "lost"), got)
        self.finish(result, "a", sub.stdout, ranks)

    def fault_host_crash(self, result: Result, ranks: dict[int, str]) -> None:
        self.host_fault(result, ranks, partition=False)

    def fault_partition(self, result: Result, ranks: dict[int, str]) -> None:
        self.host_fault(result, ranks, partition=True)

    def fault_controller_kill(self, result: Result, ranks: dict[int, str]) -> None:
        args = ["--lines", str(LINES), "--interval", "0.15"]
        job = self.job_file("soak-ctlkill", result.hosts, args)
        sub = Attached(self.users["a"], job, self.inventories["a"], result)
        result.job_id = sub.job_id()
        prefix = f"[{ranks[0]} r0] r0 "
        sub.wait_for(lambda: any(line.startswith(prefix) for line in sub.out), "a first line")
        time.sleep(self.rng().uniform(0, 1.5))
        os.killpg(sub.proc.pid, signal.SIGKILL)
        sub.wait()
        after = status(self.users["a"], result.job_id)["state"]
        followed = orch(self.users["a"], "logs", result.job_id, "-f", timeout=300)
        state = status(self.users["a"], result.job_id)["state"]
        got = f"{after} after SIGKILL, logs -f exit {followed.returncode}, {state}"
        ok = (after, followed.returncode, state) == ("running", 0, "succeeded")
        self.expect(result, ok, got)
        self.finish(result, "a", followed.stdout, ranks)

    def fault_ctrl_c(self, result: Result, ranks: dict[int, str]) -> None:
        job = self.job_file("soak-ctrlc", result.hosts, self.lines_args("--hang"))
        sub = Attached(self.users["a"], job, self.inventories["a"], result)
        result.job_id = sub.job_id()
        sub.wait_ready(ranks)
        time.sleep(self.rng().uniform(0, 1))
        os.killpg(sub.proc.pid, signal.SIGINT)
        code = sub.wait()
        state = status(self.users["a"], result.job_id)["state"]
        self.expect(result, (code, state) == (130, "killed"), f"exit {code}, {state}")
        self.finish(result, "a", sub.stdout, ranks)

    def fault_orch_kill(self, result: Result, ranks: dict[int, str]) -> None:
        job = self.job_file("soak-kill", result.hosts, self.lines_args("--hang"))
        submitted = orch(
            self.users["a"], "submit", "-d", str(job), "-i", str(self.inventories["a"])
        )
        if submitted.returncode != 0:
            raise RuntimeError(f"submit -d exited {submitted.returncode}: {submitted.stderr}")
        result.job_id = submitted.stdout.split()[1]
        wait_ranks_ready(self.cluster, result.job_id, len(ranks), timeout=240)
        time.sleep(self.rng().uniform(0, 1))
        killed = orch(self.users["a"], "kill", result.job_id)
        state = status(self.users["a"], result.job_id)["state"]
        got = f"orch kill exit {killed.returncode}, {state}"
        self.expect(result, (killed.returncode, state) == (0, "killed"), got)
        self.finish(result, "a", None, ranks)

    def fault_second_user(self, result: Result, ranks: dict[int, str]) -> None:
        holder = Result(result.index, HOLDER, result.hosts)
        hold_s = f"{self.rng().uniform(2, 6):.1f}"
        job = self.job_file("soak-other", result.hosts, self.lines_args("--sleep", hold_s))
        submitted = orch(
            self.users["b"], "submit", "-d", str(job), "-i", str(self.inventories["b"])
        )
        if submitted.returncode != 0:
            raise RuntimeError(
                f"second user's submit -d exited {submitted.returncode}: {submitted.stderr}"
            )
        holder.job_id = submitted.stdout.split()[1]
        try:
            wait_ranks_ready(self.cluster, holder.job_id, len(ranks), timeout=240)
            job = self.job_file("soak-waits", result.hosts, self.lines_args())
            sub = Attached(self.users["a"], job, self.inventories["a"], result)
            result.job_id = sub.job_id()
            followed = orch(self.users["b"], "logs", holder.job_id, "-f", timeout=300)
            held = status(self.users["b"], holder.job_id)
            holder.got = f"logs -f exit {followed.returncode}, {held['state']}"
            holder.check(
                "state", (followed.returncode, held["state"]) == (0, "succeeded"), holder.got
            )
            self.finish(holder, "b", followed.stdout, ranks)
            code = sub.wait()
            record = status(self.users["a"], result.job_id)
            queued = "queued:" in sub.stderr
            freed = self.ended_on_hosts(holder)  # the holder's last node's end
            after = freed is not None and (record.get("started") or 0) >= freed
            got = f"exit {code}, {record['state']}, {'queued' if queued else 'NOT queued'}"
            got += (
                f", started {record['started'] - freed:.1f} s after the holder ended"
                if freed is not None and record.get("started")
                else " (no start or holder end time)"
            )
            if freed is not None and held.get("ended"):
                holder.got += f" (recorded {held['ended'] - freed:.1f} s after it ended)"
            ok = (code, record["state"]) == (0, "succeeded") and queued and after
            self.expect(result, ok, got)
            self.finish(result, "a", sub.stdout, ranks)
        finally:
            if not holder.checks:
                holder.check("state", False, "never followed")
                orch(self.users["b"], "kill", holder.job_id)
            with self.results_lock:
                self.results.append(holder)

    def ended_on_hosts(self, result: Result) -> float | None:
        """When the last node of a job ended, on its hosts' clocks (this machine's): the
        time each node's supervisor wrote in its exit record. `orch status` records the
        time the controller learnt it, which may be later."""
        ends = []
        for host in result.hosts:
            exit_record = (
                self.cluster.home(host) / ".orch" / "jobs" / result.job_id / host / "exit.json"
            )
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                ends.append(float(json.loads(exit_record.read_text())["ended"]))
        return max(ends) if len(ends) == len(result.hosts) else None

    # -- the run -------------------------------------------------------------------------

    def sweep(self) -> tuple[list[str], dict[str, int]]:
        """With every job ended: anything but sshd and warm interpreters running on a
        host, any lease file; and how many warm interpreters each host keeps."""
        found = []
        warm: dict[str, int] = {}
        for host in self.cluster.hosts:
            probe = self.cluster.exec_on(
                host.index, [sys.executable, "-I", "-S", "-c", PROBE, "-", "0", LEASE_DIR]
            )
            leases = json.loads(probe.stdout)["others"] if probe.returncode == 0 else ["?"]
            if leases:
                found.append(f"{host.name}: lease files {leases}")
            processes = [
                cmd
                for pid, cmd in self.cluster.host_pids(host.index)
                if pid != 1 and not cmd.lstrip("[").startswith("sshd")
            ]
            warm[host.name] = sum(WARM_SERVE in f" {cmd} " for cmd in processes)
            others = [cmd[:200] for cmd in processes if WARM_SERVE not in f" {cmd} "]
            if others:
                found.append(f"{host.name}: processes {others}")
        return found, warm


def kept(warm: dict[str, int]) -> str:
    """What the hosts keep for the next submit: the warm interpreters (no job's)."""
    hosts = [name for name, count in warm.items() if count]
    if not hosts:
        return "No warm interpreter left."
    return (
        f"Kept for the next submit: orch's warm interpreters, {sum(warm.values())} on {len(hosts)} of {len(warm)} hosts "
        "(no job's processes: each waits for the next submit and ends after 600 s unused)."
    )


def table(results: list[Result]) -> list[str]:
    rows = [
        "| fault | jobs | ended as expected | lines seen once | `orch logs` once "
        "| no process left | port free | no lease left | all good |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(group: list[Result], check: str) -> str:
        counted = [r.checks.get(check) for r in group]
        good = sum(1 for c in counted if c is True)
        bad = sum(1 for c in counted if c is False)
        if good + bad == 0:
            return "-"
        return f"{good}" + (f" (**{bad} bad**)" if bad else "")

    for fault in (*FAULTS, HOLDER):
        group = [r for r in results if r.fault == fault]
        if not group:
            continue
        good = sum(r.ok for r in group)
        cells = [cell(group, c) for c in CHECKS]
        rows.append(
            f"| {fault} | {len(group)} | {' | '.join(cells)} | {good}"
            + (f" (**{len(group) - good} bad**)" if good < len(group) else "")
            + " |"
        )
    good = sum(r.ok for r in results)
    cells = [cell(results, c) for c in CHECKS]
    rows.append(f"| **all** | {len(results)} | {' | '.join(cells)} | {good} |")
    return rows


def summary(results: list[Result], faults: Counter[str], parallel: int, minutes: float) -> str:
    """How the jobs with a host fault ended, the waiting jobs' start after the second
    controller's job, and what a job took."""
    host_faults = Counter(
        r.got.split(" (")[0] for r in results if r.fault in ("host-crash", "partition")
    )
    stopped = sum("(status stopped it)" in r.got for r in results if r.fault == "partition")
    lags = [
        float(r.got.split("started ")[1].split(" s")[0])
        for r in results
        if r.fault == "second-user" and "s after the holder ended" in r.got
    ]
    seconds = sorted(r.seconds for r in results if r.fault != HOLDER)
    return (
        "How they ended: host faults "
        + ", ".join(f"{n} {how}" for how, n in host_faults.most_common())
        + f"; {stopped} of {faults['partition']} partitioned nodes, still running when the "
        "submit gave up, were stopped by the next `orch status` after the heal"
        + (
            f"; the waiting jobs started {min(lags):.1f} to {max(lags):.1f} s after the "
            "second controller's job ended on its hosts"
            if lags
            else ""
        )
        + f". A job took {seconds[len(seconds) // 2]:.0f} s (median; at most "
        f"{seconds[-1]:.0f} s) from its submit to the end of its checks, with up to "
        f"{parallel} at once on the machine's shared cores: the {minutes:g}-minute "
        "pace is a floor, not what the run took."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=3, help="jobs running at once, at most")
    parser.add_argument("--no-write", action="store_true", help="leave docs/BENCHMARKS.md alone")
    args = parser.parse_args()

    plan_rng = random.Random(args.seed)
    plans = [(plan_rng.choice(FAULTS), plan_rng.choice((2, 3))) for _ in range(args.jobs)]
    pace = args.minutes * 60 / args.jobs
    with tempfile.TemporaryDirectory(prefix="orch-soak-") as tmp, Cluster(HOSTS) as cluster:
        soak = Soak(cluster, Path(tmp), args.seed)
        names = [h.name for h in cluster.hosts]
        free = set(names)
        running: list[threading.Thread] = []
        changed = threading.Condition()

        def one(index: int, fault: str, hosts: list[str]) -> None:
            try:
                soak.run_job(index, fault, hosts)
            finally:
                with changed:
                    free.update(hosts)
                    changed.notify_all()

        try:
            began = time.monotonic()
            for index, (fault, nodes) in enumerate(plans):
                time.sleep(max(0.0, began + index * pace - time.monotonic()))
                with changed:
                    changed.wait_for(
                        lambda n=nodes: (
                            len(free) >= n and sum(t.is_alive() for t in running) < args.parallel
                        )
                    )
                    hosts = sorted(soak.hosts_rng.sample(sorted(free), nodes), key=names.index)
                    free.difference_update(hosts)
                thread = threading.Thread(target=one, args=(index, fault, hosts), daemon=True)
                running.append(thread)
                thread.start()
            for thread in running:
                thread.join()
        finally:  # also when the soak is interrupted: no submit may outlive the cluster
            for sub in STARTED:
                if sub.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(sub.proc.pid, signal.SIGKILL)
        wall = time.monotonic() - began
        with soak.faults:
            cluster.ensure_healthy()
        leftovers, warm = soak.sweep()
        results = sorted(soak.results, key=lambda r: (r.index, r.fault == HOLDER))

    rows = table(results)
    bad = [r for r in results if not r.ok]
    print("\n".join(rows))
    print(f"{len(results)} jobs in {wall / 60:.1f} min; {len(bad)} ended wrong")
    for r in bad:
        print(f"  #{r.index} {r.fault} {r.job_id} on {','.join(r.hosts)}: {r.got}; {r.notes}")
    print("after the soak:", ("; ".join(leftovers) or "nothing left on any host") + ";", kept(warm))
    if args.no_write:
        return
    faults = Counter(fault for fault, _ in plans)
    bad_lines = [
        f"- #{r.index} {r.fault} on {', '.join(r.hosts)} (`{r.job_id}`): {r.got}; "
        + "; ".join(r.notes)
        for r in bad
    ]
    expected = [f"- {fault}: {EXPECTED[fault]}" for fault in (*FAULTS, HOLDER)]
    seen = [summary(results, faults, args.parallel, args.minutes), ""]
    body = "\n".join(
        [
            f"## Soak: {args.jobs} jobs with a random fault each on {HOSTS} shared hosts",
            "",
            f"{args.jobs} jobs of 2 or 3 nodes (one rank each, `workload.py` printing {LINES} "
            f"numbered lines a rank), started over {args.minutes:g} minutes, at most "
            f"{args.parallel} at once, on {HOSTS} hosts with `slots: 1` (every job leases "
            "its hosts), each with one fault drawn with the seed ("
            + ", ".join(f"{fault} {faults[fault]}" for fault in FAULTS)
            + "). What each should end as:",
            "",
            *expected,
            "",
            "After each job ended and its fault was undone: its `orch status --json` state "
            "(and exit code); every numbered line once and in order in what the user saw (the "
            "attached submit's output, or `orch logs -f`) and in `orch logs`; no process with "
            "its `ORCH_JOB_ID` on any host; its rendezvous port not listening on the master; "
            "no lease or ticket file of it in its hosts' lease directory. "
            f"It took {wall / 60:.1f} min; {machine()}.",
            "",
            *rows,
            "",
            *seen,
            f"{len(bad)} of {len(results)} jobs ended wrong" + (":" if bad else "."),
            *bad_lines,
            "",
            "After the last job, on every host: "
            + ("; ".join(leftovers) if leftovers else "no job's process, no lease file.")
            + " "
            + kept(warm),
            "",
            f"Reproduce: `sudo .venv/bin/python bench/soak.py --jobs {args.jobs} "
            f"--minutes {args.minutes:g} --seed {args.seed} --parallel {args.parallel}`",
        ]
    )
    write_section("soak", body)


if __name__ == "__main__":
    try:
        main()
    except ClusterError as error:
        raise SystemExit(f"cluster: {error}") from error
