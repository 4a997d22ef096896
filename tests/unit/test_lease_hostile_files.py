"""The shared lease directory against files another user can put in it:
records that are no records, locks held too long, forged owners and times, and
words meant for the next user's terminal. Real files, real processes; the checks of
a record's fields are pure (policy.check_record)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.agent.host import proc
from orchestrator.agent.kernel.lease_wire import (
    LeaseDir,
    LeaseState,
    Waiting,
    lease_record,
    printable,
)
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.leases import policy, storage
from orchestrator.cli.hosts_view import _text
from orchestrator.ssh.check.rules import lease_dir_problems
from orchestrator.ssh.queue import waiting_text

ME = (os.getpid(), proc.start_time(os.getpid()))


def good(**extra: object) -> policy.Record:
    """A lease as this process's supervisor would write it."""
    return {
        "kind": "slot",
        "count": 1,
        "job": "j-1",
        "ticket": [1000.0, "j-1"],
        "user": "alice",
        "uid": os.getuid(),
        "holder": list(ME),
        "boot": proc.boot_id(),
        "host": storage.HOST,
        "pool": [0, 1],
        "since": 1000.0,
        "units": [0],
        **extra,
    }


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("ORCH_LEASE_DIR", str(tmp_path / "leases"))
    return storage.open_dir(str(tmp_path / "leases"))


# ---------------------------------------------------------------- a record's fields


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"units": ["zz"]}, "units is not a list of units"),
        ({"units": [1 << 40]}, "units is not a list of units"),
        ({"units": [True]}, "units is not a list of units"),
        ({"since": "x"}, "since is not a time"),
        ({"since": 1e300}, "since is not a time"),
        ({"since": float("nan")}, "since is not a time"),
        ({"since": -1}, "since is not a time"),
        ({"count": 10**400}, "count is not a unit count"),
        ({"kind": ["gpu"]}, "kind is neither gpu nor slot"),
        ({"job": {"a": 1}}, "job is not a job id"),
        ({"user": "u" * 10_000}, "user is not a user name"),
        ({"holder": "1 2"}, "holder is not [pid, start time]"),
        ({"ticket": [0, 1]}, "ticket is not [time, job id]"),
        ({"ticket": [float("inf"), "a"]}, "ticket is not [time, job id]"),
        ({"pool": "0-3"}, "pool is not a list of unit numbers"),
        ({"uid": "0"}, "uid is not a user id"),
    ],
)
def test_a_record_with_a_field_of_the_wrong_type_or_size_is_refused_with_the_field_named(
    bad: dict[str, object], why: str
) -> None:
    record, said = policy.check_record(good(**bad), "L-x.json", os.getuid(), 1000.0)
    assert record is None
    assert said == why


def test_a_record_that_claims_a_uid_other_than_its_files_owner_is_refused() -> None:
    record, said = policy.check_record(good(uid=0), "L-x.json", 4242, 1000.0)
    assert record is None
    assert said == "it claims uid 0, but its file is owned by uid 4242"


def test_a_sound_record_is_taken_with_its_name() -> None:
    record, said = policy.check_record(good(), "L-x.json", os.getuid(), 1000.0)
    assert said == "" and record is not None and record["name"] == "L-x.json"


def test_a_ticket_waits_from_no_earlier_than_just_before_its_file_was_made() -> None:
    forged, _ = policy.check_record(good(ticket=[0, "a"]), "T-x.json", os.getuid(), 5000.0)
    honest, _ = policy.check_record(good(ticket=[4999.0, "b"]), "T-y.json", os.getuid(), 5000.0)
    assert forged is not None and honest is not None
    assert forged["order"] == 5000.0 - policy.LINE_SLACK_S
    assert honest["order"] == 4999.0
    # One that came 20 s earlier stays ahead of the forged one.
    earlier, _ = policy.check_record(good(ticket=[4980.0, "c"]), "T-z.json", os.getuid(), 4980.2)
    assert earlier is not None
    assert sorted([forged, honest, earlier], key=policy.ticket_key) == [earlier, forged, honest]


# ---------------------------------------------------------------- files in the directory


def test_links_fifos_huge_files_and_bad_json_are_ignored_at_once_naming_their_owner(
    root: str,
) -> None:
    os.symlink("/dev/zero", os.path.join(root, "L-zero.json"))
    os.mkfifo(os.path.join(root, "L-fifo.json"))
    with open(os.path.join(root, "L-huge.json"), "wb") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB of nothing
    Path(root, "T-nan.json").write_text(json.dumps(good(since=float("nan"))))
    Path(root, "T-deep.json").write_text("[" * 30_000 + "]" * 30_000)
    Path(root, "L-types.json").write_text(json.dumps(good(units=["zz"])))
    storage.write_record(root, "L-ok.json", good())

    started = time.monotonic()
    found = storage.scan(root)

    assert time.monotonic() - started < 2
    assert [r["name"] for r in found.leases] == ["L-ok.json"]
    assert found.tickets == []
    owner = f"user {proc.user_name(os.getuid())} (uid {os.getuid()})"
    said = {w.split("'")[1].rsplit("/", 1)[1]: w for w in found.warnings}
    assert said["L-zero.json"].endswith(f"of {owner}: a symbolic link")
    assert said["L-fifo.json"].endswith("not a regular file")
    assert said["L-huge.json"].endswith("larger than 64 KiB")
    assert said["T-nan.json"].endswith("not JSON")
    assert said["T-deep.json"].endswith("not JSON")
    assert said["L-types.json"].endswith("units is not a list of units")


def test_the_lease_and_ticket_names_cannot_be_known_beforehand() -> None:
    names = {storage.new_name("L", (1, 2)) for _ in range(100)}
    assert len(names) == 100
    assert all(n.startswith(f"L-{os.getuid()}-1-2-") and n.endswith(".json") for n in names)


def test_a_lock_held_too_long_is_refused_within_the_deadline_naming_its_holder(root: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, root], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        with pytest.raises(storage.LeaseError) as caught, storage.locked(root, wait_s=0.5):
            pass
        assert time.monotonic() - started < 2
        assert f"{root} has been locked for 0 s by pid {holder.pid} (user " in str(caught.value)
        assert "hold-the-lock-marker" in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
    with storage.locked(root, wait_s=0.5):  # free again
        pass


HOLD_LOCK = """# hold-the-lock-marker (first: the holder's command line is cut at 200 characters)
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def test_a_lock_file_that_is_no_regular_file_locks_nobody_out(root: str) -> None:
    os.mkfifo(os.path.join(root, storage.LOCK))
    started = time.monotonic()
    with storage.locked(root, wait_s=0.5):
        pass
    assert time.monotonic() - started < 1


def test_the_lock_of_older_agents_is_taken_too(root: str) -> None:
    Path(root, storage.LOCK).touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, os.path.join(root, storage.LOCK)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        locked = pytest.raises(storage.LeaseError, match=r"\.lock has been locked")
        with locked, storage.locked(root, wait_s=0.3):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_lease_whose_holder_runs_as_another_user_holds_nothing() -> None:
    record = good(uid=os.getuid() + 1)
    assert not storage.is_live(record, proc.boot_id())
    assert storage.is_live(good(), proc.boot_id())


def test_a_lease_directory_root_does_not_own_gets_a_warning_with_the_tmpfiles_line(
    root: str,
) -> None:
    if os.getuid() == 0:
        os.chown(root, 4242, 4242)
    warning = storage.owner_warning(root)
    assert warning is not None
    assert f"'d {root} 1777 root root -' to /etc/tmpfiles.d/orch.conf" in warning


# ---------------------------------------------------------------- what reaches a terminal


EVIL = "\x1b]0;pwned\x07job\x1b[8m-hidden\r\nstarted: yours\u202e"


def test_printable_takes_out_escape_sequences_carriage_returns_and_bidi_overrides() -> None:
    assert printable(EVIL) == "]0;pwnedjob[8m-hiddenstarted: yours"
    assert "\x1b" not in printable(EVIL) and "\n" not in printable(EVIL)


def test_the_queued_line_prints_another_users_job_and_name_without_control_characters() -> None:
    info = {
        "kind": "slot",
        "want": 2,
        "holders": [{"kind": "slot", "job": EVIL, "user": "bob\x1b[2J", "since": 1e300}],
        "ahead": [{"kind": "slot", "job": "x\x07", "user": "carol\r"}],
        "position": 2,
    }
    text = waiting_text({"node1": parse_message(Waiting, info)}, {})
    assert not any(ord(c) < 32 or c == "\x7f" for c in text)
    assert "held by ]0;pwnedjob[8m-hiddenstarted: yours (bob[2J) since" in text
    assert "behind x (carol); 2nd in line" in text


def test_status_hosts_cells_carry_no_control_characters_nor_rich_markup() -> None:
    assert _text("[/x]\x1b[31mjob") == "\\[/x][31mjob"
    assert _text(None) == ""


def test_lease_replies_parse_their_parts_into_classes_and_back() -> None:
    state = LeaseState(
        state="waiting",
        info={"kind": "gpu", "want": 1, "holders": [{"kind": "gpu", "job": "a", "user": "b"}]},
    )
    parsed = parse_message(LeaseState, json.loads(json.dumps(lease_record(state))))
    assert parsed.info is not None and parsed.info.holders[0].job == "a"
    assert parsed.info.position == 1 and parsed.warnings == ()


def test_check_warns_of_a_lease_directory_that_root_does_not_own_or_that_is_missing() -> None:
    owned = lease_dir_problems(
        "node1", LeaseDir(dir="/run/lock/orch-leases", exists=True, owner="bob")
    )
    assert [p.message for p in owned] == [
        "lease directory /run/lock/orch-leases belongs to bob, not root: bob can remove "
        "anyone's lease (host node1)"
    ]
    assert "'d /run/lock/orch-leases 1777 root root -'" in owned[0].hint
    missing = lease_dir_problems("node1", LeaseDir(dir="/run/lock/orch-leases", exists=False))
    assert "the first user to lease here will own it" in missing[0].what
    assert lease_dir_problems("n", LeaseDir(dir="/d", exists=True, owner="root")) == []
