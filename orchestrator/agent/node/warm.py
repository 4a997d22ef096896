"""`warm ahead|list|stop|serve`: warm interpreters, so that a resubmitted job's ranks
are forked from a process that imported torch already instead of each importing it.

One warm process per user, interpreter, environment and agent version (its *key*),
at most `MOST` per user on a host, the least recently used first out. Each lives in
`WORKDIR/warm/HOST/` (the user's owner-only orch directory): `KEY.json` (its record),
`KEY.sock` (where it listens, to its owner only: SO_PEERCRED), `KEY.log`.

- `ensure()` starts one for the key where none runs: the supervisor calls it once a
  job's node ended; `ahead` (stdin: the node's argv, env and warm options) once
  `orch warm JOB` asks, before the job's first submit.
- `serve KEY IDLE PRELOAD ROOM`: the warm process itself (warm_serve.py). It imports
  the preload modules, refuses to serve where they left a thread a fork would break
  or initialised CUDA, takes the fingerprint of everything it imported and of the
  installed distributions, then waits. For each request of its owner it checks the
  fingerprint (a changed file: it answers `stale` and ends) and forks the node's
  launcher (launch.py), which does torchrun's job. It ends after IDLE seconds unused.
- `list`: every live one, with its memory; `stop [KEY]`: end them (all without KEY).

The node's supervisor asks through `request()`, and waits for one still importing
(the last job ended moments ago: up to `IMPORT_WAIT_S`); whatever is not provably the
same as a fresh interpreter (another key, a changed file, no answer in `ANSWER_S`)
starts cold, and the reason is said once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import socket
import sys
import time
from typing import Any

from ..host import proc
from ..kernel.fileio import read_json, write_json
from ..kernel.layout import KILLED, RUN_SCRIPT
from ..kernel.messages import parse_message
from ..kernel.requests import StartRequest, WarmOptions
from .warm_serve import ANSWER_S, serve

WARM = "warm"  # beside agent/ and jobs/ in the user's orch directory
MOST = 2  # warm processes per user and host: each holds an interpreter with torch
DEFAULT_IDLE_S = 600.0
# A node whose warm process is still importing (the last job ended moments ago) waits
# for it, up to this: a cold start would import the same again beside it, and end
# later. Past it, the import is taken for stuck and the node starts cold.
IMPORT_WAIT_S = 60.0
# Room in the warm process's argv and environment that each forked launcher and rank
# overwrites with its own command line and environment, as an exec would have: ps,
# orch top and the job's tag (kill.py finds strays by it) see what they would cold.
ROOM_VAR = "ORCH_WARM_ROOM"
ARGV_ROOM, ENV_ROOM = 4096, 32768
# Not part of the key: what differs from one SSH session or job to the next, and
# never reaches an import (orch's own variables; the launcher sets each job's).
SESSION_VARS = ("SSH_", "ORCH_", "XDG_SESSION_", "XDG_RUNTIME_DIR", "MOTD_SHOWN")
SESSION_NAMES = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "TERM", "LC_CTYPE", ROOM_VAR})


def main(args: list[str]) -> int:
    verb, rest = (args[0], args[1:]) if args else ("", [])
    if verb == "serve":
        launch = serve(rest, _path, version_dir())
        if isinstance(launch, int):
            return launch
        from . import launch as launcher

        # In the forked launcher: returns only in a forked rank, which runs the user's code.
        return launcher.run_node(*launch).run()
    if verb == "ahead":
        try:
            given = parse_message(StartRequest, json.loads(sys.stdin.read() or "{}"))
        except ValueError as exc:  # bad JSON, or a MessageError: a controller of another version
            print(json.dumps({"error": f"warm ahead: {exc}"}))
            return 2
        print(json.dumps(ahead(list(given.argv), given.env, given.warm or WarmOptions())))
        return 0
    if verb == "list":
        print(json.dumps({"warm": listing()}))
        return 0
    if verb == "stop":
        print(json.dumps({"stopped": stop(rest[0] if rest else None)}))
        return 0
    sys.stderr.write("usage: warm ahead|list|stop [KEY]|serve KEY IDLE PRELOAD ROOM\n")
    return 2


# ---------------------------------------------------------------- where, which


def version_dir() -> str:
    """The agent version this module runs from (`WORKDIR/agent/<version>`)."""
    here = os.path.realpath(__file__)  # <version>/<package>/node/warm.py
    return os.path.dirname(os.path.dirname(os.path.dirname(here)))


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


def key_of(python: str, env: dict[str, str], preload: list[str]) -> str:
    """The key of a warm process: interpreter, environment, preload, agent version."""
    what = [os.path.realpath(python), sorted(key_env(env).items()), list(preload), version_dir()]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


def _path(key: str, suffix: str) -> str:
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
            os.unlink(_path(key, suffix))


def end(record: dict[str, Any]) -> None:
    """End a warm process (never a job's launcher or rank: those left its session)."""
    if live(record):
        proc.signal_pid(int(record["pid"]), signal.SIGKILL)
    forget(record)


# ---------------------------------------------------------------- ensure, list, stop


def ensure(python: str, env: dict[str, str], preload: list[str], idle: float) -> dict[str, Any]:
    """Start a warm process for this interpreter, environment and preload unless one
    runs; end the least recently used beyond `MOST`.

    Returns:
        `{"key", "pid", "started": bool}`, or `{"error"}`.
    """
    where = warm_dir()
    if where is None:
        return {"error": "the agent runs from a temporary directory"}
    os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
    os.makedirs(where, mode=0o700, exist_ok=True)
    key = key_of(python, env, preload)
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
    with open(_path(key, ".log"), "ab") as log:
        child = subprocess.Popen(
            argv,
            env={**mine, **room},
            cwd=where,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # Its record now, so that a request before the imports end says "still starting".
    write_json(
        _path(key, ".json"),
        {
            "key": key,
            "pid": child.pid,
            "start_time": proc.start_time(child.pid),
            "state": "starting",
        },
    )
    return {"key": key, "pid": child.pid, "started": True}


def ahead(argv: list[str], env: dict[str, str], options: WarmOptions) -> dict[str, Any]:
    """`orch warm JOB`: start the warm process that this node of the job will be forked
    from, before its first submit. `argv` and `env` are the node's (stdin: the env may
    hold secrets); its supervisor's environment is this session's with the node's on
    top, and so is the key here.

    Returns:
        As `ensure`; `{"error"}` where the node would start cold whatever runs.
    """
    if options.off:
        return {"error": f"the job starts cold: {options.off}"}
    from . import launch

    request = launch.node_request([os.path.expanduser(argv[0]), *argv[1:]])
    if request.get("cold"):
        return {"error": f"the job starts cold: {request['cold']}"}
    preload = [str(name) for name in options.preload]
    return ensure(request["python"], {**os.environ, **env}, preload, float(options.idle))


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


# ---------------------------------------------------------------- the supervisor's side


class Warm:
    """A node launched from a warm process: the launcher's pid, its start time, and
    the connection on which it says how it ended."""

    def __init__(self, pid: int, start_time: int | None, conn: socket.socket) -> None:
        self.pid, self.start_time, self.conn = pid, start_time, conn
        self.buffer = b""

    def wait(self, timeout: float) -> int | None:
        """The launcher's exit code once it ended, else None after `timeout`. A
        launcher that was killed cannot say: -9, as a killed torchrun reads."""
        self.conn.settimeout(timeout)
        while b"\n" not in self.buffer:
            try:
                chunk = self.conn.recv(4096)
            except socket.timeout:  # noqa: UP041 (Python 3.8: not yet TimeoutError)
                return None
            except OSError:
                chunk = b""
            if not chunk:
                return -signal.SIGKILL
            self.buffer += chunk
        line = self.buffer.split(b"\n", 1)[0]
        try:
            return int(json.loads(line)["returncode"])
        except (ValueError, KeyError, TypeError):
            return -signal.SIGKILL


def choose(
    spec: StartRequest, env: dict[str, str], launch: dict[str, Any], check: bool = False
) -> tuple[dict[str, Any] | None, str | None]:
    """The warm process this node may ask, else why it starts cold: a line for the
    user, or None where there is nothing to say (warm never asked for, or this user
    has no warm process on this host, as on a first submit). `check`: ask it
    whether it is still the same (before a node waits in line, so that the first
    reply can say why not)."""
    options = spec.warm
    gone: list[dict[str, Any]] = []
    found = records(gone)
    if options is None or not (found or gone):
        return None, None
    if options.off:
        return None, f"cold start: {options.off}"
    if launch.get("cold"):
        return None, f"cold start: {launch['cold']}"
    key = key_of(launch["python"], env, list(options.preload))
    mine = next((r for r in found if r.get("key") == key), None)
    dead = next((r for r in gone if r.get("key") == key), None)
    if mine is None and dead is not None:
        return None, (
            f"cold start: the warm interpreter (pid {dead.get('pid')}) is gone; "
            "a new one starts when the job ends"
        )
    if mine is None:
        return None, (
            "cold start: no warm interpreter for this job's environment, interpreter or "
            "preload here yet (one starts when the job ends)"
        )
    if mine.get("state") == "starting":
        if check:  # said before the node waits in line: it waits for the import later
            return mine, None
        mine, why = until_imported(mine)
        if mine is None:
            return None, why
    if mine.get("state") == "refused":
        return None, f"cold start: {mine.get('why')}"
    if mine.get("state") != "ready":
        return None, f"cold start: the warm interpreter is {mine.get('state')}"
    if check:
        why = ask(mine, {"check": True})[2]
        if why:
            return None, why
    return mine, None


def until_imported(mine: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """Wait for a warm process that is still importing its preload (up to
    IMPORT_WAIT_S; not once the node was killed).

    Returns:
        (its record once it is ready or refused, None), or (None, why the node starts
        cold; None when it was killed: nothing is to start).
    """
    deadline = time.monotonic() + IMPORT_WAIT_S
    pause = 0.01
    while time.monotonic() < deadline:
        if os.path.exists(KILLED):
            return None, None
        time.sleep(pause)
        pause = min(pause * 2, 0.1)
        record = read_json(_path(str(mine["key"]), ".json"))
        if record is None or record.get("pid") != mine.get("pid") or not live(record):
            return None, (
                f"cold start: the warm interpreter (pid {mine.get('pid')}) ended while "
                "it imported; a new one starts when the job ends"
            )
        if record.get("state") != "starting":
            return record, None
    return None, (
        f"cold start: the warm interpreter was still importing after {IMPORT_WAIT_S:.0f} s"
    )


def request(
    spec: StartRequest, env: dict[str, str], launch: dict[str, Any]
) -> tuple[Warm | None, str | None]:
    """Ask this user's warm process for the job's environment to fork the node's
    launcher.

    Returns:
        (the launched node, None), or (None, why it starts cold: see `choose`).
    """
    mine, why = choose(spec, env, launch)
    if mine is None:
        return None, why
    conn, reply, why = ask(mine, launch)
    if conn is None:
        return None, why
    return Warm(int(reply["pid"]), reply.get("start_time"), conn), None


def ask(
    mine: dict[str, Any], question: dict[str, Any]
) -> tuple[socket.socket | None, dict[str, Any], str | None]:
    """Send a warm process a launch (or `{"check": true}`: is it still the same?).

    Returns:
        (the connection the launcher answers on, its first reply, None), or (None,
        the reply, why the node starts cold); a warm process that does not answer
        within ANSWER_S is ended, never waited for.
    """
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(ANSWER_S)
    try:
        conn.connect(_path(str(mine["key"]), ".sock"))
        conn.sendall(json.dumps(question).encode() + b"\n")
        answer = b""
        while b"\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    except OSError as exc:
        conn.close()
        end(mine)
        what = "did not answer" if isinstance(exc, socket.timeout) else f"failed ({exc})"
        return (
            None,
            {},
            f"cold start: the warm interpreter {what}; it is replaced when the job ends",
        )
    reply = json.loads(answer.split(b"\n", 1)[0] or b"{}")
    if "pid" not in reply or question.get("check"):
        conn.close()
        if reply.get("fresh"):
            return None, reply, None
        forget(mine)
        return None, reply, f"cold start: {reply.get('stale') or 'the warm interpreter went away'}"
    return conn, reply, None
