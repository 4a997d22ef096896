"""Hosts that share a filesystem: grouping (plan.fs_groups), the plan's shared
snapshot, the inventory's `shared_fs:`, and the host side: marks, writer-unique
temporary names, node directories linked to a shared snapshot, and gc that never
takes a snapshot another host's node still uses."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.agent.host import probe as agent_probe
from orchestrator.agent.host import proc
from orchestrator.agent.kernel import layout
from orchestrator.agent.store import gc as agent_gc
from orchestrator.agent.store.content import ContentStore
from orchestrator.agent.store.sync import link_nodes
from orchestrator.models import inventory as inventory_model
from orchestrator.models.errors import SpecError
from orchestrator.models.facts import HostFacts
from orchestrator.models.inventory import Host, load_inventory
from orchestrator.models.job import load_job
from orchestrator.ssh.plan import build_plan, fs_groups


def host(name: str, shared_fs: bool | str | None = None) -> Host:
    return Host(name=name, address=f"10.77.0.{name[-1]}", shared_fs=shared_fs)


def seen(mark: str, *others: str) -> HostFacts:
    return HostFacts(fs_mark=mark, fs_seen=(mark, *others))


# ---------------------------------------------------------------- grouping


def test_hosts_that_found_each_others_marks_form_a_group_in_host_order() -> None:
    hosts = [host("node1"), host("node2"), host("node3"), host("node4")]
    # node1 probed first and saw nothing; node3 saw node1's; node4 saw node2's only.
    facts = {
        "node1": seen("a"),
        "node2": seen("b"),
        "node3": seen("c", "a"),
        "node4": seen("d", "b"),
    }
    assert fs_groups(hosts, facts) == [("node1", "node3"), ("node2", "node4")]


def test_one_sighting_is_enough_and_groups_join_transitively() -> None:
    hosts = [host("node1"), host("node2"), host("node3")]
    facts = {"node1": seen("a"), "node2": seen("b", "a"), "node3": seen("c", "b")}
    assert fs_groups(hosts, facts) == [("node1", "node2", "node3")]


def test_private_disks_make_no_group() -> None:
    hosts = [host("node1"), host("node2")]
    assert fs_groups(hosts, {"node1": seen("a"), "node2": seen("b")}) == []
    # A host whose workdir could not be written (no mark) is alone too.
    assert fs_groups(hosts, {"node1": HostFacts(), "node2": seen("b", "zz")}) == []


def test_the_inventory_says_it_where_it_does() -> None:
    hosts = [
        host("node1", shared_fs=True),
        host("node2", shared_fs="lab"),
        host("node3", shared_fs=True),
        host("node4", shared_fs="lab"),
        host("node5", shared_fs=False),
    ]
    # node5 said false: whatever its probe found, it is alone.
    facts = {"node5": seen("e", "a")}
    assert fs_groups(hosts, facts) == [("node1", "node3"), ("node2", "node4")]


def test_an_explicit_host_is_never_joined_by_marks() -> None:
    hosts = [host("node1", shared_fs=False), host("node2")]
    facts = {"node1": seen("a"), "node2": seen("b", "a")}
    assert fs_groups(hosts, facts) == []


# ---------------------------------------------------------------- the plan


def test_nodes_of_a_group_share_one_snapshot_built_by_the_first(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "job.yaml").write_text("name: j\nscript: train.py\n")
    job = load_job(tmp_path / "job.yaml")
    hosts = [host("node1"), host("node2"), host("node3")]
    plan = build_plan(job, hosts, "j-1", "10.77.0.1", 29500, shared=[("node3", "node2")])
    node1, node2, node3 = plan.nodes
    assert node1.shares == () and node1.snapshot_dir == node1.job_dir
    assert node2.shares == node3.shares == ("node2", "node3")  # node order
    assert node2.snapshot_dir == node3.snapshot_dir == "~/.orch/jobs/j-1"
    assert node3.code_dir == "~/.orch/jobs/j-1/code"
    assert node3.job_dir == "~/.orch/jobs/j-1/node3"  # its own files stay its own
    assert {k: [n.host.name for n in v] for k, v in plan.snapshots().items()} == {
        "node1": ["node1"],
        "node2": ["node2", "node3"],
    }


# ---------------------------------------------------------------- inventory


def test_inventory_reads_shared_fs_from_defaults_and_hosts(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(
        "defaults: {shared_fs: true}\n"
        "hosts:\n"
        "  - {name: a, address: 10.0.0.1}\n"
        "  - {name: b, address: 10.0.0.2, shared_fs: scratch}\n"
        "  - {name: c, address: 10.0.0.3, shared_fs: false}\n"
    )
    assert [h.shared_fs for h in load_inventory(path).hosts] == [True, "scratch", False]


@pytest.mark.parametrize("value", ["''", "3", "[a]"])
def test_a_bad_shared_fs_names_its_line(tmp_path: Path, value: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(f"hosts:\n  - {{name: a, address: 10.0.0.1, shared_fs: {value}}}\n")
    with pytest.raises(SpecError, match="shared_fs") as info:
        load_inventory(path)
    assert info.value.line == 2


@pytest.mark.parametrize("name", ["code", "agent", "snapshot.json", ".", ".."])
def test_names_of_a_job_directorys_own_files_are_not_host_names(tmp_path: Path, name: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(f"hosts:\n  - {{name: '{name}', address: 10.0.0.1}}\n")
    with pytest.raises(SpecError, match="reserved"):
        load_inventory(path)


def test_the_inventory_reserves_what_the_agent_does() -> None:
    assert inventory_model.RESERVED_NAMES == layout.RESERVED_NAMES


# ---------------------------------------------------------------- host side


def test_marks_are_found_through_another_path_to_the_same_directory(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "shared")
    assert agent_probe.fs_marks(str(tmp_path / "shared"), "aaaa", ["aaaa", "bbbb"]) == ["aaaa"]
    found = agent_probe.fs_marks(str(tmp_path / "alias"), "bbbb", ["aaaa", "bbbb"])
    assert found == ["aaaa", "bbbb"]
    assert agent_probe.fs_marks(str(tmp_path / "other"), "cccc", ["aaaa"]) == []


def test_old_marks_are_swept_and_bad_ones_refused(tmp_path: Path) -> None:
    marks = tmp_path / layout.FS_MARKS
    marks.mkdir()
    (marks / "old").touch()
    os.utime(marks / "old", (0, 0))
    # Looked for before the sweep, which then takes it.
    assert agent_probe.fs_marks(str(tmp_path), "new", ["../x", "old"]) == ["old"]
    assert sorted(os.listdir(marks)) == ["new"]
    assert agent_probe.fs_marks(str(tmp_path), "../escape", []) is None


def _piece(data: bytes) -> dict[str, object]:
    return {"k": hashlib.sha256(data).hexdigest(), "off": 0, "size": len(data), "z": 0}


def test_two_writers_of_one_object_never_collide(tmp_path: Path) -> None:
    store = ContentStore(str(tmp_path / "store"))
    data = b"x" * 100
    half = {**_piece(data), "off": 0}
    # Two hosts' pushes write the first half, then each finishes: distinct temporary
    # names, and the second finds the object already published.
    assert not store.put_piece({**half, "size": 100}, data[:50], "push-0")
    assert not store.put_piece({**half, "size": 100}, data[:50], "push-1")
    rest = {**_piece(data), "off": 50}
    first_inode = None
    for writer in ("push-0", "push-1"):
        assert store.put_piece(rest, data[50:], writer)
        st = os.stat(store.object_path(str(half["k"])))
        first_inode = first_inode or st.st_ino
        assert st.st_ino == first_inode  # never replaced under a snapshot's links
    assert sorted(os.listdir(store.objects)) == [str(half["k"])]


def test_nodes_of_a_shared_snapshot_get_linked_directories(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "j-1"
    (job / "code").mkdir(parents=True)
    (job / "code" / "f").write_text("hi")
    (job / "agent").mkdir()
    link_nodes(str(job), ["node1", "node2"])
    link_nodes(str(job), ["node1"])  # again: idempotent
    for name in ("node1", "node2"):
        assert (job / name / "code" / "f").read_text() == "hi"
        assert os.readlink(job / name / "agent") == "../agent"
    with pytest.raises(ValueError):
        link_nodes(str(job), ["../x"])
    with pytest.raises(ValueError):
        link_nodes(str(job), ["code"])


def _snapshot(holder: Path, created: float) -> None:
    (holder / "code").mkdir(parents=True)
    (holder / "snapshot.json").write_text(json.dumps({"manifest": "m", "created": created}))


def test_gc_keeps_a_shared_snapshot_while_another_hosts_node_runs(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "j-1"
    _snapshot(job, time.time() - 3600)
    for name in ("node1", "node2"):
        (job / name).mkdir()
        (job / name / "code").symlink_to("../code")
    # node1 (here) ended; node2 runs on another host, its supervisor touching pid.json.
    (job / "node1" / "exit.json").write_text("{}")
    pids = {"pid": 1, "supervisor": 1, "started": time.time() - 3600, "host": "elsewhere/0"}
    (job / "node2" / "pid.json").write_text(json.dumps(pids))
    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=0, sweep=True)
    assert report["running"] == 1 and report["snapshots_removed"] == 0
    assert (job / "code").is_dir()
    # Once node2's heartbeat is stale, the job is over there too.
    stale = time.time() - agent_gc.STALE_S - 60
    os.utime(job / "node2" / "pid.json", (stale, stale))
    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=0, sweep=True)
    assert report["snapshots_removed"] == 1
    assert not (job / "code").exists() and (job / "node2" / "pid.json").exists()


def test_gc_judges_its_own_hosts_nodes_by_their_pids(tmp_path: Path) -> None:
    node = tmp_path / "jobs" / "j-2" / "node1"
    _snapshot(node, time.time() - 3600)
    pids = {"pid": os.getpid(), "supervisor": os.getpid(), "host": proc.host_id()}
    (node / "pid.json").write_text(json.dumps(pids))
    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=0, sweep=True)
    assert report["running"] == 1
    pids["supervisor"] = 2**22 + 1  # no such process
    (node / "pid.json").write_text(json.dumps(pids))
    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=0, sweep=True)
    assert report["snapshots_removed"] == 1


def test_gc_keeps_the_snapshot_of_a_spare_whose_keepers_member_lives_there(
    tmp_path: Path,
) -> None:
    """A spare's snapshot no node ever started from: kept while the job's member lives
    in its directory (the keeper may start the next attempt there), however old."""
    spare = tmp_path / "jobs" / "j-3" / "node4"
    _snapshot(spare, time.time() - agent_gc.ABANDONED_S - 60)
    me = {"pid": os.getpid(), "start_time": proc.start_time(os.getpid()), "host": proc.host_id()}
    (spare / "member.json").write_text(json.dumps(me))
    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=0, sweep=True)
    assert report["running"] == 1 and (spare / "code").is_dir()
    (spare / "member.json").write_text(json.dumps({**me, "start_time": -1}))  # pid reused
    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=0, sweep=True)
    assert report["snapshots_removed"] == 1 and not (spare / "code").exists()


def test_gc_keeps_a_node_directory_while_another_hosts_member_touches_its_record(
    tmp_path: Path,
) -> None:
    node = tmp_path / "jobs" / "j-4" / "node2"
    _snapshot(node, time.time() - 3600)
    (node / "exit.json").write_text("{}")  # attempt 0 ended here; the keeper acts on
    (node / "member.json").write_text(json.dumps({"pid": 1, "host": "elsewhere/0"}))
    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=0, sweep=True)
    assert report["running"] == 1
    stale = time.time() - agent_gc.STALE_S - 60
    os.utime(node / "member.json", (stale, stale))
    report = agent_gc.collect_garbage(str(tmp_path), keep=0, grace_s=0, sweep=True)
    assert report["snapshots_removed"] == 1


def test_a_job_pins_the_directory_that_holds_the_running_agent(tmp_path: Path) -> None:
    """The agent's version directory holds its package: the job's `agent` link must
    land there from whichever room of the package pin_agent runs."""
    from orchestrator.agent import main as agent_main
    from orchestrator.agent.store.sync import pin_agent

    version = pin_agent(str(tmp_path))
    linked = (tmp_path / layout.AGENT).resolve()
    assert linked == Path(agent_main.__file__).resolve().parents[1]
    assert version == linked.name
