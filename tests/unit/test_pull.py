"""`orch pull`: a job's outputs from a host (this machine through
LocalTransport), exact and incremental; and whatever a host sends, nothing is written
outside the target directory."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.agent.kernel import framing, layout
from orchestrator.models.inventory import Host
from orchestrator.models.states import JobState
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.reporting.pull import PullReport
from orchestrator.reporting.receive import SafeTree, frames, pull
from orchestrator.transport import ConnectOptions


def job_on(tmp_path: Path) -> tuple[JobRecord, Path]:
    """A recorded job with one node on this machine, and its output directory there."""
    host = Host(
        name="here", address="localhost", python=sys.executable, workdir=str(tmp_path / "wd")
    )
    job_dir = layout.job_dir(host.workdir, "j-1", "here")
    node = NodeRecord(host, 0, 0, 1, job_dir, JobState.RUNNING)
    record = JobRecord("j-1", "j", JobState.RUNNING, "127.0.0.1", None, {}, [node])
    outputs = Path(layout.outputs_dir(job_dir))
    outputs.mkdir(parents=True)
    return record, outputs


def pull_all(record: JobRecord, target: Path, paths: list[str] | None = None) -> PullReport:
    with HostGroup([n.host for n in record.nodes], ConnectOptions()) as group:
        group.connect()
        return pull(record, group, target, paths or [], record.nodes)[0]


def test_outputs_arrive_exact_and_a_second_pull_moves_only_the_change(tmp_path: Path) -> None:
    record, outputs = job_on(tmp_path)
    (outputs / "ckpt").mkdir()
    (outputs / "ckpt" / "step1.pt").write_bytes(os.urandom(3 << 20))
    (outputs / "run.sh").write_text("#!/bin/sh\n")
    (outputs / "run.sh").chmod(0o700)
    (outputs / "latest").symlink_to("ckpt/step1.pt")
    (outputs / "away").symlink_to("/etc/passwd")
    target = tmp_path / "here"

    first = pull_all(record, target)

    assert (first.files, first.unchanged) == (2, 0)
    assert (target / "ckpt" / "step1.pt").read_bytes() == (
        outputs / "ckpt" / "step1.pt"
    ).read_bytes()
    assert (target / "run.sh").stat().st_mode & 0o777 == 0o700
    assert os.readlink(target / "latest") == "ckpt/step1.pt"
    assert os.readlink(target / "away") == "/etc/passwd", "links travel as links, not followed"

    (outputs / "ckpt" / "step2.pt").write_bytes(b"two")
    second = pull_all(record, target)
    assert (second.files, second.bytes, second.unchanged) == (1, 3, 2)
    assert pull_all(record, target, ["ckpt/step2*"]).files == 0


def test_globs_select_files_and_whole_directories(tmp_path: Path) -> None:
    record, outputs = job_on(tmp_path)
    (outputs / "logs").mkdir()
    (outputs / "logs" / "a.txt").write_text("a")
    (outputs / "model.pt").write_text("m")
    (outputs / "scratch.bin").write_text("s")
    target = tmp_path / "here"
    pull_all(record, target, ["logs", "*.pt"])
    found = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    assert found == ["logs", "logs/a.txt", "model.pt"]


def stream_of(*records: tuple[bytes, dict[str, object] | None, bytes | None]) -> io.BytesIO:
    """What a (hostile) host could send: records, each file's bytes, then Z."""
    out = b""
    for kind, meta, data in records:
        out += framing.json_frame(kind, meta or {})
        if data is not None:
            out += framing.frame(b"B", data) + framing.frame(b"B")
    return io.BytesIO(out + framing.json_frame(b"Z", {}))


def receive(tree: SafeTree, stream: io.BytesIO) -> list[str]:
    """Write what the stream holds, as pull does; the errors, one per refused record."""
    errors = []
    for kind, meta, chunks in frames(stream):
        try:
            if kind == b"F":
                tree.write_file(meta, chunks)
            elif kind == b"L":
                tree.write_link(str(meta["path"]), str(meta["target"]))
            elif kind == b"D":
                tree.make_dir(str(meta["path"]), int(meta["mode"]))
        except (OSError, ValueError) as exc:
            errors.append(str(exc))
            for _ in chunks:
                pass
    return errors


def file_meta(path: str) -> dict[str, object]:
    return {"path": path, "size": 4, "mode": 0o600, "mtime_ns": 0}


@pytest.mark.parametrize(
    "name",
    ["../escape", "/tmp/escape", "a/../../escape", "", ".", "a//b", "a/./b", "with\0nul"],
)
def test_a_name_that_leaves_the_target_is_refused(tmp_path: Path, name: str) -> None:
    target = tmp_path / "target"
    errors = receive(SafeTree(target), stream_of((b"F", file_meta(name), b"evil")))
    assert len(errors) == 1 and "outside the output directory" in errors[0]
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_symlink_the_host_sent_is_never_written_through(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    stream = stream_of(
        (b"L", {"path": "door", "target": str(outside)}, None),
        (b"F", file_meta("door/pwned"), b"evil"),
        (b"L", {"path": "file", "target": str(outside / "victim")}, None),
        (b"F", file_meta("file"), b"safe"),
    )
    errors = receive(SafeTree(target), stream)
    assert len(errors) == 1, errors  # door/pwned: the directory is a link
    assert list(outside.iterdir()) == []
    assert (target / "file").read_bytes() == b"safe" and not (target / "file").is_symlink()


names = st.lists(
    st.sampled_from(["a", "..", ".", "", "b", "/", "\0", "c.pt", "x" * 300]), min_size=1, max_size=5
).map("/".join)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(records=st.lists(st.tuples(st.sampled_from([b"F", b"L", b"D"]), names, names), max_size=6))
def test_whatever_the_host_sends_nothing_lands_outside(
    tmp_path: Path, records: list[tuple[bytes, str, str]]
) -> None:
    base = tmp_path / f"case{os.urandom(4).hex()}"
    target = base / "target"
    sent = []
    for kind, name, other in records:
        if kind == b"F":
            sent.append((kind, file_meta(name), b"data"))
        elif kind == b"L":
            sent.append((kind, {"path": name, "target": "../" + other}, None))
        else:
            sent.append((kind, {"path": name, "mode": 0o755}, None))
    receive(SafeTree(target), stream_of(*sent))
    outside = [p for p in base.rglob("*") if not p.is_relative_to(target) and p != target]
    assert outside == []


def test_a_truncated_or_misplaced_stream_is_an_error_not_a_hang(tmp_path: Path) -> None:
    tree = SafeTree(tmp_path / "target")
    cut = stream_of((b"F", file_meta("a"), b"data"))
    with pytest.raises((ValueError, EOFError)):
        receive(tree, io.BytesIO(cut.getvalue()[:-20]))
    with pytest.raises(ValueError):
        receive(tree, io.BytesIO(framing.frame(b"B", b"x") + framing.json_frame(b"Z", {})))
    with pytest.raises(ValueError):
        receive(tree, io.BytesIO(framing.frame(b"F", json.dumps([1]).encode())))
