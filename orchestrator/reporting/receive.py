"""A job's outputs received from a node's agent into a local directory, whatever the
backend: over SSH from each node (ssh/pull.py), on Slurm from the shared home through
the login node (slurm/outputs.py).

Each node's agent lists what the globs select and sends the files this machine's copy
lacks or holds at another size or mtime (agent/node/outputs.py): a second pull moves
only what changed. What arrives is written as the host says, but never outside the
target directory, whatever the host sends: names are checked one component at a time,
every directory is opened without following symlinks, and files and links are created
beside their final name and renamed into place.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from orchestrator.agent.kernel import framing, layout
from orchestrator.agent.kernel.requests import OutputsRequest
from orchestrator.models.errors import HostError, InputError
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.reporting.pull import Progress, PullReport, default_target
from orchestrator.transport import Transport

MAX_NAME = 4096


def pull(
    record: JobRecord,
    group: HostGroup,
    target: Path,
    paths: Sequence[str],
    nodes: Sequence[NodeRecord],
    progress: Progress | None = None,
) -> list[PullReport]:
    """Pull the outputs that `paths` select (all when empty) from `nodes` into `target`:
    there directly for one node, into `target/<host>/` for several.

    Raises:
        InputError: a path is not inside the output directory.
        HostError: a node could not be reached or its agent failed.
    """
    for path in paths:
        if path.startswith("/") or ".." in path.split("/"):
            raise InputError(
                f"output path {path!r} is not inside the job's output directory",
                "give paths or globs relative to ORCH_OUTPUT_DIR",
            )
    several = len(nodes) > 1
    by_host = {n.host.name: n for n in nodes}

    def one(host: Any, transport: Transport) -> PullReport:
        node = by_host[host.name]
        where = target / host.name if several else target
        report = PullReport(host.name, where)
        receive_from(node, transport, list(paths), SafeTree(where), report, progress)
        return report

    results, failures = group.try_each(one, only=list(by_host))
    if failures:
        raise failures[0]
    return [results[n.host.name] for n in nodes]


def receive_from(
    node: NodeRecord,
    transport: Transport,
    paths: list[str],
    tree: SafeTree,
    report: PullReport,
    progress: Progress | None,
) -> None:
    """Run the node's `outputs` command and write what it sends."""
    request = OutputsRequest(paths=paths, have=tree.listing())
    command, archive = agent.invocation(node.host, "outputs", layout.outputs_dir(node.job_dir))
    process = transport.stream(command, stdin=archive + request.to_json().encode())
    try:
        for kind, meta, chunks in frames(process.stdout):
            if kind == b"F":
                received = tree.write_file(meta, chunks)
                report.files += 1
                report.bytes += received
            elif kind == b"U":
                report.unchanged += 1
            elif kind == b"D":
                tree.make_dir(str(meta["path"]), int(meta["mode"]))
            elif kind == b"L":
                tree.write_link(str(meta["path"]), str(meta["target"]))
            elif kind == b"E":
                report.errors.append(f"{meta.get('path', '')}: {meta['error']}".lstrip(": "))
            if progress is not None:
                progress(report.host, report.bytes)
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        raise HostError(
            node.host.name,
            f"pulling the outputs failed: {exc}",
            "check the host's disk and this machine's, and pull again: what came stays",
        ) from None
    finally:
        process.close()


def frames(stream: IO[bytes]) -> Iterator[tuple[bytes, dict[str, Any], Iterator[bytes]]]:
    """(kind, metadata, the file's chunks) per record, until Z; a file's chunks must be
    consumed before the next record is read."""
    while True:
        kind, payload = framing.read_frame(stream)
        if kind == b"Z":
            return
        if kind == b"B":
            raise ValueError("file bytes out of place")
        meta = json.loads(payload)
        if not isinstance(meta, dict):
            raise ValueError("malformed record")
        yield kind, meta, _chunks(stream) if kind == b"F" else iter(())


def _chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while True:
        kind, payload = framing.read_frame(stream)
        if kind != b"B":
            raise ValueError("a file's bytes cut short")
        if not payload:
            return
        yield payload


def check_name(path: str) -> list[str]:
    """The components of a path the host sent, refused unless it stays inside."""
    parts = path.split("/")
    if (
        not path
        or len(path) > MAX_NAME
        or "\0" in path
        or path.startswith("/")
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise ValueError(f"the host sent a name outside the output directory: {path!r}")
    return parts


class SafeTree:
    """The target directory, written only below itself whatever names arrive."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def listing(self) -> dict[str, list[int]]:
        """{path: [size, mtime_ns]} of the regular files here, links not followed."""
        found: dict[str, list[int]] = {}
        if not self.root.is_dir():
            return found
        for dirpath, _, filenames in os.walk(self.root):
            for name in filenames:
                full = os.path.join(dirpath, name)
                st = os.lstat(full)
                if stat.S_ISREG(st.st_mode):
                    found[os.path.relpath(full, self.root)] = [st.st_size, st.st_mtime_ns]
        return found

    @contextlib.contextmanager
    def parent(self, parts: list[str]) -> Iterator[int]:
        """An fd of the directory that holds `parts[-1]`, made as needed; never through
        a symlink (O_NOFOLLOW on every component)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts[:-1]:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
            yield fd
        finally:
            os.close(fd)

    def make_dir(self, path: str, mode: int) -> None:
        parts = check_name(path)
        with self.parent([*parts, ""]) as fd:
            os.chmod(fd, (mode & 0o777) | 0o700)  # this machine must still write into it

    def write_link(self, path: str, target: str) -> None:
        parts = check_name(path)
        with self.parent(parts) as fd:
            tmp = f".orch-pull-{secrets.token_hex(6)}"
            os.symlink(target, tmp, dir_fd=fd)
            os.replace(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)

    def write_file(self, meta: dict[str, Any], chunks: Iterator[bytes]) -> int:
        """Write one file from its chunks; returns its size."""
        parts = check_name(str(meta["path"]))
        with self.parent(parts) as fd:
            tmp = f".orch-pull-{secrets.token_hex(6)}"
            out = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd
            )
            size = 0
            try:
                for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view) :]
                    size += len(chunk)
                os.fchmod(out, int(meta["mode"]) & 0o777)
                mtime = int(meta["mtime_ns"])
                os.utime(out, ns=(mtime, mtime))
            except BaseException:
                os.close(out)
                os.unlink(tmp, dir_fd=fd)
                raise
            os.close(out)
            os.replace(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
            return size


def bring_back(
    record: JobRecord,
    group: HostGroup,
    nodes: Sequence[NodeRecord],
    target: Path | None,
    notice: Callable[[str], None],
) -> None:
    """At a job's end: pull what its `outputs:` name from `nodes`, and say where it went;
    a failure is a notice (the job's own result stands), with the command to try again."""
    wanted = list(record.view.outputs)
    if not wanted:
        return
    where = target or default_target(record.id)
    try:
        reports = pull(record, group, where, wanted, nodes)
    except (HostError, InputError, OSError) as exc:
        notice(f"could not copy the outputs: {exc}; try again: orch pull {record.id}")
        return
    files = sum(r.files + r.unchanged for r in reports)
    size = sum(r.bytes for r in reports)
    notice(f"outputs: {files} files ({size / 1e6:.1f} MB) in {where}")
    for report in reports:
        for error in report.errors:
            notice(f"outputs: could not copy {error} from {report.host}")
