"""The node supervisor's side of a warm start: ask this user's warm interpreter for
the job's environment to fork the node's launcher (`request`).

Where none runs for the job's key (a first submit, another env), or the one that ran
is gone or stale, it starts one and waits for its import, as for one still importing
(the last job ended moments ago: up to `IMPORT_WAIT_S`). A warm interpreter that
refused its preload, does not answer in `ANSWER_S` or did not import in time gives
a cold start, and the reason is said once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from typing import Any

from ...kernel.fileio import read_json
from ...kernel.layout import KILLED
from ...kernel.requests import StartRequest
from .interpreters import end, ensure_for, forget, key_file, key_of, live, records
from .serve import ANSWER_S

# A node whose warm process is still importing (the last job ended moments ago) waits
# for it, up to this: a cold start would import the same again beside it, and end
# later. Past it, the import is taken for stuck and the node starts cold.
IMPORT_WAIT_S = 60.0


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
    user, or None where there is nothing to say (warm never asked for).

    Where none runs for the node's key (a first submit, another env, the last one gone
    or stale), one is started here and the node is forked from it once it imported:
    a first submit's ranks are forked as a resubmit's are, torch imported once on the
    host rather than in torchrun's agent and in each rank. `check`: ask a ready one
    whether it is still the same, and start the one the node will wait for (before
    the node waits in line, so that the first reply can say why, and the import runs
    during the wait). The line then says why a new one was started, if not for a
    first submit.
    """
    options = spec.warm
    if options is None:
        return None, None
    gone: list[dict[str, Any]] = []
    found = records(gone)
    if options.off or launch.get("cold"):
        if not (found or gone):  # nothing warm on this host: nothing to say
            return None, None
        return None, f"cold start: {options.off or launch['cold']}"
    key = key_of(launch["python"], env, list(options.preload), int(launch["nproc"]))
    mine = next((r for r in found if r.get("key") == key), None)
    dead = next((r for r in gone if r.get("key") == key), None)
    said = None
    if mine is None and dead is not None:
        said = f"a new warm interpreter: the last one (pid {dead.get('pid')}) is gone"
    if mine is not None and check and mine.get("state") == "ready":
        why = ask(mine, {"check": True})[2]
        if why:  # stale or not answering: forgotten (and ended) by `ask`
            mine, said = None, f"a new warm interpreter: {why}"
    if mine is None:
        mine = start(key, launch, env, spec)
        if mine is None:
            return None, None  # an agent run from a temporary copy keeps none
    if mine.get("state") == "starting":
        if check:  # said before the node waits in line: it waits for the import later
            return mine, said
        mine, why = until_imported(mine)
        if mine is None:
            return None, why
    if mine.get("state") == "refused":
        return None, f"cold start: {mine.get('why')}"
    if mine.get("state") != "ready":
        return None, f"cold start: the warm interpreter is {mine.get('state')}"
    return mine, said


def start(
    key: str, launch: dict[str, Any], env: dict[str, str], spec: StartRequest
) -> dict[str, Any] | None:
    """Start the key's warm process (none ran: `ensure` starts it, or finds the one
    another node of the job on this host just started); its record, still
    importing. None where it cannot run here (the node then starts cold, and a python
    that cannot start is named by the cold start's own error)."""
    options = spec.warm
    assert options is not None
    try:
        started = ensure_for(options, launch, env)
    except (OSError, ValueError):  # no such python, say: the cold start says so, clearly
        return None
    if "error" in started:
        return None
    return read_json(key_file(key, ".json")) or {**started, "state": "starting"}


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
        record = read_json(key_file(str(mine["key"]), ".json"))
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
        return None, f"cold start: {why}; a new warm interpreter starts when the job ends"
    return Warm(int(reply["pid"]), reply.get("start_time"), conn), None


def ask(
    mine: dict[str, Any], question: dict[str, Any]
) -> tuple[socket.socket | None, dict[str, Any], str | None]:
    """Send a warm process a launch (or `{"check": true}`: is it still the same?).

    Returns:
        (the connection the launcher answers on, its first reply, None), or (None,
        the reply, why it cannot serve: stale, or not answering); one that does not
        answer within ANSWER_S is ended, never waited for, and a stale one forgotten.
    """
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(ANSWER_S)
    try:
        conn.connect(key_file(str(mine["key"]), ".sock"))
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
        return None, {}, f"the warm interpreter {what}"
    reply = json.loads(answer.split(b"\n", 1)[0] or b"{}")
    if "pid" not in reply or question.get("check"):
        conn.close()
        if reply.get("fresh"):
            return None, reply, None
        forget(mine)
        return None, reply, str(reply.get("stale") or "the warm interpreter went away")
    return conn, reply, None
