"""The fair line on the real test cluster: priorities, aging, per-user limits and the
host's policy file, between two real non-root users (4011 and 4012, no login:
setpriv) who share node3's lease directory, and through `orch submit` as root.
Each user's job is the supervisor's own wait in line (holder.wait_turn), as in
test_leases.py; the policy is the file every host's agent reads (POLICY_FILE)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import POLICY_FILE, Cluster, OrchRunner
from tests.integration.test_leases import (
    LEASES,
    as_user_on,
    end_user_scripts,
    finished,
    hold_job,
    said,
    tell,
)
from tests.support import job_id_of, status_json, wait_for

pytestmark = pytest.mark.cluster

ALICE, BOB = 4011, 4012
POLICY_DIR = POLICY_FILE.rsplit("/", 1)[0]

# A job of one node of `user`: its supervisor's wait in line for COUNT slots of
# SLOTS, with PRIORITY; prints when it started (and what it was told while it
# waited), holds them HOLD seconds (or until a line on stdin), prints its end.
JOB = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
os.environ["ORCH_POLICY_FILE"] = sys.argv[2]
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.kernel.requests import StartRequest
from orchestrator.agent.leases import holder
job, slots, count, priority, hold = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], float(sys.argv[7])
home = "/run/orch-u%d/%s" % (os.getuid(), job)
os.makedirs(home)
os.chdir(home)
read_fd, write_fd = os.pipe()
asked = time.time()
req = {"kind": "slot", "pool": list(range(slots)), "count": count, "ticket": [asked, job],
       "job": job, "priority": priority}
turn = holder.wait_turn(parse_message(StartRequest, {"argv": [], "env": {}, "lease": req}), write_fd)
if turn is not None and not turn.reported:
    os.close(write_fd)
told = os.read(read_fd, 65536)
print(json.dumps({"job": job, "units": turn.units if turn else None, "asked": asked,
                  "t": time.time(), "said": json.loads(told or b"{}"),
                  "warnings": turn.warnings if turn else []}), flush=True)
if turn is not None:
    if hold < 0:
        sys.stdin.readline()
    else:
        time.sleep(hold)
    holder.release(turn)
    print(json.dumps({"end": time.time()}), flush=True)
"""

# A ticket Bob writes himself, not through orch: it asks for `high` (which the policy
# does not let him use) and is claimed every second by a live process of his, so it
# would keep both slots back for ever if the line believed it.
FORGED = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.agent.host import proc
from orchestrator.agent.leases import storage
root = storage.open_dir(storage.lease_dir())
me = (os.getpid(), proc.start_time(os.getpid()))
name, claim = storage.new_name("T", me), storage.new_name("C", me)
storage.claim(root, claim)
storage.write_record(root, name, {
    "kind": "slot", "count": 2, "job": "forged", "ticket": [time.time(), "forged"],
    "user": "bob", "uid": os.getuid(), "holder": list(me), "boot": proc.boot_id(),
    "host": storage.HOST, "pool": [0, 1], "since": time.time(), "claim": claim,
    "priority": "high"})
print(name, flush=True)
while True:
    time.sleep(1)
    storage.claim(root, claim)
"""


def job(
    cluster: Cluster, uid: int, name: str, slots: int, count: int, priority: str, hold: float
) -> subprocess.Popen[str]:
    return as_user_on(
        cluster, 3, uid, JOB, POLICY_FILE, name, str(slots), str(count), priority, str(hold)
    )


def started(process: subprocess.Popen[str], within: float = 30.0) -> dict[str, Any]:
    line: dict[str, Any] = json.loads(said(process, within))
    return line


def still_waiting(process: subprocess.Popen[str], seconds: float) -> bool:
    """Nothing printed for `seconds`: the job has not started."""
    import select

    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    return not ready


def in_line(cluster: Cluster, uid: int, count: int = 1) -> None:
    def there() -> bool:
        listed = cluster.exec_on(3, ["ls", LEASES]).stdout.split()
        return sum(name.startswith(f"T-{uid}-") for name in listed) >= count

    wait_for(there, 15, f"{count} ticket(s) of uid {uid} in line")


def write_policy(
    cluster: Cluster, text: str, owner: int = 0, mode: str = "644", host: int = 3
) -> None:
    """The host's policy file, as its administrator (or `owner`) wrote it."""
    made = cluster.exec_on(
        host,
        [
            "sh",
            "-c",
            f"rm -rf {POLICY_DIR} && install -d -m 755 {POLICY_DIR} && cat > {POLICY_FILE} "
            f"&& chown {owner} {POLICY_FILE} && chmod {mode} {POLICY_FILE}",
        ],
        input=text,
    )
    assert made.returncode == 0, made.stderr


@pytest.fixture
def node3(cluster: Cluster) -> Any:
    """node3 with a fresh lease directory and no policy; everything removed after."""
    cluster.exec_on(3, ["sh", "-c", f"rm -rf {LEASES} {POLICY_DIR} && install -d -m 1777 {LEASES}"])
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()
    end_user_scripts(cluster, 3)  # a forged ticket's claimer would run for ever
    cluster.exec_on(
        3, ["sh", "-c", f"rm -rf {LEASES} {POLICY_DIR} /run/orch-u40* /run/orch-40*.py"]
    )


def test_a_high_job_passes_a_waiting_normal_one_but_never_stops_a_running_job(
    cluster: Cluster, node3: list[subprocess.Popen[str]]
) -> None:
    """Alice's job holds both slots; her next job waits; Bob's `high` job, submitted
    after it, waits too while hers runs, then starts first; hers starts after his."""
    write_policy(cluster, f"high {BOB}\n")
    running = job(cluster, ALICE, "running", 2, 2, "normal", -1)
    node3.append(running)
    assert started(running)["units"] == [0, 1]
    normal = job(cluster, ALICE, "normal", 2, 2, "normal", -1)
    node3.append(normal)
    in_line(cluster, ALICE)
    high = job(cluster, BOB, "high", 2, 2, "high", -1)
    node3.append(high)
    in_line(cluster, BOB)
    assert still_waiting(high, 3) and still_waiting(normal, 0.1)  # the running job runs on
    assert running.poll() is None

    tell(running, "done")
    first = started(high)
    assert first["units"] == [0, 1]
    assert first["said"]["queued"]["priority"] == "high"
    assert first["said"]["queued"]["position"] == 1  # ahead of Alice's older one at once
    assert still_waiting(normal, 2)
    tell(high, "done")
    second = started(normal)
    assert second["units"] == [0, 1] and second["said"]["queued"]["position"] == 1
    assert second["t"] > first["t"]


def test_a_user_at_their_limit_waits_while_another_users_job_starts(
    cluster: Cluster, node3: list[subprocess.Popen[str]]
) -> None:
    write_policy(cluster, f"limit {ALICE} slots 2\n")
    holding = job(cluster, ALICE, "holding", 4, 2, "normal", -1)
    node3.append(holding)
    assert started(holding)["units"] == [0, 1]
    over = job(cluster, ALICE, "over", 4, 1, "normal", -1)
    node3.append(over)
    in_line(cluster, ALICE)
    other = job(cluster, BOB, "other", 4, 1, "normal", -1)  # younger, another user
    node3.append(other)
    assert started(other)["units"] == [2]
    assert still_waiting(over, 1)
    tell(holding, "done")
    after = started(over)
    assert after["units"] == [0]
    assert after["said"]["queued"]["limit"] == {"user": str(ALICE), "held": 2, "most": 2}
    refused = job(cluster, ALICE, "too-big", 4, 3, "normal", -1)  # never within her 2
    node3.append(refused)
    said_refused = started(refused)
    assert said_refused["units"] is None
    assert f"lets {ALICE} hold at most 2 here" in said_refused["said"]["refused"]


def test_a_low_job_starts_after_its_wait_while_normal_jobs_keep_coming(
    cluster: Cluster, node3: list[subprocess.Popen[str]]
) -> None:
    """One slot; a `normal` job of Bob's arrives every 0.7 s and holds it for 1 s, more
    than the slot can serve. Alice's `low` job rises one level per 3 s waited (`age
    0.05`): normal jobs that came before it, or soon after, go first; then it starts,
    while Bob's later jobs still wait."""
    age_s = 3.0
    write_policy(cluster, f"age {age_s / 60}\n")
    first = job(cluster, BOB, "b0", 1, 1, "normal", 1.0)
    node3.append(first)
    assert started(first)["units"] == [0]
    low = job(cluster, ALICE, "low", 1, 1, "low", 0)
    node3.append(low)
    in_line(cluster, ALICE)
    stream: list[tuple[float, subprocess.Popen[str]]] = []  # (submitted, the job)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and still_waiting(low, 0):
        process = job(cluster, BOB, f"b{len(stream) + 1}", 1, 1, "normal", 1.0)
        stream.append((time.time(), process))
        node3.append(process)
        time.sleep(0.7)
    got = started(low, within=5)
    assert got["units"] == [0], got
    waited = got["t"] - got["asked"]
    assert age_s <= waited < 30, got
    passed, behind = 0, 0
    for submitted, process in stream:
        if still_waiting(process, 0):  # not started yet
            behind += submitted < got["t"]
            continue
        start = json.loads(process.stdout.readline())  # type: ignore[union-attr]
        passed += start["asked"] > got["asked"] and start["t"] < got["t"]
        behind += submitted < got["t"] < start["t"]
    assert passed, "no normal job that came after it went first: it was not low"
    assert behind, "no normal job was waiting when it started: none kept coming"


def test_a_policy_file_a_user_wrote_is_ignored_and_a_forged_high_ticket_counts_as_normal(
    cluster: Cluster, node3: list[subprocess.Popen[str]]
) -> None:
    """Bob owns the policy file and opens `high` to everyone in it: his high job is
    refused, with a warning naming the file. Then root's policy opens high to nobody,
    and Bob writes a `high` ticket himself and keeps claiming it: Alice's older
    normal job still starts first when the slots come free."""
    write_policy(cluster, "high *\n", owner=BOB)
    refused = job(cluster, BOB, "high", 2, 1, "high", -1)
    node3.append(refused)
    said_refused = started(refused)
    assert said_refused["units"] is None
    assert f"priority high is not open to {BOB} here" in said_refused["said"]["refused"]
    assert (
        f"ignored the policy file {POLICY_FILE}: it belongs to {BOB}, not root"
        in said_refused["said"]["warnings"][0]
    )

    write_policy(cluster, "age 30\n")
    running = job(cluster, ALICE, "running", 2, 2, "normal", -1)
    node3.append(running)
    assert started(running)["units"] == [0, 1]
    normal = job(cluster, ALICE, "normal", 2, 2, "normal", -1)
    node3.append(normal)
    in_line(cluster, ALICE, 1)
    forged = as_user_on(cluster, 3, BOB, FORGED)
    node3.append(forged)
    assert said(forged).startswith(f"T-{BOB}-")
    time.sleep(1)
    tell(running, "done")
    assert started(normal, within=10)["units"] == [0, 1]


def test_orch_submit_says_a_job_waits_for_its_users_limit_and_refuses_a_high_it_may_not_use(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    """Through the real CLI as root over SSH: node1's policy lets root hold one slot;
    the second job waits and says why on submit and in `orch status`; `--priority
    high` exits 2, as does an unknown priority."""
    inventory = cluster.write_inventory(tmp_path / "inv.yaml", hosts=[1], node1={"slots": 2})
    write_policy(cluster, "limit root slots 1\nlimit root slots\n", host=1)
    release = tmp_path / "release"
    try:
        first = orch(
            "submit", "-d", hold_job(tmp_path, "first", release, nproc_per_node=1), "-i", inventory
        )
        assert first.returncode == 0, first.stderr
        assert (
            f"warning: {POLICY_FILE}:2: write: limit USER gpus|slots N: ignored the line "
            "'limit root slots' (host node1)" in first.stderr
        ), first.stderr
        second = orch(
            "submit", "-d", hold_job(tmp_path, "second", 1, nproc_per_node=1), "-i", inventory
        )
        assert second.returncode == 0, second.stderr
        assert "waiting: root holds 1 of their 1 slot on node1" in second.stderr, second.stderr
        shown = status_json(orch, job_id_of(second.stdout))["queued"]
        assert (
            shown == "queued, 1st in line on node1; waiting: root holds 1 of their 1 slot on node1"
        )

        high = orch(
            "submit",
            "--priority",
            "high",
            hold_job(tmp_path, "high", 1, nproc_per_node=1),
            "-i",
            inventory,
        )
        assert high.returncode == 2, high.stderr
        assert "error: not started: priority high is not open to root here" in high.stderr
        assert "(host node1)" in high.stderr and "hint: " in high.stderr
        checked = orch("check", "-i", inventory, timeout=120)
        assert "ignored the line 'limit root slots'" in checked.stdout + checked.stderr
        bogus = orch("submit", "--priority", "urgent", hold_job(tmp_path, "u", 1), "-i", inventory)
        assert bogus.returncode == 2 and "unknown priority 'urgent'" in bogus.stderr
    finally:
        release.touch()
        cluster.exec_on(1, ["rm", "-rf", POLICY_DIR])
    assert orch("logs", job_id_of(second.stdout), "-f", timeout=60).returncode == 0


def test_a_high_job_of_two_nodes_passes_a_waiting_normal_one_on_both_hosts(
    cluster: Cluster, orch: OrchRunner, tmp_path: Path
) -> None:
    """Jobs of several nodes take their turn through their keeper (detached), on a
    line whose order must be the same on every host: the `high` one, submitted
    last, starts first when the running job ends, on both hosts at once."""
    inventory = cluster.write_inventory(
        tmp_path / "inv.yaml", hosts=[1, 2], node1={"slots": 2}, node2={"slots": 2}
    )
    release = tmp_path / "release"
    for host in (1, 2):
        write_policy(cluster, "high root\n", host=host)
    try:
        keys: dict[str, Any] = {"nodes": 2, "nproc_per_node": 2}
        running = orch(
            "submit", "-d", hold_job(tmp_path, "running", release, **keys), "-i", inventory
        )
        assert running.returncode == 0, running.stderr
        normal = orch("submit", "-d", hold_job(tmp_path, "normal", 1, **keys), "-i", inventory)
        assert normal.returncode == 0 and "queued" in normal.stderr, normal.stderr
        high = orch(
            "submit",
            "-d",
            "--priority",
            "high",
            hold_job(tmp_path, "high", 1, **keys),
            "-i",
            inventory,
        )
        assert high.returncode == 0 and "queued" in high.stderr, high.stderr
        line = json.loads(orch("status", "--hosts", "--json", "-i", inventory).stdout)["queue"]
        for host in ("node1", "node2"):
            ours = [(q["job"], q["priority"]) for q in line if q["host"] == host]
            assert ours == [(job_id_of(high.stdout), "high"), (job_id_of(normal.stdout), "normal")]
        release.touch()
        first, second = (finished(orch, job_id_of(r.stdout)) for r in (high, normal))
        assert first.start < second.start, (first.start, second.start)
    finally:
        release.touch()
        for host in (1, 2):
            cluster.exec_on(host, ["rm", "-rf", POLICY_DIR])
