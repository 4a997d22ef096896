"""Leases of GPUs and slots (agent/leases/) and the controller's view of the line
(jobs/queue.py): who may take what, in which order, what is stale, and the files'
modes. Real files in a real sticky directory, real pids."""

from __future__ import annotations

import ast
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.agent.host import proc
from orchestrator.agent.kernel.fileio import read_json
from orchestrator.agent.kernel.layout import EXIT
from orchestrator.agent.kernel.lease_wire import LeaseHosts, Waiting
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.kernel.requests import StartRequest
from orchestrator.agent.leases import fairness, holder, policy, storage
from orchestrator.models.inventory import Host
from orchestrator.ssh.plan import build_plan
from orchestrator.ssh.queue import lease_request, slot_offsets, waiting_text
from tests.unit.conftest import WriteFile, dedent

ME = (os.getpid(), proc.start_time(os.getpid()))


def ticket(name: str, when: float, job: str, count: int, kind: str = "slot") -> policy.Record:
    return {"name": name, "ticket": [when, job], "count": count, "kind": kind, "job": job}


def lease(name: str, units: list[int], job: str = "holder-1", kind: str = "slot") -> policy.Record:
    return {"name": name, "units": units, "kind": kind, "job": job, "user": "alice", "since": 0}


def request(count: int, pool: int = 4, kind: str = "slot") -> policy.Record:
    return {"kind": kind, "pool": list(range(pool)), "count": count}


# ---------------------------------------------------------------- who may take what


def test_a_ticket_takes_the_first_free_units() -> None:
    mine = ticket("T-a", 1.0, "a", 2)
    held = [lease("L-x", [0, 2])]
    assert policy.grant(request(2), mine, held, [mine], {}) == [1, 3]


def test_two_jobs_of_two_fit_side_by_side_and_a_third_waits() -> None:
    first = [lease("L-1", [0, 1]), lease("L-2", [2, 3])]
    third = ticket("T-3", 3.0, "c", 2)
    assert policy.grant(request(2), third, first, [third], {}) is None


def test_an_older_ticket_keeps_its_turn_against_a_younger_smaller_one() -> None:
    # 2 of 4 slots are free; the older job wants all 4, the younger 2: strict first
    # come, first served, or a stream of small jobs would starve the big one.
    held = [lease("L-x", [0, 1])]
    older, younger = ticket("T-old", 1.0, "big", 4), ticket("T-new", 2.0, "small", 2)
    line = [older, younger]
    assert policy.grant(request(2), younger, held, line, {}) is None
    assert policy.grant(request(4), older, held, line, {}) is None


def test_a_younger_ticket_goes_beside_an_older_one_when_both_fit() -> None:
    older, younger = ticket("T-old", 1.0, "a", 2), ticket("T-new", 2.0, "b", 2)
    assert policy.grant(request(2), younger, [], [older, younger], {}) == [0, 1]


def test_tickets_of_another_kind_do_not_hold_a_turn() -> None:
    gpu_job, slot_job = ticket("T-g", 1.0, "g", 4, kind="gpu"), ticket("T-s", 2.0, "s", 4)
    assert policy.grant(request(4), slot_job, [], [gpu_job, slot_job], {}) == [0, 1, 2, 3]


def test_gpus_busy_outside_orch_are_not_handed_out() -> None:
    mine = ticket("T-a", 1.0, "a", 2, kind="gpu")
    busy = {1: {"gpu": 1, "pid": 4242, "user": "bob"}}
    assert policy.grant(request(2, kind="gpu"), mine, [], [mine], busy) == [0, 2]
    assert policy.grant(request(4, kind="gpu"), mine, [], [mine], busy) is None


def test_only_the_inventorys_gpus_are_handed_out() -> None:
    mine = ticket("T-a", 1.0, "a", 2, kind="gpu")
    pool = {"kind": "gpu", "pool": [0, 2, 4], "count": 2}
    assert policy.grant(pool, mine, [lease("L-x", [0], kind="gpu")], [mine], {}) == [2, 4]


def claimed_at(record: policy.Record, at: float) -> policy.Record:
    return {**record, "claimed": at}


def test_a_front_ticket_nobody_claims_keeps_nothing_back_but_keeps_its_place() -> None:
    # A ticket whose turn came and that never takes (a file a co-tenant left, with a
    # live process of theirs as its holder): once its claim is older than CLAIM_S,
    # the job behind it starts; it stays first in line, and may still take.
    now = 1000.0
    wedge = claimed_at(ticket("T-old", 1.0, "wedge", 4), now - policy.CLAIM_S - 1)
    behind = ticket("T-new", 2.0, "honest", 2)
    line = [wedge, behind]
    assert policy.grant(request(2), behind, [], line, {}, now) == [0, 1]
    assert policy.grant(request(4), wedge, [], line, {}, now) == [0, 1, 2, 3]
    info = policy.why_waiting(request(2), behind, [], line, {})
    assert info["position"] == 2 and [a["job"] for a in info["ahead"]] == ["wedge"]


def test_a_claimed_ticket_keeps_its_turn_however_long_it_waits() -> None:
    # An honest node of several: its turn came here, its job waits for another host,
    # and its controller's rounds claim it here all the while (all or none).
    now = 100_000.0
    waiting = claimed_at(ticket("T-old", 1.0, "two-nodes", 4), now - 1)
    behind = ticket("T-new", 2.0, "small", 1)
    assert policy.grant(request(1), behind, [], [waiting, behind], {}, now) is None


def test_a_ticket_nobody_claims_keeps_nothing_back_behind_a_lease_either() -> None:
    # A co-tenant's lease of one slot and a ticket of theirs wanting all four: while
    # that ticket is claimed nobody behind gets the other three; once not, they do.
    now = 1000.0
    held = [lease("L-theirs", [0])]
    theirs = ticket("T-theirs", 1.0, "all", 4)
    mine = ticket("T-mine", 2.0, "mine", 3)
    fresh = [claimed_at(theirs, now - 2), mine]
    assert policy.grant(request(3), mine, held, fresh, {}, now) is None
    stale = [claimed_at(theirs, now - policy.CLAIM_S - 0.5), mine]
    assert policy.grant(request(3), mine, held, stale, {}, now) == [1, 2, 3]


def test_a_ticket_is_claimed_from_its_files_change_times_never_from_what_it_says() -> None:
    record = {
        "kind": "slot",
        "count": 1,
        "job": "j",
        "ticket": [10.0, "j"],
        "user": "u",
        "uid": os.getuid(),
        "holder": list(ME),
        "boot": "b",
        "pool": [0],
        "since": 10.0,
        "claimed": 1e10,  # a forged claim in the ticket's own words
        "claim": "C-1.json",
    }
    checked, why = policy.check_record(record, "T-1.json", os.getuid(), 500.0)
    assert checked is not None and checked["claimed"] == 500.0, why
    for bad in ("../../etc/passwd", "C-/x.json", "T-1.json", 7):
        refused, why = policy.check_record({**record, "claim": bad}, "T-1.json", os.getuid(), 1)
        assert refused is None and why == "claim is not a claim file's name"


def test_tickets_order_by_submit_time_then_job_id_the_same_on_every_host() -> None:
    line = [ticket("T-9", 2.0, "a", 1), ticket("T-1", 1.0, "z", 1), ticket("T-5", 1.0, "b", 1)]
    assert [t["job"] for t in sorted(line, key=policy.ticket_key)] == ["b", "z", "a"]


def test_why_waiting_names_holders_and_the_place_in_line() -> None:
    held = [lease("L-x", [0, 1, 2, 3], job="train-1a2b")]
    first, mine = ticket("T-1", 1.0, "a", 2), ticket("T-2", 2.0, "b", 2)
    info = policy.why_waiting(request(2), mine, held, [first, mine], {})
    assert info["position"] == 2 and info["free"] == 0 and info["want"] == 2
    assert [h["job"] for h in info["holders"]] == ["train-1a2b"]
    assert [a["job"] for a in info["ahead"]] == ["a"]


def test_held_units_map_each_unit_of_a_kind_to_its_lease() -> None:
    gpu, slot = lease("L-g", [1, 3], kind="gpu"), lease("L-s", [1], kind="slot")
    assert policy.held_units([gpu, slot], "gpu") == {1: gpu, 3: gpu}
    assert policy.held_units([gpu, slot], "slot") == {1: slot}


def test_what_others_see_of_a_lease_leaves_its_pids_and_pool_out() -> None:
    record = {**lease("L-x", [0]), "holder": [1, 2], "pool": [0, 1], "boot": "b", "name": "L-x"}
    assert policy.public(record) == {
        "kind": "slot",
        "units": [0],
        "job": "holder-1",
        "user": "alice",
        "since": 0,
    }


@pytest.mark.parametrize("module", [policy, fairness])
def test_the_lines_policy_is_pure(module: object) -> None:
    """Records in, answers out: the line's rules and the fair line's read no file,
    process or clock (storage.py, admin.py, holder.py and gpus.py do)."""
    tree = ast.parse(Path(str(getattr(module, "__file__", ""))).read_text())
    imported = {
        alias.name.split(".")[0] if isinstance(node, ast.Import) else str(node.module)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= {"__future__", "typing", "collections.abc", "fairness"}


# ---------------------------------------------------------------- stale or alive


def live_record(**extra: object) -> policy.Record:
    return {"boot": proc.boot_id(), "holder": list(ME), **extra}


def full_record(**extra: object) -> policy.Record:
    """A lease of this process's, every field as the supervisor writes it."""
    return {
        "kind": "slot",
        "count": 1,
        "job": "j-1",
        "ticket": [1.0, "j-1"],
        "user": proc.user_name(os.getuid()),
        "uid": os.getuid(),
        "holder": list(ME),
        "boot": proc.boot_id(),
        "host": storage.HOST,
        "pool": [0, 1, 2, 3],
        "since": 1.0,
        "units": [0],
        **extra,
    }


def test_a_lease_lives_while_its_holder_runs_with_the_recorded_start_time() -> None:
    assert storage.is_live(live_record(), proc.boot_id())


def test_a_reused_pid_does_not_keep_a_lease_alive() -> None:
    record = live_record(holder=[ME[0], (ME[1] or 0) + 1])
    assert not storage.is_live(record, proc.boot_id())


def test_a_lease_from_before_a_reboot_is_stale() -> None:
    assert not storage.is_live(live_record(boot="another-boot"), proc.boot_id())


def test_torchrun_keeps_the_lease_alive_after_its_supervisor_died() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # gone, reaped: a pid and start time that name no process now
    dead = [child.pid, 1]
    record = live_record(holder=dead, torchrun=list(ME))
    assert storage.is_live(record, proc.boot_id())
    assert not storage.is_live(live_record(holder=dead), proc.boot_id())


@pytest.fixture
def lease_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "leases"
    monkeypatch.setenv("ORCH_LEASE_DIR", str(root))
    return root


def test_the_lease_directory_is_sticky_and_writable_by_all(lease_dir: Path) -> None:
    old = os.umask(0o077)
    try:
        storage.open_dir(str(lease_dir))
    finally:
        os.umask(old)
    assert stat.S_IMODE(lease_dir.stat().st_mode) == 0o1777


def test_a_lease_directory_that_is_not_sticky_is_refused(lease_dir: Path) -> None:
    lease_dir.mkdir(mode=0o777)
    os.chmod(lease_dir, 0o777)
    with pytest.raises(storage.LeaseError, match="not 1777"):
        storage.open_dir(str(lease_dir))


def test_a_lease_directory_another_node_is_still_making_is_waited_for(lease_dir: Path) -> None:
    """Two nodes on one machine start together: one made the directory (mode 700) and
    has yet to chmod it; the other waits for that instead of refusing."""
    lease_dir.mkdir(mode=0o700)
    os.chmod(lease_dir, 0o700)
    timer = threading.Timer(0.2, os.chmod, (lease_dir, 0o1777))
    timer.start()
    try:
        assert storage.open_dir(str(lease_dir)) == str(lease_dir)
    finally:
        timer.join()
    os.chmod(lease_dir, 0o700)  # never finished: refused after a second
    with pytest.raises(storage.LeaseError, match="not 1777"):
        storage.open_dir(str(lease_dir))


def test_a_lease_directory_that_is_a_link_is_refused(lease_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    lease_dir.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(storage.LeaseError, match="not a directory"):
        storage.open_dir(str(lease_dir))


def test_lease_files_are_readable_by_all_and_hold_no_env(lease_dir: Path) -> None:
    root = storage.open_dir(str(lease_dir))
    storage.write_record(root, "L-x.json", {"job": "j", "units": [0]})
    mode = stat.S_IMODE((lease_dir / "L-x.json").stat().st_mode)
    assert mode == 0o644
    assert not [p for p in lease_dir.iterdir() if p.name.endswith(".tmp")]


def test_scan_drops_my_stale_leases_and_ignores_anothers(lease_dir: Path) -> None:
    root = storage.open_dir(str(lease_dir))
    uid = os.getuid()
    stale = full_record(boot="old", holder=[1, 1])
    theirs = {**stale, "uid": uid + 1}
    live = full_record(units=[1])
    storage.write_record(root, "L-mine-stale.json", stale)
    storage.write_record(root, "L-theirs-stale.json", theirs)
    storage.write_record(root, "L-live.json", live)
    held, _ = storage.scan(root)
    assert [r["name"] for r in held] == ["L-live.json"]
    assert not (lease_dir / "L-mine-stale.json").exists()
    assert (lease_dir / "L-theirs-stale.json").exists()  # not ours to remove; counts for nothing
    held, _ = storage.scan(root)
    assert [r["name"] for r in held] == ["L-live.json"]


def test_a_claim_counts_from_a_regular_file_of_the_tickets_own_user(lease_dir: Path) -> None:
    root = storage.open_dir(str(lease_dir))
    record = {"claimed": 5.0, "claim": "C-a.json", "uid": os.getuid()}
    assert storage.claimed_at(root, record) == 5.0  # no claim file yet
    storage.claim(root, "C-a.json")
    made = os.lstat(lease_dir / "C-a.json").st_ctime
    assert storage.claimed_at(root, record) == made > 5.0
    assert storage.claimed_at(root, {**record, "uid": os.getuid() + 1}) == 5.0
    os.symlink(lease_dir / "C-a.json", lease_dir / "C-link.json")
    assert storage.claimed_at(root, {**record, "claim": "C-link.json"}) == 5.0


def test_a_supervisor_in_line_claims_its_ticket_and_takes_its_claim_away_with_it(
    lease_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    req = {"kind": "slot", "pool": [0, 1], "count": 2, "ticket": [1.0, "a"], "job": "a"}
    first, _ = wait_turn(tmp_path / "a", req)
    assert first is not None
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAIT_IN_LINE, str(tmp_path / "b")],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        stdout=subprocess.PIPE,
    )
    try:
        assert waiter.stdout is not None and b"queued" in waiter.stdout.readline()
        _, line = storage.scan(str(lease_dir))
        assert [t["job"] for t in line] == ["b"]
        claim = lease_dir / line[0]["claim"]
        assert claim.exists() and line[0]["claimed"] >= os.lstat(claim).st_ctime
    finally:
        holder.release(first)
    assert waiter.wait(timeout=30) == 0
    assert not list(lease_dir.glob("C-*")) and not list(lease_dir.glob("T-*"))


WAIT_IN_LINE = """
import json, os, sys
from orchestrator.agent.leases import holder
os.makedirs(sys.argv[1]); os.chdir(sys.argv[1])
read_fd, write_fd = os.pipe()
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.kernel.requests import StartRequest
req = {"kind": "slot", "pool": [0, 1], "count": 2, "ticket": [2.0, "b"], "job": "b"}
turn = None
pid = os.fork()
if pid == 0:
    os.close(read_fd)
    turn = holder.wait_turn(parse_message(StartRequest, {"argv": [], "env": {}, "lease": req}), write_fd)
    holder.release(turn)
    os._exit(0 if turn and turn.units == [0, 1] else 1)
os.close(write_fd)
print(os.read(read_fd, 65536).decode(), flush=True)
sys.exit(os.waitpid(pid, 0)[1] >> 8)
"""


# ---------------------------------------------------------------- the supervisor's turn


def wait_turn(
    job_dir: Path, lease_req: policy.Record
) -> tuple[holder.Turn | None, dict[str, object]]:
    """The supervisor's wait_turn in `job_dir`, and what it said on the start pipe."""
    job_dir.mkdir(exist_ok=True)
    os.chdir(job_dir)
    read_fd, write_fd = os.pipe()
    start = parse_message(StartRequest, {"argv": [], "env": {}, "lease": lease_req})
    turn = holder.wait_turn(start, write_fd)
    if turn is not None and not turn.reported:
        os.close(write_fd)
    said = os.read(read_fd, 65536)
    os.close(read_fd)
    return turn, (json.loads(said) if said else {})


def test_a_free_host_gives_the_lease_at_once_and_release_frees_it(
    lease_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    req = {"kind": "gpu", "pool": [0, 2, 4], "count": 2, "ticket": [1.0, "j"], "job": "j"}
    turn, said = wait_turn(tmp_path / "node", req)
    assert turn is not None and said == {}
    assert turn.units == [0, 2]
    assert turn.env()["CUDA_VISIBLE_DEVICES"] == "0,2"
    held, line = storage.scan(str(lease_dir))
    assert [r["units"] for r in held] == [[0, 2]] and line == []
    holder.release(turn)
    assert tuple(storage.scan(str(lease_dir))) == ([], [])


def test_no_wait_on_a_busy_host_says_busy_and_records_why_the_node_ended(
    lease_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    req = {"kind": "slot", "pool": [0, 1], "count": 2, "ticket": [1.0, "a"], "job": "a"}
    first, _ = wait_turn(tmp_path / "a", req)
    assert first is not None
    try:
        other = {**req, "ticket": [2.0, "b"], "job": "b", "wait": False}
        turn, said = wait_turn(tmp_path / "b", other)
        assert turn is None
        busy = said["busy"]
        assert isinstance(busy, dict) and busy["holders"][0]["job"] == "a"
        ended = read_json(str(tmp_path / "b" / EXIT))
        assert ended is not None and ended["returncode"] is None
        assert storage.scan(str(lease_dir)).tickets == []  # its ticket left the line
    finally:
        holder.release(first)


# ---------------------------------------------------------------- the controller's side


def test_gpus_per_node_defaults_to_one_per_process(write: WriteFile, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    job_path = write("job.yaml", "script: train.py\nnproc_per_node: 2\n")
    from orchestrator.models.job import load_job

    job = load_job(job_path)
    host = Host("gpu1", "10.0.0.1", gpus=(0, 2, 4, 6), slots=4, leases=True)
    plan = build_plan(job, [host], "j-1", "10.0.0.1", 29500)
    req = lease_request(job, plan.nodes[0], (1.0, "j-1"), True, True)
    assert req is not None
    assert (req.kind, req.pool, req.count) == ("gpu", [0, 2, 4, 6], 2)


def test_a_host_without_gpus_or_slots_in_the_inventory_leases_nothing(
    write: WriteFile, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("")
    from orchestrator.models.job import load_job

    job = load_job(write("job.yaml", "script: train.py\n"))
    plan = build_plan(job, [Host("n1", "10.0.0.1")], "j-1", "10.0.0.1", 29500)
    assert lease_request(job, plan.nodes[0], (1.0, "j-1"), True, True) is None


def test_the_inventory_declaring_slots_or_gpus_makes_the_host_shared(write: WriteFile) -> None:
    from orchestrator.models.inventory import load_inventory

    inv = load_inventory(
        write(
            "inv.yaml",
            dedent("""
            hosts:
              - {name: a, address: 10.0.0.1, slots: 4}
              - {name: b, address: 10.0.0.2, gpus: [0, 2, 4]}
              - {name: c, address: 10.0.0.3}
            """),
        )
    )
    assert [h.leases for h in inv.hosts] == [True, True, False]


def test_more_gpus_per_node_than_the_host_has_names_the_key(
    write: WriteFile, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("")
    from orchestrator.models.errors import SpecError
    from orchestrator.models.job import load_job

    job = load_job(write("job.yaml", "script: train.py\ngpus_per_node: 3\n"))
    host = Host("gpu1", "10.0.0.1", gpus=(0, 2), slots=2, leases=True)
    with pytest.raises(SpecError, match="gpus_per_node=3 but host gpu1 has 2 GPUs") as caught:
        build_plan(job, [host], "j-1", "10.0.0.1", 29500)
    assert caught.value.line == 2


def test_the_queued_line_names_what_whom_since_when_and_the_place() -> None:
    import time

    since = time.mktime((2026, 1, 1, 14, 2, 0, 0, 0, -1))
    info = {
        "kind": "gpu",
        "want": 4,
        "holders": [{"kind": "gpu", "job": "train-1a2b", "user": "alice", "since": since}],
        "position": 1,
    }
    parsed = parse_message(Waiting, info)
    text = waiting_text({"node2": parsed, "node3": parsed}, {})
    assert (
        text == "queued: 4 GPUs on node2, node3 held by train-1a2b (alice) since 14:02; 1st in line"
    )


def test_host_rows_show_each_inventory_gpu_free_held_or_busy_outside_orch() -> None:
    from orchestrator.ssh.queue import queue_rows, unit_rows

    host = Host("gpu1", "10.0.0.1", gpus=(0, 2, 4), slots=3, leases=True)
    view = parse_message(
        LeaseHosts,
        {
            "dir": "/run/lock/orch-leases",
            "leases": [{"kind": "gpu", "units": [2], "job": "a-1", "user": "alice", "since": 5.0}],
            "tickets": [{"kind": "gpu", "count": 2, "job": "b-2", "user": "bob", "since": 6.0}],
            "foreign": [
                {"gpu": 4, "pid": 4242, "user": "carol"},
                {"gpu": 1, "pid": 7, "user": "x"},
            ],
        },
    )
    rows = {r.unit: r for r in unit_rows(host, view)}
    assert sorted(rows) == [0, 2, 4]  # GPU 1 is not the inventory's to hand out
    assert rows[0].as_json() == {"host": "gpu1", "kind": "gpu", "unit": 0, "state": "free"}
    assert (rows[2].state, rows[2].job, rows[2].user) == ("held", "a-1", "alice")
    assert (rows[4].state, rows[4].pid, rows[4].user) == ("busy", 4242, "carol")
    assert [r.as_json() for r in queue_rows(host, view)] == [
        {
            "host": "gpu1",
            "position": 1,
            "job": "b-2",
            "user": "bob",
            "kind": "gpu",
            "count": 2,
            "since": 6.0,
            "priority": "normal",
        }
    ]


def test_the_queued_line_names_gpus_in_use_outside_orch_and_who_is_ahead() -> None:
    info = {
        "kind": "gpu",
        "want": 1,
        "holders": [],
        "ahead": [{"kind": "gpu", "job": "big-9", "user": "bob"}],
        "foreign": [{"gpu": 0, "pid": 4242, "user": "carol"}],
        "position": 2,
    }
    text = waiting_text({"node1": parse_message(Waiting, info)}, {})
    assert text == (
        "queued: 1 GPU on node1, in use outside orch by GPU 0 on node1: pid 4242 (carol); "
        "behind big-9 (bob); 2nd in line"
    )


def test_a_lease_recorded_by_another_host_in_a_shared_directory_holds_nothing_here() -> None:
    assert not storage.is_live(live_record(host="elsewhere"), proc.boot_id())
    assert storage.is_live(live_record(host=storage.HOST), proc.boot_id())


def test_another_hosts_lease_in_a_shared_directory_stays_for_that_host(lease_dir: Path) -> None:
    root = storage.open_dir(str(lease_dir))
    storage.write_record(root, "L-there.json", full_record(host="elsewhere"))
    held, _ = storage.scan(root)
    assert held == []  # holds nothing here
    assert (lease_dir / "L-there.json").exists()  # and is left to its own host


def test_inventory_entries_of_one_machine_count_their_slots_one_after_another() -> None:
    hosts = [
        Host("local1", "localhost", slots=2, leases=True),
        Host("local2", "127.0.0.1", slots=1, leases=True),
        Host("node1", "10.0.0.1", slots=4, leases=True),
        Host("node2", "10.0.0.1", slots=4, leases=True),
        Host("node3", "10.0.0.3", slots=4, leases=True),
    ]
    assert slot_offsets(hosts) == {"local1": 0, "local2": 2, "node1": 0, "node2": 4, "node3": 0}


def test_the_two_local_nodes_of_the_demo_lease_different_slots(
    write: WriteFile, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("")
    from orchestrator.models.job import load_job

    job = load_job(write("job.yaml", "script: train.py\nnodes: 2\n"))
    hosts = [Host(f"local{i}", "localhost", slots=1, leases=True) for i in (1, 2)]
    plan = build_plan(job, hosts, "j-1", "127.0.0.1", 29500)
    offsets = slot_offsets(hosts)
    pools = [
        lease_request(job, n, (1.0, "j-1"), True, False, offsets[n.host.name]) for n in plan.nodes
    ]
    assert [p.pool for p in pools if p] == [[0], [1]]


def test_an_older_ticket_keeps_back_only_units_of_its_own_pool() -> None:
    # local1 and local2 of one machine: slots [0] and [1]; neither waits for the other.
    first = {**ticket("T-1", 1.0, "demo", 1), "pool": [0]}
    second = {**ticket("T-2", 1.0, "demo", 1), "pool": [1]}
    line = [first, second]
    assert policy.grant({"kind": "slot", "pool": [1], "count": 1}, second, [], line, {}) == [1]
    assert policy.grant({"kind": "slot", "pool": [0], "count": 1}, first, [], line, {}) == [0]
    # Overlapping pools still queue in order.
    wide = {**ticket("T-0", 0.5, "big", 2), "pool": [0, 1]}
    assert (
        policy.grant({"kind": "slot", "pool": [1], "count": 1}, second, [], [wide, *line], {})
        is None
    )
