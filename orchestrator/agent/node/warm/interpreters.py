"""The warm interpreters of this user on this host, so that a resubmitted job's
ranks are forked from a process that imported torch already instead of each
importing it.

One warm process per user, interpreter, environment and agent version (its *key*),
at most `MOST` per user on a host, the least recently used first out. Each lives in
`WORKDIR/warm/HOST/` (the user's owner-only orch directory): `KEY.json` (its record),
`KEY.sock` (where it listens, to its owner only: SO_PEERCRED), `KEY.log`.

- `ensure()` starts one for the key where none runs: a node's supervisor calls it
  when it finds none for its key (fork.py: the node is then forked from it once it
  imported) and once the node ended; `ahead` (stdin: the node's argv, env and warm
  options) once `orch warm JOB` asks, before the job's first submit.
- The warm process itself is serve.py's: it imports the preload modules, refuses to
  serve where they left a thread a fork would break or initialised CUDA, takes the
  fingerprint of everything it imported and of the installed distributions, then
  waits. For each request of its owner it checks the fingerprint (a changed file: it
  answers `stale` and ends) and forks the node's launcher (launch.py), which does
  torchrun's job. It ends after IDLE seconds unused.
- `listing()`: every live one, with its memory; `stop()`: end them.

The node's supervisor asks one to fork its launcher through fork.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import time
from typing import TYPE_CHECKING, Any

from ...host import proc
from ...kernel.fileio import read_json, write_json
from ...kernel.layout import RUN_SCRIPT

if TYPE_CHECKING:
    from ...kernel.requests import WarmOptions

WARM = "warm"  # beside agent/ and jobs/ in the user's orch directory
MOST = 2  # warm processes per user and host: each holds an interpreter with torch
DEFAULT_IDLE_S = 600.0
# Room in the warm process's argv and environment that each forked launcher and rank
# overwrites with its own command line and environment, as an exec would have: ps,
# orch top and the job's tag (kill.py finds strays by it) see what they would cold.
ROOM_VAR = "ORCH_WARM_ROOM"
ARGV_ROOM, ENV_ROOM = 4096, 32768
# Not part of the key: what differs from one SSH session or job to the next, and
# never reaches an import (orch's own variables; the launcher sets each job's).
SESSION_VARS = ("SSH_", "ORCH_", "XDG_SESSION_", "XDG_RUNTIME_DIR", "MOTD_SHOWN")
SESSION_NAMES = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "TERM", "LC_CTYPE", ROOM_VAR})


# ---------------------------------------------------------------- where, which


def version_dir() -> str:
    """The agent version this module runs from (`WORKDIR/agent/<version>`)."""
    here = os.path.realpath(__file__)  # <version>/<package>/node/warm/interpreters.py
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))


def warm_dir() -> str | None:
    """`WORKDIR/warm/<host>`, or None where this agent runs from a temporary copy.
    One directory per host and boot: hosts that share the workdir (an NFS home) must
    not take each other's pids for their own, and a socket serves its host only."""
    agents = os.path.dirname(version_dir())
    if os.path.basename(agents) != "agent":
        return None
    name = re.sub(r"[^A-Za-z0-9._-]", "_", os.uname().nodename)[:64]
    return os.path.join(os.path.dirname(agents), WARM, f"{name}-{proc.boot_id()[:8]}")


def key_env(env: dict[str, str]) -> dict[str, str]:
    """The part of an environment that may change what an import does."""
    return {
        k: v for k, v in env.items() if not k.startswith(SESSION_VARS) and k not in SESSION_NAMES
    }


def rank_env_at_import(env: dict[str, str], nproc: int) -> dict[str, str]:
    """The environment a rank of a node with `nproc` processes starts with, as far as
    an import can tell: torchrun sets OMP_NUM_THREADS=1 where it is unset and more
    than one process runs. The warm process imports with it, so that the thread pools
    sized once at import (OpenMP's, MKL's, OpenBLAS's, torch's intra-op) are a cold
    rank's size."""
    if "OMP_NUM_THREADS" in env or nproc <= 1:
        return dict(env)
    return {**env, "OMP_NUM_THREADS": "1"}


def key_of(python: str, env: dict[str, str], preload: list[str], nproc: int) -> str:
    """The key of a warm process: interpreter, the ranks' environment at import (see
    `rank_env_at_import`), preload, agent version."""
    env = key_env(rank_env_at_import(env, nproc))
    what = [interpreter_identity(python), sorted(env.items()), list(preload), version_dir()]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def interpreter_identity(python: str) -> str:
    """`python` with its folder resolved but not its name: a virtual environment's
    `bin/python` is a link to the base interpreter, and Python finds the environment
    (its `pyvenv.cfg`, its site-packages) from the unresolved path. Resolving the name
    too gave an environment's interpreter the base one's key, and its ranks a warm
    process without the environment's packages."""
    folder, name = os.path.split(os.path.abspath(python))
    return os.path.join(os.path.realpath(folder), name)


def key_file(key: str, suffix: str) -> str:
    return os.path.join(warm_dir() or "", key + suffix)


def records(gone: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every warm record of this user on this host; those of ended processes are
    removed on the way (and added to `gone`)."""
    where = warm_dir() or ""
    found = []
    for name in sorted(os.listdir(where)) if where and os.path.isdir(where) else []:
        if name.endswith(".json"):
            record = read_json(os.path.join(where, name))
            if record is None:
                continue
            if live(record):
                found.append(record)
            else:
                forget(record)
                if gone is not None:
                    gone.append(record)
    return found


def live(record: dict[str, Any]) -> bool:
    """Whether the record's process still runs (the same process: pids are reused)."""
    pid = record.get("pid")
    return (
        isinstance(pid, int)
        and proc.alive(pid)
        and proc.start_time(pid) == record.get("start_time")
        and proc.uid_of(pid) == os.getuid()
    )


def forget(record: dict[str, Any]) -> None:
    key = str(record.get("key"))
    for suffix in (".json", ".sock"):
        with contextlib.suppress(OSError):
            os.unlink(key_file(key, suffix))


def end(record: dict[str, Any]) -> None:
    """End a warm process (never a job's launcher or rank: those left its session)."""
    if live(record):
        proc.signal_pid(int(record["pid"]), signal.SIGKILL)
    forget(record)


# ---------------------------------------------------------------- ensure, list, stop


def ensure(
    python: str, env: dict[str, str], preload: list[str], idle: float, nproc: int
) -> dict[str, Any]:
    """Start a warm process for this interpreter, environment and preload unless one
    runs, importing with the environment the ranks of a node of `nproc` processes
    have; end the least recently used beyond `MOST`.

    Returns:
        `{"key", "pid", "started": bool}`, or `{"error"}`.
    """
    where = warm_dir()
    if where is None:
        return {"error": "the agent runs from a temporary directory"}
    os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
    os.makedirs(where, mode=0o700, exist_ok=True)
    key = key_of(python, env, preload, nproc)
    env = rank_env_at_import(env, nproc)
    import fcntl

    # One start per key at a time: two nodes of a job on one host end together, and
    # each would start a warm process (the second importing torch for nothing).
    with open(key_file(key, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_locked(key, python, env, preload, idle)


def ensure_for(
    options: WarmOptions, request: dict[str, Any], env: dict[str, str]
) -> dict[str, Any]:
    """`ensure` for a node: its launch request's interpreter and process count (launch.py
    `node_request`, `launch_request`), its job's preload and idle time."""
    preload = [str(name) for name in options.preload]
    return ensure(str(request["python"]), env, preload, float(options.idle), int(request["nproc"]))


def _ensure_locked(
    key: str, python: str, env: dict[str, str], preload: list[str], idle: float
) -> dict[str, Any]:
    others = []
    for record in records():
        if record.get("key") == key:
            return {"key": key, "pid": record["pid"], "started": False}
        others.append(record)
    others.sort(key=lambda r: float(r.get("used") or 0))
    for record in others[: max(0, len(others) - (MOST - 1))]:
        end(record)
    import subprocess

    room = {ROOM_VAR: "." * ENV_ROOM}
    argv = [python, os.path.join(version_dir(), RUN_SCRIPT), "warm", "serve", key, str(idle)]
    argv += [json.dumps(preload), "." * ARGV_ROOM]
    # Not the identity of the job whose end started it (ORCH_JOB_ID is the tag `kill`
    # and `top` find a job's processes by): it outlives that job, and serves others.
    mine = {k: v for k, v in env.items() if not k.startswith("ORCH_")}
    with open(key_file(key, ".log"), "ab") as log:
        child = subprocess.Popen(
            argv,
            env={**mine, **room},
            cwd=warm_dir(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # Its record now, so that a request before the imports end says "still starting".
    write_json(
        key_file(key, ".json"),
        {
            "key": key,
            "pid": child.pid,
            "start_time": proc.start_time(child.pid),
            "state": "starting",
        },
    )
    return {"key": key, "pid": child.pid, "started": True}


def listing() -> list[dict[str, Any]]:
    """Every live warm process of this user: key, pid, state, preload, memory, idle."""
    now = time.time()
    shown = []
    for record in records():
        pid = int(record["pid"])
        shown.append(
            {
                "key": record.get("key"),
                "pid": pid,
                "state": record.get("state") or "?",
                "python": record.get("python"),
                "preload": record.get("preload") or [],
                "pss_kb": memory_kb(pid),
                "idle_s": round(now - float(record.get("used") or now), 1),
                "expires_s": record.get("idle"),
            }
        )
    return shown


def memory_kb(pid: int) -> int | None:
    """The process's proportional set size (its share of pages it shares), else RSS."""
    for path, field in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        with contextlib.suppress(OSError, ValueError, IndexError), open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    return None


def stop(key: str | None) -> list[int]:
    """End this user's warm processes (the one of `key`); their pids."""
    ended = []
    for record in records():
        if key is None or record.get("key") == key:
            ended.append(int(record["pid"]))
            end(record)
    return ended
