"""`start JOB_DIR` (stdin: the node spec): detach a supervisor from the SSH channel, start torchrun in
its own session under it, record the pids; the supervisor waits for torchrun and
records how it ended. Prints a Started reply once torchrun runs. Whether torchrun
starts cold or is forked from a warm interpreter (warm/), how it starts is spawn.py's."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from ..host.daemonize import daemonize
from ..host.proc import host_id, signal_group, start_time
from ..kernel.fileio import read_json, write_json
from ..kernel.layout import (
    CODE,
    EXIT,
    HEARTBEAT_S,
    KILLED,
    LOGS,
    NODE_SPEC,
    OUTPUTS,
    PIDS,
    SUPERVISOR_LOG,
)
from ..kernel.limits import raise_open_files
from ..kernel.messages import MessageError, parse_message
from ..kernel.replies import ExitRecord, Started
from ..kernel.requests import StartRequest
from ..leases import holder
from . import spawn
from .warm import fork, interpreters, launch

if TYPE_CHECKING:
    import subprocess


def main(args: list[str]) -> int:
    """`start JOB_DIR`, the node spec (argv and env) on stdin: never in an argv, where
    every user of the host could read the job's secrets."""
    os.chdir(os.path.expanduser(args[0]))
    given = sys.stdin.read()
    if given.strip():
        write_json(NODE_SPEC, json.loads(given))
    found = read_json(NODE_SPEC)
    if found is None:
        print(json.dumps({"error": "node.json missing or unreadable"}))
        return 2
    try:
        spec = parse_message(StartRequest, found)
    except MessageError as exc:  # a controller of another version
        print(json.dumps({"error": f"the node's start spec: {exc}"}))
        return 2
    if not os.path.isdir(CODE):
        where = os.path.join(os.getcwd(), CODE)
        print(json.dumps({"error": f"the job's code is not on this host: {where} is missing"}))
        return 2
    os.makedirs(LOGS, exist_ok=True)
    return daemonize(
        SUPERVISOR_LOG,
        lambda ready_fd: supervise(spec, ready_fd),
        died="supervisor died before starting torchrun",
    )


def supervise(spec: StartRequest, ready_fd: int) -> int:
    raise_open_files()  # torchrun's rendezvous store serves every rank of the job
    env = dict(os.environ)
    env.update(spec.env)  # a warm process for this job is keyed by it (key_env)
    # Beside the node's directory (layout.outputs_dir): it outlives the code.
    outputs = os.path.join(os.path.dirname(os.getcwd()), OUTPUTS)

    def planned(way: str, lease: dict[str, str]) -> spawn.NodeStart:
        return spawn.plan(way, list(spec.argv), {**env, **lease}, os.getcwd(), outputs, spec.python)

    # A job that asks for warm starts sends their options; `warm: false` and `--cold`
    # send them too, for the line that says why the node starts cold.
    wants_warm = spec.warm is not None
    asked = launch.launch_request(planned(spawn.WARM, {})) if wants_warm else None
    # Said in the first reply, which a node that waits in line sends before its turn.
    said = fork.choose(spec, env, asked, check=True)[1] if asked is not None else None
    turn = holder.wait_turn(spec, ready_fd, [said] if said else [])  # waits in line if busy
    if turn is None:
        return 1
    forked, cold = None, None
    if asked is not None:  # now with the lease's devices
        asked = launch.launch_request(planned(spawn.WARM, turn.env()))
        forked, cold = fork.request(spec, env, asked)
    if forked is not None:
        return supervise_warm(spec, forked, turn, ready_fd, env)
    if os.path.exists(KILLED):  # while it waited for the warm interpreter's import
        holder.release(turn)
        if turn.reported:
            holder.end_in_line("killed before it started")
        else:
            holder.refuse(turn, ready_fd, "killed before it started")
        return 1
    if cold and cold not in turn.warnings:
        turn.warnings = [*turn.warnings, cold]
    start = planned(spawn.COLD, turn.env())
    try:
        proc = spawn.spawn(start)
    except (OSError, ValueError) as exc:
        holder.release(turn)
        write_json(EXIT, ExitRecord(returncode=127, error=str(exc), ended=time.time()).as_dict())
        if not turn.reported:
            error = f"cannot start {start.argv[0]}: {exc}"
            os.write(ready_fd, json.dumps({"error": error}).encode())
        return 1
    # torchrun leads its own process group; the supervisor stays out of it so that it
    # survives a kill of the group and can record how torchrun ended.
    started = Started(
        pid=proc.pid,
        pgid=proc.pid,
        start_time=start_time(proc.pid),  # kill checks it: a pid may be reused
        supervisor=os.getpid(),
        started=time.time(),
        host=host_id(),
    )
    write_json(PIDS, started.as_dict())
    holder.attach(turn, proc.pid)
    signal.signal(signal.SIGTERM, lambda *_: signal_group(proc.pid, signal.SIGTERM))
    if not turn.reported:  # else the reply said queued, and the node started since
        started.warnings = turn.warnings
        os.write(ready_fd, started.to_json().encode())
        os.close(ready_fd)
    while (returncode := wait_child(proc, HEARTBEAT_S)) is None:
        # Hosts sharing this directory cannot see this process: the fresh time
        # tells their gc that the node still runs (gc.snapshot_end).
        with contextlib.suppress(OSError):
            os.utime(PIDS)
    holder.release(turn)  # before the exit record: a job waiting for it may start at once
    write_json(EXIT, ExitRecord(returncode=returncode, ended=time.time()).as_dict())
    if asked is not None and not asked.get("cold"):
        leave_warm(spec, env)
    return 0


def wait_child(child: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The child's exit code once it ended, else None after `timeout`. Woken by the
    kernel the moment it ends (a pidfd): Popen's own wait polls, up to 50 ms late,
    and a kill waits for the exit record this supervisor writes then."""
    import subprocess

    with contextlib.suppress(AttributeError, OSError):  # Python 3.8, Linux before 5.3
        fd = os.pidfd_open(child.pid)
        try:
            if not select.select([fd], [], [], timeout)[0]:
                return None
        finally:
            os.close(fd)
    try:
        return child.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def supervise_warm(
    spec: StartRequest, node: fork.Warm, turn: Any, ready_fd: int, base_env: dict[str, str]
) -> int:
    """As `supervise` once torchrun runs, for a launcher forked from a warm process:
    its pid is the node's process group; it says on its connection how it ended."""
    started = Started(
        pid=node.pid,
        pgid=node.pid,
        start_time=node.start_time,
        supervisor=os.getpid(),
        started=time.time(),
        host=host_id(),
    )
    write_json(PIDS, {**started.as_dict(), "warm": True})
    holder.attach(turn, node.pid)
    signal.signal(signal.SIGTERM, lambda *_: signal_group(node.pid, signal.SIGTERM))
    if not turn.reported:
        started.warnings = turn.warnings
        os.write(ready_fd, started.to_json().encode())
        os.close(ready_fd)
    while True:
        returncode = node.wait(HEARTBEAT_S)
        if returncode is not None:
            break
        with contextlib.suppress(OSError):
            os.utime(PIDS)
    node.conn.close()
    holder.release(turn)
    write_json(EXIT, ExitRecord(returncode=returncode, ended=time.time()).as_dict())
    leave_warm(spec, base_env)
    return 0


def leave_warm(spec: StartRequest, env: dict[str, str]) -> None:
    """Once the node ended: a warm process for the next submit of this job, where it
    asks for one and none runs (started detached; the supervisor does not wait)."""
    options = spec.warm
    if options is None or options.off:
        return
    request = launch.node_request(spawn.in_environment(spec.argv, spec.python))
    if request.get("cold"):
        return  # no fork could do this node's job: nothing to keep warm for it
    with contextlib.suppress(OSError, ValueError):
        interpreters.ensure_for(options, request, env)
