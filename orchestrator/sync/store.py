"""Pushing the job's code to hosts: incremental, content-addressed, one snapshot per job.

1. The workdir is scanned into a manifest (`manifest.py`): every path that
   `.gitignore`, `.orchignore` (at any depth, deeper files winning, with negation) and
   the job's `exclude:` patterns leave in, with its kind and sha256.
2. Each host keeps a content store under its workdir. The controller remembers which
   objects it pushed to each host, sends only the ones the host lacks, in one
   compressed stream per host (`wire.py`), all hosts in parallel; the host checks
   that it holds every object of the manifest and says which are missing otherwise.
   An unchanged resubmit sends nothing but that check.
3. The host builds the job's `code/` from its store (the agent's `sync` command,
   `agent/store/sync.py`): a push never changes another job's files. As another user
   a snapshot is hard links into the read-only store, so the snapshots of ten jobs
   share every unchanged file; as root each snapshot gets files of its own (those an
   ended job's snapshot still holds as built, else copies).

Old snapshots go when their job has finished and more than ORCH_KEEP_SNAPSHOTS newer
finished ones exist on the host (checked in the background after each push, and by
`orch gc`); then content no snapshot links to goes too.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence

from orchestrator.models.environment import environment_digest
from orchestrator.models.errors import (
    InputError,
)
from orchestrator.models.inventory import Host
from orchestrator.models.job import JobSpec
from orchestrator.sync.manifest import Tree

# ---------------------------------------------------------------- hosts

KEEP_ENV = "ORCH_KEEP_SNAPSHOTS"
DEFAULT_KEEP = 10


def host_key(host: Host) -> str:
    """Identifies a store: two inventory names of one machine and workdir share one."""
    return f"{host.user or ''}@{host.address}:{host.port or ''}:{host.workdir}"


def setup_key(script: str, digest: str, python: str) -> str:
    """Names one run of `setup:`: the setup text, the code version and the interpreter
    (a setup that installs packages must run again for another interpreter)."""
    return hashlib.sha256(f"{script}\0{digest}\0{python}".encode()).hexdigest()


def setup_inputs_digest(entries: Iterable[tuple[str, str]], patterns: Sequence[str]) -> str:
    """What a `setup:` with `setup_inputs:` is keyed by instead of the code version: the
    paths and contents (hashes) of the pushed files that the patterns (fnmatch, against
    the path in the workdir) name, so that an edit elsewhere leaves setup cached.

    Args:
        entries: the pushed tree's (path, value) pairs (a file's sha256).
        patterns: the job's `setup_inputs:`.
    """
    import fnmatch
    import json

    chosen = sorted(
        (path, value)
        for path, value in entries
        if any(fnmatch.fnmatchcase(path, p) for p in patterns)
    )
    return hashlib.sha256(json.dumps(chosen).encode()).hexdigest()


def environment_digest_of(job: JobSpec, tree: Tree) -> str | None:
    """The controller's digest of the job's environment (its requirements and the
    wheels pushed with the code), or None where the job has none.

    Raises:
        InputError: `wheels:` holds no wheel that the push carries.
    """
    env = job.environment
    if env is None:
        return None
    wheels: dict[str, str] = {}
    if env.wheels is not None:
        prefix = "" if env.wheels == "." else env.wheels.rstrip("/") + "/"
        wheels = {
            e.path[len(prefix) :]: e.value
            for e in tree.entries
            if e.path.startswith(prefix) and e.path.endswith(".whl") and e.key is not None
        }
        if not wheels and not env.download:  # (none to download is not an error)
            raise job.error(
                "wheels",
                f"no .whl file in {env.wheels_said} travels with the code",
                "put the wheels there, and check that .gitignore, .orchignore and "
                "exclude: leave them in",
            )
    return environment_digest(env, wheels)


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


# ---------------------------------------------------------------- gc
