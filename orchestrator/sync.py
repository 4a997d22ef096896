"""Pushing the job's code to hosts: incremental, content-addressed, one snapshot per job.

1. The workdir is scanned into a manifest (`manifest.py`): every path that
   `.gitignore`, `.orchignore` (at any depth, deeper files winning, with negation) and
   the job's `exclude:` patterns leave in, with its kind and sha256.
2. Each host keeps a content store under its workdir. The controller remembers which
   objects it pushed to each host, sends only the ones the host lacks, in one
   compressed stream per host (`wire.py`), all hosts in parallel; the host checks
   that it holds every object of the manifest and says which are missing otherwise.
   An unchanged resubmit sends nothing but that check.
3. The host builds the job's `code/` from hard links into its store
   (`orch_supervisor.py sync`): a push never changes another job's files, and the
   snapshots of ten jobs share every unchanged file.

Old snapshots go when their job has finished and more than ORCH_KEEP_SNAPSHOTS newer
finished ones exist on the host (checked in the background after each push, and by
`orch gc`); then content no snapshot links to goes too.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pathspec

from orchestrator import wire
from orchestrator.manifest import Tree, scan
from orchestrator.models.errors import (
    HostError,
    InputError,
    RemoteCommandError,
)
from orchestrator.models.inventory import Host
from orchestrator.shell import sh_path
from orchestrator.transport import Transport

IGNORE_FILES = (".gitignore", ".orchignore")
ALWAYS_EXCLUDED = (".git/",)


@dataclass(frozen=True)
class _Rules:
    """Ignore patterns of one directory level, relative to `base` (posix, '' = root)."""

    base: str
    spec: pathspec.GitIgnoreSpec
    negates: bool = False  # has `!pattern` lines, which may re-include files below an ignored dir

    def verdict(self, rel: str) -> bool | None:
        if self.base:
            if not rel.startswith(self.base + "/"):
                return None
            rel = rel[len(self.base) + 1 :]
        verdict: bool | None = self.spec.check_file(rel).include
        return verdict


def _read_rules(directory: Path, base: str) -> _Rules | None:
    lines: list[str] = []
    for name in IGNORE_FILES:
        try:
            lines += (directory / name).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
    if not lines:
        return None
    negates = any(line.lstrip().startswith("!") for line in lines)
    return _Rules(base, pathspec.GitIgnoreSpec.from_lines(lines), negates)


def _ignored(rel: str, rules: Iterable[_Rules]) -> bool:
    result = False
    for rule in rules:  # root first: the deepest definite answer wins
        verdict = rule.verdict(rel)
        if verdict is not None:
            result = verdict
    return result


def _skip_dir(rel: str, hard: pathspec.GitIgnoreSpec, rules: list[_Rules]) -> bool:
    """Whether nothing below a directory can be pushed, so it need not be walked.

    An ignored directory is still walked when a negation pattern is active: with `*`,
    `!*/`, `!*.py` the `.py` files below it are wanted, and each file is decided alone.
    """
    if hard.match_file(rel + "/"):
        return True
    return _ignored(rel + "/", rules) and not any(r.negates for r in rules)


def collect_files(root: Path, exclude: Iterable[str] = ()) -> list[str]:
    """Relative posix paths of the files, symlinks and empty dirs to push, sorted.

    Symlinks are kept as links and never followed, so nothing outside the tree is read.
    """
    # .git/ and the job's exclude: patterns are final: no ignore file can bring them back.
    hard = pathspec.GitIgnoreSpec.from_lines([*ALWAYS_EXCLUDED, *exclude])
    found: list[str] = []
    stack: list[tuple[Path, str, list[_Rules]]] = [(root, "", [])]
    while stack:
        directory, base, active = stack.pop()
        own = _read_rules(directory, base)
        active = [*active, own] if own else active
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        if not entries and base and not _ignored(base + "/", active):
            found.append(base + "/")
        for entry in entries:
            rel = f"{base}/{entry.name}" if base else entry.name
            if entry.is_dir(follow_symlinks=False):
                if not _skip_dir(rel, hard, active):
                    stack.append((Path(entry.path), rel, active))
            elif not hard.match_file(rel) and not _ignored(rel, active):
                found.append(rel)
    return sorted(found)


def supervisor_source() -> bytes:
    """The node supervisor script that runs on every host."""
    return resources.files("orchestrator.remote").joinpath("supervisor.py").read_bytes()


def scan_workdir(root: Path, exclude: Iterable[str] = ()) -> Tree:
    """The manifest of what a job pushes from `root` (hashes from the stat cache).

    Raises:
        InputError: a file cannot be read.
    """
    return scan(root, collect_files(root, exclude))


# ---------------------------------------------------------------- hosts

# Runs a supervisor command from a copy in the host's store (store/bin), imported, so
# that Python keeps its bytecode: compiling 50 kB on every push would cost more than
# the push. The copy comes first on stdin (zlib), always, and is written only when the
# host lacks it; the rest of stdin is the command's. One round trip either way. -I -S:
# the stdlib is all it needs, and site-packages of a torch venv take time to import.
LOADER = """\
import os,sys,zlib
n,tag,d=int(sys.argv[1]),sys.argv[2],os.path.expanduser(sys.argv[3])
z=sys.stdin.buffer.read(n)
name="orch_supervisor_"+tag
f=os.path.join(d,name+".py")
if not os.path.exists(f):
    os.makedirs(d,exist_ok=True)
    t="%s.%d"%(f,os.getpid())
    with open(t,"wb") as o:
        o.write(zlib.decompress(z))
    os.replace(t,f)
sys.path.insert(0,d)
sys.exit(__import__(name).main(sys.argv[4:]))
"""
KEEP_ENV = "ORCH_KEEP_SNAPSHOTS"
DEFAULT_KEEP = 10
SHELL_NOT_FOUND = (126, 127)


def store_dir(host: Host) -> str:
    """The host's content store (may start with ~)."""
    return f"{host.workdir.rstrip('/')}/store"


def setup_marker(host: Host, key: str) -> str:
    """Where the host records that setup `key` succeeded (may start with ~)."""
    return f"{store_dir(host)}/setup/{key}"


def host_key(host: Host) -> str:
    """Identifies a store: two inventory names of one machine and workdir share one."""
    return f"{host.user or ''}@{host.address}:{host.port or ''}:{host.workdir}"


def setup_key(script: str, digest: str, python: str) -> str:
    """Names one run of `setup:`: the setup text, the code version and the interpreter
    (a setup that installs packages must run again for another interpreter)."""
    return hashlib.sha256(f"{script}\0{digest}\0{python}".encode()).hexdigest()


def snapshot_retention() -> int:
    """How many finished jobs keep their code snapshot per host: $ORCH_KEEP_SNAPSHOTS.

    Raises:
        InputError: the variable is not a whole number >= 0.
    """
    raw = os.environ.get(KEEP_ENV, "").strip()
    if not raw:
        return DEFAULT_KEEP
    if not raw.isdigit():
        raise InputError(
            f"{KEEP_ENV}={raw!r} is not a whole number (environment)",
            f"set {KEEP_ENV} to how many finished jobs keep their code per host, e.g. 10",
        )
    return int(raw)


@functools.cache
def packed_supervisor() -> bytes:
    """The supervisor as `supervisor_command` wants it first on stdin."""
    return zlib.compress(supervisor_source(), 9)


@functools.cache
def _supervisor_tag() -> str:
    return hashlib.sha256(supervisor_source()).hexdigest()[:16]


def supervisor_command(host: Host, command: str) -> str:
    """The command line that runs a supervisor command; `packed_supervisor()` must come
    first on its stdin."""
    python, loader = sh_path(host.python), shlex.quote(LOADER)
    args = f"{len(packed_supervisor())} {_supervisor_tag()} {sh_path(store_dir(host) + '/bin')}"
    return f"{python} -I -S -c {loader} {args} {command}"


def last_json(stdout: str) -> dict[str, Any] | None:
    """The JSON object a supervisor command printed last, or None."""
    try:
        data = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------- gc


def collect_garbage(
    host: Host, transport: Transport, keep: int, grace_s: float | None = None
) -> dict[str, Any]:
    """Remove the host's snapshots of finished jobs but the newest `keep`, and content
    that no snapshot uses any more.

    Returns:
        {"snapshots_removed", "snapshots_kept", "running", "objects_removed", "bytes_freed"}

    Raises:
        HostError: the host could not collect.
    """
    options: dict[str, Any] = {"workdir": host.workdir, "keep": keep}
    if grace_s is not None:
        options["grace"] = grace_s
    stdin = packed_supervisor() + wire.json_frame(b"H", options)
    result = transport.run(supervisor_command(host, "gc"), stdin=stdin, timeout=600)
    report = last_json(result.stdout)
    if report is None:
        raise RemoteCommandError(
            host.name, "orch_supervisor.py gc", result.exit_code, result.stderr
        )
    if "error" in report:
        raise HostError(host.name, f"gc failed: {report['error']}")
    return report
