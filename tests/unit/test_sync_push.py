"""The whole push, controller and host side, through LocalTransport: this machine is the
host (the same commands run with /bin/sh instead of over SSH). The cluster tests in
tests/integration/test_sync.py do the same over real SSH."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.kernel import framing, layout
from orchestrator.models.errors import InfraError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.sync import push as push_module
from orchestrator.sync.gc import collect_garbage
from orchestrator.sync.manifest import HostMemory, scan_workdir
from orchestrator.sync.push import PushProgress, PushResult, push
from orchestrator.transport import ConnectOptions
from tests.hostile_names import HOSTILE_NAMES


@pytest.fixture(autouse=True)
def _orch_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "orch-home"))


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(
        name="here", address="localhost", python=sys.executable, workdir=str(tmp_path / "host")
    )


@pytest.fixture
def group(host: Host) -> Iterator[HostGroup]:
    with HostGroup([host], ConnectOptions()) as connected:
        connected.connect()
        yield connected


class Pusher:
    """Pushes a workdir as job 1, 2, ... and returns where each snapshot is."""

    def __init__(self, group: HostGroup, host: Host, root: Path, memory: Path) -> None:
        self.group, self.host, self.root = group, host, root
        self.memory = HostMemory(memory)
        self.jobs = 0
        self.updates: list[PushProgress] = []

    def job_dir(self, n: int) -> Path:
        return Path(self.host.workdir) / "jobs" / f"job{n}" / self.host.name

    def __call__(self) -> tuple[Path, PushResult]:
        self.jobs += 1
        job_dir = self.job_dir(self.jobs)
        results = push(
            self.group,
            scan_workdir(self.root),
            {self.host.name: str(job_dir)},
            progress=self.updates.append,
            memory=self.memory,
        )
        return job_dir / "code", results[self.host.name]


@pytest.fixture
def pusher(group: HostGroup, host: Host, tmp_path: Path) -> Pusher:
    (tmp_path / "work").mkdir()
    return Pusher(group, host, tmp_path / "work", tmp_path / "memory")


def listing(root: Path) -> dict[str, tuple[str, str]]:
    """Every path below root: (kind, content hash or link target), links not followed."""
    found: dict[str, tuple[str, str]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir", "")
            else:
                kind = "exec" if path.stat().st_mode & stat.S_IXUSR else "file"
                found[rel] = (kind, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def objects_in_store(host: Host) -> list[Path]:
    return [p for p in (Path(layout.store_dir(host.workdir)) / "objects").glob("*")]


def test_snapshot_is_an_exact_copy_of_a_hostile_tree(pusher: Pusher, tmp_path: Path) -> None:
    work = pusher.root
    for n, name in enumerate(HOSTILE_NAMES):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(f"content {n}\n".encode())
    (work / "a/b/c/d/e/f/g/deep.py").parent.mkdir(parents=True)
    (work / "a/b/c/d/e/f/g/deep.py").write_text("deep\n")
    (work / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (work / "run.sh").chmod(0o755)
    (work / "outputs").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("s")
    (work / "data").symlink_to(tmp_path / "outside")
    (work / "latest.py").symlink_to("run.sh")
    (work / "gone").symlink_to("nowhere")
    (work / ".gitignore").write_text("*.ckpt\n")
    (work / "model.ckpt").write_text("ignored")

    code, result = pusher()

    expected = listing(work)
    del expected["model.ckpt"]
    assert listing(code) == expected
    assert result.files_sent == len(HOSTILE_NAMES) + 3  # the names, deep.py, run.sh, .gitignore
    assert not (Path.cwd() / "pwned").exists() and not (code / "pwned").exists()
    assert listing(code)["data"] == ("link", str(tmp_path / "outside"))  # not followed
    # The job pins the agent that built it, and pushed files are the owner's only:
    # read-only links into the store, or as root (whom modes stop not) private copies.
    assert (code.parent / "agent" / "run.py").is_file()
    assert json.loads((code.parent / "snapshot.json").read_text())["agent"] == agent.version()
    as_root = os.geteuid() == 0
    assert stat.S_IMODE((code / "with space.py").stat().st_mode) == (0o600 if as_root else 0o400)
    assert stat.S_IMODE((code / "run.sh").stat().st_mode) == (0o700 if as_root else 0o500)


def test_unchanged_push_sends_nothing_and_an_edit_sends_one_file(pusher: Pusher) -> None:
    for n in range(20):
        (pusher.root / f"m{n}.py").write_text(f"x = {n}\n")
    first_code, first = pusher()
    assert (first.files_sent, first.round_trips) == (20, 1)

    second_code, second = pusher()
    assert (second.files_sent, second.bytes_sent, second.round_trips) == (0, 0, 1)
    assert listing(second_code) == listing(first_code)

    (pusher.root / "m3.py").write_text("x = 'edited'\n")
    (pusher.root / "m4.py").unlink()
    third_code, third = pusher()
    assert third.files_sent == 1
    assert (third_code / "m3.py").read_text() == "x = 'edited'\n"
    assert not (third_code / "m4.py").exists()
    assert listing(third_code) == listing(pusher.root)


def test_a_snapshot_never_changes_and_unchanged_files_are_stored_once(pusher: Pusher) -> None:
    (pusher.root / "train.py").write_text("v1\n")
    (pusher.root / "big.bin").write_bytes(os.urandom(100_000))
    old, _ = pusher()
    (pusher.root / "train.py").write_text("v2\n")
    (pusher.root / "big.bin").chmod(0o755)
    new, _ = pusher()
    assert (old / "train.py").read_text() == "v1\n"
    assert (new / "train.py").read_text() == "v2\n"
    assert not (old / "big.bin").stat().st_mode & stat.S_IXUSR
    assert (new / "big.bin").stat().st_mode & stat.S_IXUSR  # same bytes, but a new object
    unchanged = pusher.root / "more.py"
    unchanged.write_text("same\n")
    a, _ = pusher()
    b, again = pusher()
    assert again.files_sent == 0  # one object in the store serves both
    # Snapshots link to it, one copy on disk; as root, each has a private copy.
    shared = (a / "more.py").stat().st_ino == (b / "more.py").stat().st_ino
    assert shared == (os.geteuid() != 0)


def test_content_the_host_lost_is_sent_again(pusher: Pusher, host: Host) -> None:
    (pusher.root / "a.py").write_text("a\n")
    (pusher.root / "b.py").write_text("b\n")
    pusher()
    lost = next(p for p in objects_in_store(host) if p.read_bytes() == b"a\n")
    lost.unlink()  # as a gc, or a wiped disk, would
    code, result = pusher()
    assert (result.files_sent, result.round_trips) == (1, 2)
    assert (code / "a.py").read_text() == "a\n"


def test_a_new_controller_learns_what_the_host_has_in_the_first_round_trip(
    pusher: Pusher, group: HostGroup, host: Host, tmp_path: Path
) -> None:
    for n in range(4):
        (pusher.root / f"weights{n}.bin").write_bytes(os.urandom(3 << 20))
    pusher()
    other = Pusher(group, host, pusher.root, tmp_path / "other-memory")
    other.jobs = 10
    code, result = other()
    # It knows nothing of the host: the first round trip carries one batch (4 MB) and
    # the question; the host has everything, so nothing more goes.
    assert (result.files_sent, result.round_trips) == (2, 1)
    assert listing(code) == listing(pusher.root)


def test_a_file_bigger_than_a_round_trip_arrives_whole(pusher: Pusher) -> None:
    weights = os.urandom(9 << 20)  # three pieces, over two round trips
    text = b"loss = 0.1\n" * 500_000  # compressible: pieces travel compressed
    (pusher.root / "weights.bin").write_bytes(weights)
    (pusher.root / "log.txt").write_bytes(text)
    code, result = pusher()
    assert result.round_trips == 2 and result.files_sent == 2
    assert result.wire_bytes < len(weights) + len(text) // 10
    assert (code / "weights.bin").read_bytes() == weights
    assert (code / "log.txt").read_bytes() == text


def test_a_file_changed_after_the_scan_is_refused_and_never_stored(
    group: HostGroup, host: Host, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("before\n")
    tree = scan_workdir(work)
    (work / "train.py").write_text("after!\n")  # same size: only the host's hash check sees it
    with pytest.raises(InfraError) as info:
        push(
            group,
            tree,
            {host.name: str(tmp_path / "host/jobs/j/here")},
            memory=HostMemory(tmp_path / "m"),
        )
    assert "train.py changed while it was being pushed" in info.value.message
    assert objects_in_store(host) == []
    assert not (tmp_path / "host/jobs/j/here/code").exists()


def test_progress_reports_every_host_up_to_its_totals(pusher: Pusher) -> None:
    (pusher.root / "a.bin").write_bytes(os.urandom(3000))
    (pusher.root / "b.bin").write_bytes(os.urandom(5000))
    pusher()
    last = pusher.updates[-1]
    assert last == PushProgress("here", 2, 2, 8000, 8000, finished=True)
    assert pusher.updates[0].files_done == 0


def test_progress_moves_within_a_round_trip(
    pusher: Pusher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round trip holds up to 64 MB: the bar must not wait for its end to move."""
    monkeypatch.setattr(push_module, "PROGRESS_EVERY_S", 0.0)
    for i in range(5):
        (pusher.root / f"f{i}.bin").write_bytes(os.urandom(1000))
    pusher()
    done = [u.files_done for u in pusher.updates if not u.finished]
    assert {1, 2, 3, 4} <= set(done), done  # one round trip, yet every piece was reported
    assert done == sorted(done)


def raw_sync(host: Host, body: bytes, job_dir: Path) -> dict[str, object]:
    """Send the host a manifest `body` of our own making and ask for a snapshot."""
    frames = [
        framing.json_frame(b"H", {"store": layout.store_dir(host.workdir), "push": "t1"}),
        framing.frame(b"M", zlib.compress(body)),
        framing.json_frame(
            b"S", {"digest": hashlib.sha256(body).hexdigest(), "job_dir": str(job_dir), "keep": 5}
        ),
        framing.frame(b"Z"),
    ]
    out = subprocess.run(
        ["/bin/sh", "-c", agent.command(host, "sync")],
        input=agent.packed() + b"".join(frames),
        capture_output=True,
        check=False,
    )
    reply: dict[str, object] = json.loads(out.stdout.decode().splitlines()[-1])
    return reply


@pytest.mark.parametrize(
    "entries",
    [
        [["../escape.py", "l", "/etc/passwd", 0]],
        [["/abs.py", "d", "", 0]],
        [["a/./b", "d", "", 0]],
        [["link", "l", "/tmp", 0], ["link/inside", "d", "", 0]],
        [["x", "f", "not-a-hash", 0]],
    ],
)
def test_the_host_refuses_a_manifest_that_would_write_outside_the_snapshot(
    host: Host, tmp_path: Path, entries: list[list[object]]
) -> None:
    body = json.dumps({"v": 1, "entries": entries}).encode()
    reply = raw_sync(host, body, tmp_path / "job")
    assert "unsafe manifest entry" in str(reply.get("error"))
    assert not (tmp_path / "job").exists() and not (tmp_path / "escape.py").exists()


def test_gc_drops_old_finished_snapshots_and_content_nothing_uses(
    pusher: Pusher, group: HostGroup, host: Host
) -> None:
    snapshots = []
    for n in range(4):
        (pusher.root / "train.py").write_text(f"version {n}\n")
        snapshots.append(pusher()[0])
    for n, code in enumerate(snapshots[:3]):  # jobs 1-3 ended, oldest first; job 4 runs on
        (code.parent / "exit.json").write_text("{}")
        os.utime(code.parent / "exit.json", (time.time() - 100 + n, time.time() - 100 + n))
    report = group.each(lambda h, t: collect_garbage(h, t, keep=1, grace_s=0))[host.name]
    assert [c.exists() for c in snapshots] == [False, False, True, True]
    assert report.snapshots_removed == 2 and report.objects_removed == 2
    assert sorted(p.read_bytes() for p in objects_in_store(host)) == [
        b"version 2\n",
        b"version 3\n",
    ]
    assert (snapshots[0].parent / "exit.json").exists()  # logs and records stay
