"""`stack JOB_DIR` (stdin: a StackRequest): the Python stack of every rank of this node,
each read at once beside the others, for `orch stack` and the stall watchdog.

1. A rank is the process `logs/rank-N.pid` names, while it runs with the recorded
   start time (pids are reused) and belongs to this user: another user's process is
   never read or signalled.
2. It is read the way its start arranged (`logs/rank-N.trace`, traceable.py): with
   py-spy (`py-spy dump --json`, `--native` when asked), the binary the controller
   carried to `tools_dir` by its hash (the reply's `need_tool` asks for it where it
   is missing); else, or where py-spy may not trace it, through faulthandler: the
   rank's own handler writes its stack to `logs/rank-N.faults` on the signal its
   record names, sent only where /proc says the rank catches it.
3. A rank that cannot be read says why, and how to fix it; the others are read all
   the same. A rank that ends while it is read is `ended`, no error.
4. The node's dump is kept in `stacks/TAKEN.json`, owner-only, beside its logs.
5. With `if_idle` (the stall watchdog), the stacks are taken only where the node's
   ranks have been silent that long (`idle`), so that output the controller has not
   seen yet (a slow link) never looks like a stall.
"""

from __future__ import annotations

import os
import sys
import time

from ..host import proc, tools
from ..kernel import cjson
from ..kernel.fileio import read_json, write_bytes
from ..kernel.layout import CODE, FLIGHT_FILES, FLIGHT_PREFIX, LOGS, PYSPY, STACKS, tool_name
from ..kernel.messages import parse_message
from ..kernel.replies import RankStack, StackReply
from ..kernel.requests import StackRequest
from . import state, traceable

TYPE_CHECKING = False  # for the checker: importing typing costs every host command
if TYPE_CHECKING:
    from typing import Any

    Captured = tuple[int, bytes, bytes]  # exit status, stdout, stderr of a command run

FAULT_SETTLE_S = 0.1  # a faulthandler dump is written at once: still this long, it is whole
NOT_PERMITTED = "tracing not permitted"
# faulthandler's lines; compiled on first use (re's cache): only its text needs them.
_FRAME = r'^\s+File "(.*)", line (\d+) in (.*)$'
_THREAD = r"^(Current thread|Thread) (0x[0-9a-fA-F]+)"
_NAME_CHARS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_.-")


def main(args: list[str]) -> int:
    job_dir = os.path.expanduser(args[0])
    try:
        request = parse_message(StackRequest, cjson.loads(sys.stdin.read() or "{}"))
    except ValueError as exc:  # bad JSON, or a MessageError: a controller of another version
        sys.stderr.write(f"orch agent stack: {exc}\n")
        return 2
    reply = take(job_dir, request)
    sys.stdout.write(cjson.dumps(reply.as_dict()) + "\n")
    return 0


def take(job_dir: str, request: StackRequest) -> StackReply:
    """The node's dump (module docstring), or the py-spy it lacks."""
    machine = os.uname().machine
    if not os.path.isdir(job_dir):
        return StackReply(exists=False, machine=machine)
    tool, missing = pyspy(request, machine)
    if missing is not None:
        return StackReply(need_tool=missing, machine=machine)
    os.chdir(job_dir)
    idle_s = state.idle()
    if request.if_idle is not None and (idle_s is None or idle_s < request.if_idle):
        return StackReply(machine=machine, idle_s=idle_s, skipped=True)
    wanted = set(request.ranks) if request.ranks is not None else None
    found = {r: p for r, p in rank_pids().items() if wanted is None or r in wanted}
    results = read_ranks(found, tool, request.native, request.timeout)
    ranks = [results[r] for r in sorted(results)]
    code = os.path.realpath(CODE) if os.path.isdir(CODE) else None
    reply = StackReply(
        machine=machine, code=code, ranks=ranks, flight=flight_dumps(), idle_s=idle_s
    )
    if request.ranks is None or request.ranks:
        reply.saved = save(request.taken, reply)
    return reply


def pyspy(request: StackRequest, machine: str) -> tuple[str | None, str | None]:
    """(the carried py-spy's path, None), (None, the hash the host lacks), or (None,
    None) where the controller has none for this machine."""
    sha = (request.pyspy or {}).get(machine)
    if not sha or not request.tools_dir:
        return None, None
    folder = os.path.expanduser(request.tools_dir)
    try:
        path = os.path.join(folder, tool_name(PYSPY, sha))
        if not os.access(path, os.X_OK):
            return None, sha
        tools.mine(folder)
    except (OSError, ValueError):
        return None, None
    return path, None


def rank_pids() -> dict[int, int]:
    """rank -> pid, from logs/rank-N.pid, for this user's ranks that still run."""
    found = {}
    for name in os.listdir(LOGS) if os.path.isdir(LOGS) else []:
        if not (name.startswith("rank-") and name.endswith(".pid") and name[5:-4].isdigit()):
            continue
        try:
            with open(os.path.join(LOGS, name)) as f:
                pid, _, when = f.read().partition(" ")
            found[int(name[5:-4])] = (int(pid), int(when))
        except (OSError, ValueError):
            continue
    return {rank: pid for rank, (pid, when) in found.items() if runs(pid, when)}


def runs(pid: int, when: int | None) -> bool:
    """Whether `pid` is still the process that was recorded, and this user's."""
    return proc.alive(pid) and proc.start_time(pid) == when and proc.uid_of(pid) == os.getuid()


def read_ranks(
    found: dict[int, int], tool: str | None, native: bool, timeout: float
) -> dict[int, RankStack]:
    """Every rank's stack (`read_rank`), each read at once beside the others: py-spy
    started for every rank it reads and their outputs collected together, then, in
    threads of their own, the ranks that need more (faulthandler waits for its file).
    No thread where py-spy reads them all: importing threading cost each host's
    stack command 4 ms of CPU."""
    records = {rank: trace_record(rank) for rank in found}
    started = {rank: proc.start_time(pid) for rank, pid in found.items()}  # before any read
    argvs = {
        rank: pyspy_argv(pid, tool, native)
        for rank, pid in found.items()
        if tool is not None and records[rank].get("way") != traceable.FAULTHANDLER
    }
    dumped = {
        rank: pyspy_result(rank, found[rank], native, timeout, outcome)
        for rank, outcome in capture_all(argvs, timeout).items()
    }
    results = {
        rank: dumped[rank] for rank in found if rank in dumped and dumped[rank].error is None
    }
    rest = [rank for rank in found if rank not in results]
    if len(rest) == 1:
        rank = rest[0]
        results[rank] = read_rank(
            rank, found[rank], tool, native, timeout, dumped.get(rank), started[rank]
        )
    elif rest:
        import threading

        def read_one(rank: int) -> None:
            results[rank] = read_rank(
                rank, found[rank], tool, native, timeout, dumped.get(rank), started[rank]
            )

        threads = [threading.Thread(target=read_one, args=(rank,)) for rank in rest]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return results


def trace_record(rank: int) -> dict[str, Any]:
    """What the rank's start arranged for its reading (traceable.py)."""
    return read_json(traceable.trace_file(LOGS, str(rank))) or {}


def read_rank(
    rank: int,
    pid: int,
    tool: str | None,
    native: bool,
    timeout: float,
    dumped: RankStack | None = None,
    when: int | None = None,
) -> RankStack:
    """One rank's stack, the way its start arranged; never raises.

    Args:
        dumped: what py-spy already read of it (read_ranks), where it did.
        when: its start time, read before that (else now).
    """
    when = when if dumped is not None else proc.start_time(pid)
    record = trace_record(rank)
    signum = record.get("signal") if isinstance(record.get("signal"), int) else None
    why = None
    if record.get("way") != traceable.FAULTHANDLER and tool is not None:
        got = dumped if dumped is not None else with_pyspy(rank, pid, tool, native, timeout)
        if got.error is None or not runs(pid, when):
            return ended(rank, pid) if got.error is not None else got
        why = got
    if signum is not None and catches(pid, signum):
        got = with_faulthandler(rank, pid, signum, record.get("faults"), timeout)
        if got.error is not None and not runs(pid, when):
            return ended(rank, pid)
        if native and got.error is None:
            because = why.error if why is not None else record.get("why")
            got.hint = f"native frames need py-spy: {because}"
        return got
    if why is not None:
        return why
    if tool is None:
        return RankStack(
            rank=rank,
            pid=pid,
            error=f"no py-spy for this host ({os.uname().machine}), and the rank did not "
            "arrange faulthandler",
            hint="put a py-spy for this platform where docs/STACKS.md says, or set "
            f"{traceable.ENV_WAY}: faulthandler in the job's env and submit it again",
        )
    return RankStack(
        rank=rank,
        pid=pid,
        error="its start arranged faulthandler, but the rank does not catch its signal",
        hint="it was started by an older orch, or its code replaced the handler",
    )


def ended(rank: int, pid: int) -> RankStack:
    return RankStack(rank=rank, pid=pid, ended=True, error="ended")


def with_pyspy(rank: int, pid: int, tool: str, native: bool, timeout: float) -> RankStack:
    argv = pyspy_argv(pid, tool, native)
    return pyspy_result(rank, pid, native, timeout, capture_all({rank: argv}, timeout)[rank])


def pyspy_argv(pid: int, tool: str | None, native: bool) -> list[str]:
    return [str(tool), "dump", "--pid", str(pid), "--json", *(["--native"] if native else [])]


def pyspy_result(
    rank: int, pid: int, native: bool, timeout: float, outcome: Captured | OSError
) -> RankStack:
    """The rank's stack from what its py-spy did (`capture_all`)."""
    if isinstance(outcome, TimedOut):
        return RankStack(rank=rank, pid=pid, error=f"py-spy took over {timeout:.0f} s")
    if isinstance(outcome, OSError):
        return RankStack(rank=rank, pid=pid, error=f"py-spy could not run: {outcome}")
    returncode, stdout, stderr = outcome
    said = stderr.decode(errors="replace").strip()
    if returncode == 0:
        try:
            threads = [pyspy_thread(t) for t in cjson.loads(stdout)]
            return RankStack(rank=rank, pid=pid, via="py-spy", native=native, threads=threads)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            said = f"unreadable py-spy output: {exc}"
    if "ermission" in said or "not permitted" in said:
        return RankStack(
            rank=rank,
            pid=pid,
            error=f"{NOT_PERMITTED}: {last_line(said)}",
            hint=not_permitted_hint(),
        )
    return RankStack(rank=rank, pid=pid, error=f"py-spy: {last_line(said) or returncode}")


class TimedOut(OSError):
    """A command ran past its time, and was killed."""


def capture(argv: list[str], timeout: float) -> tuple[int, bytes, bytes]:
    """Run `argv` to its end, stdin /dev/null: (exit status, stdout, stderr), the status
    negative for a signal, as subprocess.run(capture_output=True, timeout=) gives them.

    Raises:
        TimedOut: it still ran after `timeout` seconds (it was killed).
        OSError: it could not be started.
    """
    outcome = capture_all({0: argv}, timeout)[0]
    if isinstance(outcome, OSError):
        raise outcome
    code, out, err = outcome
    return code, out, err


def capture_all(argvs: dict[int, list[str]], timeout: float) -> dict[int, Captured | OSError]:
    """Run every command at once, each as `capture` runs one: by key, (exit status,
    stdout, stderr), or the OSError it could not start with, or TimedOut.

    Not subprocess: importing it (with selectors, locale and its own threads'
    machinery) cost every host's stack command 2 to 4 ms of CPU, about 4 times that in
    the wall time of 8 hosts of 2 ranks sharing 2 cores (bench/stack.py); nor a
    thread per command (threading: 4 ms more).
    """
    # `_signal`, not `signal`: that one makes enums of them, importing enum (3 ms).
    import _signal  # type: ignore[import-not-found]
    import select

    # Python ignores SIGPIPE and SIGXFSZ; the tool gets them back, as subprocess does.
    restored = (_signal.SIGPIPE, _signal.SIGXFSZ)
    outcomes: dict[int, Captured | OSError] = {}
    pids: dict[int, int] = {}
    got: dict[int, list[bytes]] = {}  # fd -> what came
    owner: dict[int, int] = {}  # fd -> key
    streams: dict[int, tuple[int, int]] = {}  # key -> (stdout fd, stderr fd)
    poller = select.poll()
    open_fds: set[int] = set()
    try:
        for key, argv in argvs.items():
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            try:
                pids[key] = os.posix_spawn(
                    argv[0],
                    argv,
                    os.environ,
                    file_actions=[
                        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                        (os.POSIX_SPAWN_DUP2, out_w, 1),
                        (os.POSIX_SPAWN_DUP2, err_w, 2),
                    ],
                    setsigdef=restored,
                )
            except OSError as exc:
                os.close(out_r)
                os.close(err_r)
                outcomes[key] = exc
                continue
            finally:
                os.close(out_w)
                os.close(err_w)
            streams[key] = (out_r, err_r)
            for fd in (out_r, err_r):
                got[fd], owner[fd] = [], key
                poller.register(fd, select.POLLIN)
                open_fds.add(fd)
        deadline = time.monotonic() + timeout
        while open_fds and time.monotonic() < deadline:
            for fd, _ in poller.poll(max(deadline - time.monotonic(), 0) * 1000):
                data = os.read(fd, 1 << 16)
                if data:
                    got[fd].append(data)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
    finally:
        late = {owner[fd] for fd in open_fds}  # past their time (or a read failed)
        for key, pid in pids.items():
            if key in late:  # not left running
                os.kill(pid, _signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            if key in late:
                outcomes[key] = TimedOut(argvs[key][0])
            else:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                out_r, err_r = streams[key]
                outcomes[key] = (code, b"".join(got[out_r]), b"".join(got[err_r]))
        for fd in got:
            os.close(fd)
    return outcomes


def not_permitted_hint() -> str:
    scope = traceable.yama_scope()
    where = f"kernel.yama.ptrace_scope is {scope} here; " if scope is not None else ""
    return (
        f"{where}ranks started by this orch allow their own tracing under scope 1; "
        f"elsewhere set {traceable.ENV_WAY}: faulthandler in the job's env and submit it "
        "again (a container may need --cap-add SYS_PTRACE)"
    )


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def pyspy_thread(thread: dict[str, Any]) -> dict[str, Any]:
    """A thread of `py-spy dump --json` in the reply's shape."""
    return {
        "id": thread.get("os_thread_id") or thread.get("thread_id"),
        "name": thread.get("thread_name"),
        "active": bool(thread.get("active")),
        "frames": [
            {"function": f.get("name"), "file": f.get("filename"), "line": f.get("line")}
            for f in thread["frames"]
        ],
    }


def catches(pid: int, signum: int) -> bool:
    """Whether a process has a handler for `signum` (its SigCgt mask in /proc): a
    real-time signal to one without would end it."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def with_faulthandler(
    rank: int, pid: int, signum: int, faults: object, timeout: float
) -> RankStack:
    """Signal the rank and read what its handler appended to its faults file, one
    reader at a time (a lock on the file)."""
    import fcntl

    path = faults if isinstance(faults, str) else traceable.faults_file(LOGS, str(rank))
    try:
        with open(path, "rb") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            before = os.fstat(f.fileno()).st_size
            os.kill(pid, signum)
            text = grown(f, before, time.monotonic() + min(timeout, 5.0))
    except ProcessLookupError:
        return ended(rank, pid)
    except OSError as exc:
        return RankStack(rank=rank, pid=pid, error=f"faulthandler: {exc}")
    if not text:
        return RankStack(rank=rank, pid=pid, error="faulthandler wrote nothing")
    return RankStack(rank=rank, pid=pid, via="faulthandler", threads=faulthandler_threads(text))


def grown(f: Any, before: int, deadline: float) -> str:
    """What was appended to `f` past `before`, once it has stopped growing."""
    size, still_since = before, None
    while time.monotonic() < deadline:
        now = os.fstat(f.fileno()).st_size
        if now != size:
            size, still_since = now, time.monotonic()
        elif still_since is not None and time.monotonic() - still_since >= FAULT_SETTLE_S:
            break
        time.sleep(0.01)
    f.seek(before)
    return str(f.read(size - before).decode(errors="replace"))


def faulthandler_threads(text: str) -> list[dict[str, Any]]:
    """faulthandler's dump (`Thread 0x.. (most recent call first):` then `  File "f",
    line N in name`) in the reply's shape."""
    import re  # here: only faulthandler's text needs it (`re` costs each host command 4 ms)

    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        head = re.match(_THREAD, line)
        if head:
            threads.append({"id": int(head.group(2), 16), "name": None, "frames": []})
            threads[-1]["active"] = head.group(1) == "Current thread"
            continue
        frame = re.match(_FRAME, line)
        if frame and threads:
            where = {"function": frame.group(3), "file": frame.group(1)}
            threads[-1]["frames"].append({**where, "line": int(frame.group(2))})
    return threads


def flight_dumps() -> dict[str, str] | None:
    """NCCL flight-recorder dumps of this node's ranks ({rank: path}): the prefix the
    job's env names, else the one spawn.flight_recorder gave it (FLIGHT_PREFIX), plus the rank."""
    spec = read_json("node.json") or {}
    env = spec.get("env") or {}
    prefix = next((env[n] for n in FLIGHT_FILES if env.get(n)), None)
    prefix = os.path.abspath(os.path.expanduser(prefix or FLIGHT_PREFIX))
    found = {}
    folder, stem = os.path.split(prefix)
    for name in os.listdir(folder or ".") if os.path.isdir(folder or ".") else []:
        if name.startswith(stem) and name[len(stem) :].isdigit():
            found[name[len(stem) :]] = os.path.join(folder, name)
    return found or None


def save(taken: str, reply: StackReply) -> str | None:
    """Keep the node's dump beside its logs: stacks/TAKEN.json."""
    name = "".join(c if c in _NAME_CHARS else "_" for c in taken)[:80] or "stack"
    try:
        os.makedirs(STACKS, mode=0o700, exist_ok=True)
        path = os.path.join(STACKS, f"{name}.json")
        write_bytes(path, cjson.dumps(reply.as_dict()).encode(), 0o600)
    except OSError:
        return None
    return os.path.abspath(path)
