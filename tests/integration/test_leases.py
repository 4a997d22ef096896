"""Sharing hosts: jobs lease GPUs or slots on the real test cluster, wait in line
while they are held, and get them back however the holder ended. GPUs come from a
fake nvidia-smi (tests/fake_gpu) put on a host's PATH; jobs are python processes
that sleep, no torch (launcher: python)."""

from __future__ import annotations

import contextlib
import json
import re
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.leases import policy
from tests.cluster import REPO_ROOT, Cluster, OrchRunner
from tests.support import (
    controller_processes,
    job_id_of,
    status_json,
    wait_for,
    write_workdir_job,
)

pytestmark = pytest.mark.cluster

FAKE_GPU = REPO_ROOT / "tests" / "fake_gpu"
LEASES = "/run/lock/orch-leases"
START = re.compile(r"start gpus=(\S+) slots=(\S+) node=\S+ t=([\d.]+)")
END = re.compile(r"end t=([\d.]+)")


def hold_job(tmp_path: Path, name: str, seconds: float | Path, **keys: Any) -> Path:
    """A job whose node prints the GPUs and slots it got, sleeps (or waits for the
    file `seconds` names), prints its end."""
    return write_workdir_job(
        tmp_path, FAKE_GPU, "hold.py", name=name, launcher="python", args=[str(seconds)], **keys
    )


class Run:
    """What one node of a hold job printed: its units and when it held them."""

    def __init__(self, logs: str) -> None:
        start, end = START.search(logs), END.search(logs)
        assert start and end, logs
        self.gpus, self.slots = start.group(1), start.group(2)
        self.start, self.end = float(start.group(3)), float(end.group(1))


def finished(orch: OrchRunner, job_id: str) -> Run:
    """Follow a job to its end (it must succeed) and read what its node printed."""
    followed = orch("logs", job_id, "-f", timeout=60)
    assert followed.returncode == 0, followed.stderr
    return Run(followed.stdout)


def submit_together(orch: OrchRunner, *args_lists: list[Any]) -> list[tuple[int, str, str]]:
    """Start every `orch ARGS` at once; each one's exit code, stdout and stderr."""
    procs = [orch.popen(*args) for args in args_lists]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        results.append((proc.returncode, out, err))
    return results


def host_units(orch: OrchRunner, inventory: Path) -> list[dict[str, Any]]:
    shown = orch("status", "--hosts", "--json", "-i", inventory, timeout=30)
    assert shown.returncode == 0, shown.stderr
    units: list[dict[str, Any]] = json.loads(shown.stdout)["units"]
    return units


@contextlib.contextmanager
def fake_gpus(cluster: Cluster, i: int) -> Iterator[Path]:
    """A fake nvidia-smi with 4 GPUs first on host i's PATH (an overlay on its
    /usr/local/bin, in its own mount namespace); yields the file of processes
    orch did not start (`GPU PID` lines), as this machine sees it."""
    mounted = cluster.exec_on(
        i,
        [
            "mount",
            "-t",
            "overlay",
            "orch-fake-gpu",
            "-o",
            f"lowerdir={FAKE_GPU}:/usr/local/bin",
            "/usr/local/bin",
        ],
    )
    assert mounted.returncode == 0, mounted.stderr
    cluster.exec_on(i, ["mkdir", "-p", "/run/fake-gpu"])
    try:
        seen = cluster.exec_on(i, ["sh", "-c", "nvidia-smi --query-gpu=index,uuid --format=csv"])
        assert seen.stdout.count("GPU-fake-") == 4, seen
        yield Path(f"/proc/{cluster.host(i).init_pid}/root/run/fake-gpu/apps")
    finally:
        cluster.exec_on(i, ["umount", "/usr/local/bin"])
        cluster.exec_on(i, ["rm", "-rf", "/run/fake-gpu"])


def test_four_slots_run_two_jobs_of_two_side_by_side_the_third_waits_its_turn_a_killed_one_leaves(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[2], node2={"slots": 4})
    releases = [tmp_path / f"release{i}" for i in range(2)]  # each holds until its file exists
    jobs = [hold_job(tmp_path, f"slots{i}", releases[i], nproc_per_node=2) for i in range(2)]
    results = submit_together(orch, *[["submit", "-d", job, "-i", inventory] for job in jobs])
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert not [err for _, _, err in results if "queued" in err]
    ids = [job_id_of(out) for _, out, _ in results]
    third = orch("submit", "-d", hold_job(tmp_path, "third", 1, nproc_per_node=2), "-i", inventory)
    assert third.returncode == 0, third.stderr
    assert re.search(
        r"queued: 2 slots on node2 held by slots\d-\w+ \(root\) since [\d:]+, slots\d-\w+ "
        r"\(root\) since [\d:]+; 1st in line",
        third.stderr,
    ), third.stderr

    refused = orch(
        "submit", "--no-wait", hold_job(tmp_path, "nowait", 1, nproc_per_node=2), "-i", inventory
    )
    assert refused.returncode == 3, refused.stderr
    assert "error: not started: 2 slots on node2 held by" in refused.stderr
    assert "hint: leave out --no-wait" in refused.stderr
    late = orch("submit", "-d", hold_job(tmp_path, "late", 1, nproc_per_node=2), "-i", inventory)
    assert late.returncode == 0 and "2nd in line" in late.stderr, late.stderr
    listed = orch("status", timeout=60, env={"COLUMNS": "200"})
    assert "queued, 1st in line on node2" in listed.stdout, listed.stdout
    assert "queued, 2nd in line on node2" in listed.stdout, listed.stdout
    assert status_json(orch, job_id_of(late.stdout))["queued"] == "queued, 2nd in line on node2"
    assert orch("kill", job_id_of(late.stdout), timeout=60).returncode == 0
    line = json.loads(orch("status", "--hosts", "--json", "-i", inventory).stdout)["queue"]
    assert [row["job"] for row in line] == [job_id_of(third.stdout)]  # the killed one left
    assert status_json(orch, job_id_of(late.stdout))["state"] == "killed"

    releases[0].touch()
    first = finished(orch, ids[0])
    waited = finished(orch, job_id_of(third.stdout))
    releases[1].touch()
    second = finished(orch, ids[1])
    assert abs(first.start - second.start) < 2  # side by side
    assert set(first.slots.split(",")).isdisjoint(second.slots.split(","))
    assert first.end <= waited.start < first.end + 2  # its turn, and soon
    assert waited.slots == first.slots


def test_gpus_are_leased_disjoint_and_busy_ones_outside_orch_are_named(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1], node1={"gpus": 4})
    with fake_gpus(cluster, 1) as foreign:
        jobs = [hold_job(tmp_path, f"gpu{i}", 3, gpus_per_node=2) for i in range(3)]
        results = submit_together(orch, *[["submit", "-d", job, "-i", inventory] for job in jobs])
        assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
        # Which two ran first depends on the order the submits reached the host (and
        # one may wait a moment behind another's older ticket): judge by when each ran.
        *ran, waited = sorted(
            (finished(orch, job_id_of(out)) for _, out, _ in results), key=lambda r: r.start
        )
        assert sorted(ran[0].gpus.split(",") + ran[1].gpus.split(",")) == ["0", "1", "2", "3"]
        freed = min(ran, key=lambda r: r.end)
        assert freed.end <= waited.start < freed.end + 2  # the third waited for a free pair
        assert len(waited.gpus.split(",")) == 2

        foreign.write_text("0 1\n1 1\n2 1\n")  # pid 1 (the host's sshd, root) on GPUs 0-2
        refused = orch(
            "submit",
            "--no-wait",
            hold_job(tmp_path, "two", 1, gpus_per_node=2),
            "-i",
            inventory,
            timeout=60,
        )
        assert refused.returncode == 3, refused.stderr
        assert "in use outside orch by GPU 0 on node1: pid 1 (root)" in refused.stderr
        units = {u["unit"]: u for u in host_units(orch, inventory)}
        assert (units[0]["state"], units[0]["pid"], units[0]["user"]) == ("busy", 1, "root")
        assert units[3]["state"] == "free"

        one = orch(
            "submit", hold_job(tmp_path, "one", 0.5, gpus_per_node=1), "-i", inventory, timeout=60
        )
        assert one.returncode == 0, one.stderr
        assert "gpus=3 " in one.stdout
        assert (
            "warning: GPU 0 is in use by pid 1 (user root), which orch did not start" in one.stderr
        )


def test_a_sigkilled_supervisors_gpus_come_back_once_its_job_is_gone(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1], node1={"gpus": 4})
    with fake_gpus(cluster, 1):
        started = orch(
            "submit",
            "-d",
            hold_job(tmp_path, "victim", 60, gpus_per_node=4),
            "-i",
            inventory,
            timeout=60,
        )
        assert started.returncode == 0, started.stderr
        job_id = job_id_of(started.stdout)
        pids = json.loads((cluster.home(1) / ".orch/jobs" / job_id / "node1/pid.json").read_text())
        try:
            assert {u["state"] for u in host_units(orch, inventory)} == {"held"}
            cluster.exec_on(1, ["kill", "-9", str(pids["supervisor"])])
            # Its job still runs on those GPUs: they stay held, by pid and start time.
            assert {u["job"] for u in host_units(orch, inventory)} == {job_id}
            cluster.exec_on(1, ["kill", "-9", str(pids["pid"])])
            wait_for(
                lambda: {u["state"] for u in host_units(orch, inventory)} == {"free"},
                10,
                "the dead holder's GPUs to be free",
            )
        finally:
            orch("kill", job_id, timeout=60)


def test_two_jobs_of_two_nodes_wanting_one_host_both_finish_one_after_the_other(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", defaults={"slots": 2})
    left = hold_job(tmp_path, "left", 2, hosts=["node1", "node2"], nproc_per_node=2)
    right = hold_job(tmp_path, "right", 2, hosts=["node2", "node3"], nproc_per_node=2)
    results = submit_together(
        orch, ["submit", left, "-i", inventory], ["submit", right, "-i", inventory]
    )
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    waited = [err for _, _, err in results if "queued: 2 slots on node2" in err]
    assert len(waited) == 1, [err for _, _, err in results]
    spans = []
    for _, out, _ in results:
        starts = [float(m.group(3)) for m in START.finditer(out)]
        ends = [float(m.group(1)) for m in END.finditer(out)]
        assert len(starts) == len(ends) == 2, out  # both nodes ran: all or nothing
        assert max(starts) - min(starts) < 1.5  # and together
        spans.append((min(starts), max(ends)))
    spans.sort()
    assert spans[0][1] <= spans[1][0]  # never both on node2 at once


def test_a_detached_job_of_two_nodes_waits_in_line_without_its_submit_and_starts_in_its_turn(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    """The submit of a queued job of several nodes returns at once; the job's keeper
    takes the leases of all its nodes together when its turn comes; orch kill takes a
    queued one out of the line."""
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1, 2], defaults={"slots": 2})
    release = tmp_path / "release"
    two = {"hosts": ["node1", "node2"], "nproc_per_node": 2}
    holder = orch("submit", "-d", hold_job(tmp_path, "holder", release, **two), "-i", inventory)
    assert holder.returncode == 0 and "queued" not in holder.stderr, holder.stderr
    waiter = orch("submit", "-d", hold_job(tmp_path, "waiter", 1, **two), "-i", inventory)
    assert waiter.returncode == 0, waiter.stderr
    assert re.search(
        r"queued: 2 slots on node1, node2 held by holder-\w+ \(root\) since [\d:]+; 1st in "
        r"line; its nodes start together when its turn comes, by a keeper on its hosts",
        waiter.stderr,
    ), waiter.stderr
    waiter_id = job_id_of(waiter.stdout)
    assert controller_processes(orch) == []  # the submit left nothing behind here
    assert (
        status_json(orch, waiter_id)["queued"]
        == "queued, 1st in line on node1, 1st in line on node2"
    )
    refused = orch("submit", "--no-wait", hold_job(tmp_path, "nowait", 1, **two), "-i", inventory)
    assert refused.returncode == 3, refused.stderr
    assert "error: not started: 2 slots on node1, node2 held by holder-" in refused.stderr
    late = orch("submit", "-d", hold_job(tmp_path, "late", 1, **two), "-i", inventory)
    assert late.returncode == 0 and "2nd in line" in late.stderr, late.stderr
    assert orch("kill", job_id_of(late.stdout), timeout=60).returncode == 0
    line = json.loads(orch("status", "--hosts", "--json", "-i", inventory).stdout)["queue"]
    assert {row["job"] for row in line} == {waiter_id}  # on both hosts, the killed one left
    assert status_json(orch, job_id_of(late.stdout))["state"] == "killed"

    release.touch()  # from here on no orch command acts for the waiter: its keeper starts it
    holder_run = finished(orch, job_id_of(holder.stdout))
    wait_for(lambda: status_json(orch, waiter_id)["state"] != "pending", 30, "the waiter to start")
    followed = orch("logs", waiter_id, "-f", timeout=60)
    assert followed.returncode == 0, followed.stderr
    starts = [float(m.group(3)) for m in START.finditer(followed.stdout)]
    assert len(starts) == 2 and max(starts) - min(starts) < 1.5, followed.stdout  # together
    assert min(starts) >= holder_run.end
    assert status_json(orch, waiter_id)["state"] == "succeeded"


def test_a_detached_restart_on_shared_hosts_leases_its_slots_as_the_first_attempt_did(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    """Attempt 0 fails on both nodes; the keeper's attempt 1 runs with slots leased
    on both hosts, held by the job while it runs (not beside whoever holds them)."""
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1, 2], defaults={"slots": 2})
    release = tmp_path / "release"
    job = write_workdir_job(
        tmp_path,
        FAKE_GPU,
        "hold.py",
        name="again",
        launcher="python",
        args=[str(release), "--fail-first"],
        hosts=["node1", "node2"],
        nproc_per_node=2,
        restarts=1,
    )
    done = orch("submit", "-d", job, "-i", inventory, timeout=90)
    assert done.returncode == 0, done.stderr
    job_id = job_id_of(done.stdout)

    def second_runs() -> bool:
        record = status_json(orch, job_id)
        return bool(record["spec"].get("attempt") == 1 and record["state"] == "running")

    wait_for(second_runs, 120, "attempt 2 to run")  # a failure, a keeper's round, a start
    held = [u for u in host_units(orch, inventory) if u["state"] == "held"]
    assert sorted((u["host"], u["job"]) for u in held) == [
        (h, job_id) for h in ("node1", "node1", "node2", "node2")
    ]
    release.touch()
    wait_for(lambda: status_json(orch, job_id)["state"] == "succeeded", 60, "the job to succeed")
    logs = orch("logs", job_id, timeout=60).stdout
    assert len(START.findall(logs)) == 4, logs  # two attempts of two nodes
    assert [m.group(2) for m in START.finditer(logs)][2:] == ["0,1", "0,1"], logs


TWO_USERS = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.kernel.requests import StartRequest
from orchestrator.agent.leases import holder, storage
os.chdir(sys.argv[2])
read_fd, write_fd = os.pipe()
req = {"kind": "slot", "pool": [0, 1, 2, 3], "count": 2, "ticket": [time.time(), sys.argv[3]],
       "job": sys.argv[3]}
turn = holder.wait_turn(parse_message(StartRequest, {"argv": [], "env": {}, "lease": req}), write_fd)
root = storage.lease_dir()
others = [n for n in os.listdir(root) if n.startswith("L-") and not n.startswith(f"L-{os.getuid()}-")]
tried = {}
for name in others:
    for what, act in (("remove", lambda p: os.unlink(p)), ("write", lambda p: open(p, "a"))):
        try:
            act(os.path.join(root, name))
            tried[what] = "done"
        except PermissionError:
            tried[what] = "refused"
print(json.dumps({"units": turn.units, "others": others, "tried": tried}), flush=True)
time.sleep(float(sys.argv[4]))
holder.release(turn)
"""


def test_two_unix_users_share_the_leases_and_cannot_touch_each_others(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Users 4001 and 4002 (no login needed: setpriv) on node3 take slots from one
    lease directory: each gets their own, sees the other's, can neither remove nor
    change it, and the files say no more than who holds what."""
    python = "/usr/bin/python3"
    script = "/run/orch-two-users.py"
    cluster.exec_on(3, ["sh", "-c", f"cat > {script}"], input=TWO_USERS)
    for uid in (4001, 4002):
        cluster.exec_on(3, ["install", "-d", "-o", str(uid), "-m", "700", f"/run/orch-u{uid}"])

    def as_user(uid: int, job: str, hold: float) -> subprocess.Popen[str]:
        argv = [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            python,
            "-I",
            script,
            str(REPO_ROOT),
            f"/run/orch-u{uid}",
            job,
            str(hold),
        ]
        host = cluster.host(3)
        return subprocess.Popen(
            ["nsenter", "-t", str(host.init_pid), "-n", "-p", "-m", "-u", "--", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )

    try:
        first = as_user(4001, "alice-job", 4)
        assert first.stdout is not None
        said_first = json.loads(first.stdout.readline())
        second = as_user(4002, "bob-job", 0)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 0, err
        said_second = json.loads(out)
        assert said_first["units"] == [0, 1] and said_second["units"] == [2, 3]
        assert said_second["others"] and said_second["tried"] == {
            "remove": "refused",
            "write": "refused",
        }
        listing = cluster.exec_on(3, ["sh", "-c", f"stat -c '%a %u %n' {LEASES} {LEASES}/L-*"])
        lines = listing.stdout.split("\n")
        assert lines[0].startswith("1777 ")
        assert any(line.startswith("644 4001 ") for line in lines)
        lease_text = cluster.exec_on(3, ["sh", "-c", f"cat {LEASES}/L-4001-*"]).stdout
        assert set(json.loads(lease_text)) <= {
            "kind",
            "count",
            "job",
            "ticket",
            "user",
            "uid",
            "holder",
            "boot",
            "host",
            "pool",
            "since",
            "units",
            "priority",
            "several",
        }
        first.communicate(timeout=30)
        assert (
            cluster.exec_on(3, ["sh", "-c", f"ls {LEASES} | grep -c '^L-' || true"]).stdout.strip()
            == "0"
        )
    finally:
        cluster.exec_on(3, ["rm", "-rf", script, "/run/orch-u4001", "/run/orch-u4002"])


# ---------------------------------------------------------------- a hostile co-tenant

HOSTILE = r"""
import fcntl, json, os, sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.agent.host import proc
from orchestrator.agent.leases import storage
root = storage.open_dir(storage.lease_dir())
me = [os.getpid(), proc.start_time(os.getpid())]
evil = "\x1b]0;pwned\x07evil\x1b[8m\r\nstarted: yours"
base = {"kind": "slot", "count": 1, "job": evil, "ticket": [time.time(), "x"], "user": "bob\x1b[2J",
        "uid": os.getuid(), "holder": me, "boot": proc.boot_id(), "host": storage.HOST,
        "pool": [0, 1, 2, 3], "since": time.time(), "units": [0]}
def put(name, record):
    with open(os.path.join(root, name), "w") as f:
        f.write(record if isinstance(record, str) else json.dumps(record))
os.symlink("/dev/zero", os.path.join(root, "L-zero.json"))
os.mkfifo(os.path.join(root, "L-fifo.json"))
put("L-types.json", {**base, "units": ["zz"], "since": "x"})
put("L-huge.json", {**base, "units": [1], "since": 1e300})
put("L-nan.json", '{"units": [1], "since": NaN}')
put("L-forged.json", {**base, "uid": int(sys.argv[2]), "units": [1, 2, 3]})
put("L-evil.json", base)  # a live lease of slot 0, its job and user meant for a terminal
lock = os.open(os.path.join(root, ".lock"), os.O_CREAT | os.O_WRONLY, 0)
os.fchmod(lock, 0)
print("planted", flush=True)
line = sys.stdin.readline()
if line.startswith("ticket"):  # jump the line: a ticket that claims the epoch
    put("T-front.json", {**base, "ticket": [0, "a"], "count": 4, "job": "front"})
    print("ticket", flush=True)
    line = sys.stdin.readline()
if line.startswith("lock"):
    fd = os.open(root, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    line = sys.stdin.readline()
"""

VICTIM = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.kernel.requests import StartRequest
from orchestrator.agent.leases import holder
os.chdir(sys.argv[2])
read_fd, write_fd = os.pipe()
req = {"kind": "slot", "pool": [0, 1, 2, 3], "count": int(sys.argv[3]),
       "ticket": [time.time(), "alice-job"], "job": "alice-job"}
started = time.monotonic()
turn = holder.wait_turn(parse_message(StartRequest, {"argv": [], "env": {}, "lease": req}), write_fd)
if turn is not None and not turn.reported:
    os.close(write_fd)
said = os.read(read_fd, 65536)
print(json.dumps({"units": turn.units if turn else None, "said": json.loads(said or b"{}"),
                  "seconds": time.monotonic() - started,
                  "warnings": turn.warnings if turn else []}), flush=True)
if turn is not None:
    sys.stdin.readline()
    holder.release(turn)
"""

ALICE, BOB = 4011, 4012


def end_user_scripts(cluster: Cluster, i: int) -> None:
    """End, by their pid in host i, the scripts `as_user_on` started there: killing
    its Popen kills nsenter, which forked them into the host's namespace."""
    scripts = [str(pid) for pid, cmd in cluster.host_pids(i) if " /run/orch-40" in f" {cmd}"]
    if scripts:
        cluster.exec_on(i, ["kill", "-9", *scripts])


def as_user_on(
    cluster: Cluster, i: int, uid: int, script: str, *args: str
) -> subprocess.Popen[str]:
    """`script` run by /usr/bin/python3 as `uid` (no login: setpriv) inside host i."""
    path = f"/run/orch-{uid}.py"
    cluster.exec_on(i, ["sh", "-c", f"cat > {path}"], input=script)
    cluster.exec_on(i, ["install", "-d", "-o", str(uid), "-m", "700", f"/run/orch-u{uid}"])
    argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3"]
    return subprocess.Popen(
        [
            "nsenter",
            "-t",
            str(cluster.host(i).init_pid),
            "-n",
            "-p",
            "-m",
            "-u",
            "--",
            *argv,
            "-I",
            path,
            str(REPO_ROOT),
            *args,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )


def said(process: subprocess.Popen[str], within: float = 60.0) -> str:
    """The next line `process` prints; fails when none comes `within` seconds."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], within)
    assert ready, f"nothing said within {within:g} s"
    return process.stdout.readline()


def tell(process: subprocess.Popen[str], line: str) -> None:
    assert process.stdin is not None
    process.stdin.write(line + "\n")
    process.stdin.flush()


def test_another_users_hostile_files_give_the_next_users_job_a_correct_start_or_a_clear_error(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    """Bob (uid 4012) makes the lease directory of node3 his own and plants in it a
    link to /dev/zero, a FIFO, records of the wrong types and sizes, one claiming
    Alice's uid, a live lease whose job and user carry escape sequences, and a
    000 .lock; then a ticket that claims the epoch; then he holds the lock. Alice
    (uid 4011) gets the right slots within seconds each time, then a clear error
    naming Bob's process; `orch status --hosts` and `orch check` work and warn."""
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[3], node3={"slots": 4})
    cluster.exec_on(3, ["rm", "-rf", LEASES])
    bob = as_user_on(cluster, 3, BOB, HOSTILE, str(ALICE))
    alice: list[subprocess.Popen[str]] = []
    try:
        assert said(bob) == "planted\n", bob.stderr.read() if bob.stderr else ""
        first = as_user_on(cluster, 3, ALICE, VICTIM, f"/run/orch-u{ALICE}", "2")
        alice.append(first)
        start = json.loads(said(first))
        assert start["units"] == [1, 2], start  # slot 0 is Bob's live lease; the rest ignored
        assert start["seconds"] < 3
        warned = "\n".join(start["warnings"])
        assert f"the lease directory {LEASES} belongs to {BOB}, not root" in warned
        for name, why in [
            ("L-zero.json", "a symbolic link"),
            ("L-fifo.json", "not a regular file"),
            ("L-types.json", "since is not a time"),  # and units ["zz"]
            ("L-huge.json", "since is not a time"),
            ("L-nan.json", "not JSON"),
            ("L-forged.json", f"it claims uid {ALICE}, but its file is owned by uid {BOB}"),
        ]:
            assert f"{LEASES}/{name}' of user {BOB} (uid {BOB}): {why}" in warned, (name, warned)

        shown = orch("status", "--hosts", "-i", inventory, timeout=60, env={"COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout + shown.stderr and "\r" not in shown.stdout
        assert "]0;pwnedevil[8mstarted: yours" in shown.stdout
        assert f"(uid {BOB}): a symbolic link (host node3)" in shown.stderr
        units = {u["unit"]: u for u in host_units(orch, inventory)}
        assert [units[u]["state"] for u in range(4)] == ["held", "held", "held", "free"]
        assert units[1]["user"] != "bob\x1b[2J"  # Alice's, not the forged one's

        checked = orch("check", "-i", inventory, timeout=120)
        assert f"lease directory {LEASES} belongs to" in checked.stdout + checked.stderr
        assert "1777 root root -" in checked.stdout + checked.stderr

        # A ticket that claims the epoch, after Alice's second job joined the line.
        second = as_user_on(cluster, 3, ALICE, VICTIM, f"/run/orch-u{ALICE}", "2")
        alice.append(second)
        wait_for(
            lambda: "T-4011-" in cluster.exec_on(3, ["ls", LEASES]).stdout, 10, "Alice in line"
        )
        time.sleep(policy.LINE_SLACK_S + 1)
        tell(bob, "ticket")
        assert said(bob) == "ticket\n"
        tell(first, "done")  # its slots come back: the second job's turn, not the forger's
        second_start = json.loads(said(second))
        assert second_start["units"] == [1, 2], second_start
        assert second_start["said"]["queued"]["position"] == 1

        tell(bob, "lock")
        assert said(bob) == "locked\n"
        third = as_user_on(cluster, 3, ALICE, VICTIM, f"/run/orch-u{ALICE}", "1")
        alice.append(third)
        refused = json.loads(said(third))
        assert refused["units"] is None and refused["seconds"] < 12, refused
        error = refused["said"]["error"]
        assert f"{LEASES} has been locked for 8 s by pid " in error, error
        assert f"(user {BOB}: /usr/bin/python3 -I /run/orch-{BOB}.py" in error, error
    finally:
        for process in [bob, *alice]:
            process.kill()
            process.wait()
        end_user_scripts(cluster, 3)
        cluster.exec_on(3, ["sh", "-c", f"rm -rf {LEASES} /run/orch-u40* /run/orch-40*.py"])


WEDGE = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.agent.host import proc
from orchestrator.agent.leases import storage
root = storage.open_dir(storage.lease_dir())
me = (os.getpid(), proc.start_time(os.getpid()))
name, claim = storage.new_name("T", me), storage.new_name("C", me)
storage.claim(root, claim)  # claimed once, as a supervisor does, and never again
storage.write_record(root, name, {
    "kind": "slot", "count": 4, "job": "wedge", "ticket": [time.time(), "wedge"],
    "user": "bob", "uid": os.getuid(), "holder": list(me), "boot": proc.boot_id(),
    "host": storage.HOST, "pool": [0, 1, 2, 3], "since": time.time(), "claim": claim})
print(name, flush=True)
sys.stdin.readline()
"""


def test_a_ticket_at_the_front_that_nobody_claims_is_passed_within_seconds_and_keeps_its_place(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    """Bob (uid 4012) puts a ticket for all four slots of node3 at the front of the
    line, held by a live process of his, and never takes it nor claims it again.
    Alice's job (uid 4011) waits behind it while its claim is fresh, then starts on
    two of the slots within seconds (policy.CLAIM_S); Bob's ticket is still first in
    line."""
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[3], node3={"slots": 4})
    cluster.exec_on(3, ["sh", "-c", f"rm -rf {LEASES} && install -d -m 1777 {LEASES}"])
    bob = as_user_on(cluster, 3, BOB, WEDGE)
    alice: subprocess.Popen[str] | None = None
    try:
        assert said(bob).startswith("T-4012-"), bob.stderr.read() if bob.stderr else ""
        alice = as_user_on(cluster, 3, ALICE, VICTIM, f"/run/orch-u{ALICE}", "2")
        start = json.loads(said(alice, within=policy.CLAIM_S + 20))
        assert start["units"] == [0, 1], start
        queued = start["said"]["queued"]
        assert queued["position"] == 2 and [a["job"] for a in queued["ahead"]] == ["wedge"]
        assert policy.CLAIM_S - 5 < start["seconds"] < policy.CLAIM_S + 5, start

        shown = orch("status", "--hosts", "--json", "-i", inventory, timeout=30)
        assert shown.returncode == 0, shown.stderr
        found = json.loads(shown.stdout)
        assert [(q["position"], q["job"], q["count"]) for q in found["queue"]] == [(1, "wedge", 4)]
        states = [(u["state"], u.get("job")) for u in found["units"]]
        assert states == [("held", "alice-job")] * 2 + [("free", None)] * 2
        assert bob.poll() is None  # the wedge's holder still runs: its ticket lives
    finally:
        for process in [bob, *([alice] if alice else [])]:
            process.kill()
            process.wait()
        end_user_scripts(cluster, 3)
        cluster.exec_on(3, ["sh", "-c", f"rm -rf {LEASES} /run/orch-u40* /run/orch-40*.py"])
