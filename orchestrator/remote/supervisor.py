"""orch's node supervisor: the only code orch runs on a host. Standard library only.

It is sent with the job's code and run with the host's own Python:

    probe [MASTER]          print this host's facts as JSON (no torch import)
    start JOB_DIR           detach, start torchrun in its own session, record pids,
                            wait for it and record its exit status
    follow JOB_DIR [OFFS]   stream every rank's log lines as JSON, from byte offsets,
                            until the node's exit status is known
    kill JOB_DIR [GRACE]    TERM the node's process groups, KILL after GRACE seconds,
                            then sweep processes that carry the job's tag
    rank LOG_DIR KIND TARGET -- ARGS
                            torchrun's entry for each rank: send the rank's output to
                            its own log file, then exec the user's script or module

A job directory holds: node.json (argv, env), code/, logs/rank-N.log and .pid,
torchrun.log, pid.json, exit.json, and `killed` once orch kill ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

POLL_S = 0.05
MAX_LINE = 1 << 20  # a line longer than this is cut into pieces of this size


def write_json(path: str, data: object) -> None:
    """Write atomically, so a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- probe


def cmd_probe(args: list[str]) -> int:
    facts: dict[str, object] = {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": torch_version(),
        # The address sshd was reached at: what other hosts most likely reach us at too.
        "ssh_addr": ssh_server_addr(),
    }
    if args:
        iface, src = route_to(args[0])
        facts["iface"], facts["local_addr"] = iface, src
    with socket.socket() as s:
        s.bind(("", 0))
        facts["free_port"] = s.getsockname()[1]
    print(json.dumps(facts))
    return 0


def ssh_server_addr() -> str | None:
    """The address sshd was reached at ($SSH_CONNECTION's third field)."""
    fields = os.environ.get("SSH_CONNECTION", "").split()
    return fields[2] if len(fields) >= 3 else None


def torch_version() -> str | None:
    """torch's version from its metadata: importing torch costs seconds."""
    try:
        from importlib import metadata

        return metadata.version("torch")
    except Exception:
        return None


def route_to(target: str) -> tuple[str | None, str | None]:
    """The interface and source address this host uses to reach `target`.

    When `target` is one of this host's own addresses, the interface is the one that
    holds it (not `lo`, which `ip route get` reports for local addresses): peers reach
    the master through that interface.
    """
    try:
        addr = str(socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0])
    except OSError:
        return None, None
    own = own_addresses()
    if addr in own:
        return own[addr], addr
    try:
        out = subprocess.run(
            ["ip", "-o", "route", "get", addr], capture_output=True, text=True, timeout=5
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None, None
    dev = out[out.index("dev") + 1] if "dev" in out else None
    src = out[out.index("src") + 1] if "src" in out else None
    return dev, src


def own_addresses() -> dict[str, str]:
    """Map of this host's IPv4 addresses to interface names."""
    try:
        out = subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"127.0.0.1": "lo"}
    result = {}
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            result[parts[parts.index("inet") + 1].split("/")[0]] = parts[1].split("@")[0]
    return result


# ---------------------------------------------------------------- start


def cmd_start(args: list[str]) -> int:
    os.chdir(os.path.expanduser(args[0]))
    if len(args) > 1:
        write_json("node.json", json.loads(args[1]))
    spec = read_json("node.json")
    if spec is None:
        print(json.dumps({"error": "node.json missing or unreadable"}))
        return 2
    os.makedirs("logs", exist_ok=True)
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:  # the daemon: outlives the SSH channel that started it
        os.close(ready_r)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        log = os.open("supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        code = 1
        try:
            code = supervise(spec, ready_w)
        finally:
            os._exit(code)
    os.close(ready_w)
    report = b""
    while chunk := os.read(ready_r, 4096):
        report += chunk
    print(report.decode() or json.dumps({"error": "supervisor died before starting torchrun"}))
    return 0 if report and b'"error"' not in report else 1


def supervise(spec: dict[str, Any], ready_fd: int) -> int:
    env = dict(os.environ)
    env.update(spec["env"])
    argv = list(spec["argv"])
    argv[0] = os.path.expanduser(argv[0])
    try:
        with open("torchrun.log", "ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd="code",
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    except (OSError, ValueError) as exc:
        write_json("exit.json", {"returncode": 127, "error": str(exc), "ended": time.time()})
        os.write(ready_fd, json.dumps({"error": f"cannot start {argv[0]}: {exc}"}).encode())
        return 1
    # torchrun leads its own process group; the supervisor stays out of it so that it
    # survives a kill of the group and can record how torchrun ended.
    started = {"pid": proc.pid, "pgid": proc.pid, "supervisor": os.getpid(), "started": time.time()}
    write_json("pid.json", started)
    signal.signal(signal.SIGTERM, lambda *_: kill_group(proc.pid, signal.SIGTERM))
    os.write(ready_fd, json.dumps(started).encode())
    os.close(ready_fd)
    returncode = proc.wait()
    write_json("exit.json", {"returncode": returncode, "ended": time.time()})
    return 0


def kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# ---------------------------------------------------------------- follow


def cmd_follow(args: list[str]) -> int:
    os.chdir(os.path.expanduser(args[0]))
    offsets: dict[str, int] = json.loads(args[1]) if len(args) > 1 else {}
    pending: dict[str, bytes] = {}
    started = read_json("pid.json") or {}
    last_alive_check = 0.0
    while True:
        finished = read_json("exit.json")  # read before draining: no line can be missed
        emitted = False
        for stream, path in log_files():
            emitted |= drain(stream, path, offsets, pending, final=finished is not None)
        if emitted:
            sys.stdout.flush()
        if finished is not None:
            finished["k"] = "exit"
            finished["killed"] = os.path.exists("killed")
            emit(finished)
            return 0
        now = time.monotonic()
        if now - last_alive_check > 1.0:
            last_alive_check = now
            started = started or read_json("pid.json") or {}
            sup = started.get("supervisor")
            if sup and not alive(sup) and not os.path.exists("exit.json"):
                emit(
                    {
                        "k": "exit",
                        "returncode": None,
                        "error": "supervisor vanished",
                        "killed": os.path.exists("killed"),
                    }
                )
                return 0
        time.sleep(POLL_S)


def log_files() -> list[tuple[str, str]]:
    files = [("node", "torchrun.log")]
    try:
        names = os.listdir("logs")
    except OSError:
        names = []
    for name in sorted(names):
        if name.startswith("rank-") and name.endswith(".log"):
            files.append((name[5:-4], os.path.join("logs", name)))
    return files


def drain(
    stream: str, path: str, offsets: dict[str, int], pending: dict[str, bytes], final: bool
) -> bool:
    """Emit the complete lines of `path` past its offset; True when any were emitted."""
    start = offsets.get(stream, 0) + len(pending.get(stream, b""))
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read()
    except OSError:
        return False
    buf = pending.get(stream, b"") + data
    emitted = False
    offset = offsets.get(stream, 0)
    while True:
        cut = buf.find(b"\n", 0, MAX_LINE)
        if cut < 0 and len(buf) >= MAX_LINE:
            cut = MAX_LINE - 1  # a line this long goes in pieces, whenever its newline comes
        elif cut < 0:
            break
        line, buf = buf[: cut + 1], buf[cut + 1 :]
        offset += len(line)
        emit(
            {
                "k": "line",
                "s": stream,
                "o": offset,
                "t": line.rstrip(b"\n").decode("utf-8", "replace"),
            }
        )
        emitted = True
    if final and buf:
        offset += len(buf)
        emit({"k": "line", "s": stream, "o": offset, "t": buf.decode("utf-8", "replace")})
        buf, emitted = b"", True
    offsets[stream] = offset
    pending[stream] = buf
    return emitted


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------- kill


def cmd_kill(args: list[str]) -> int:
    os.chdir(os.path.expanduser(args[0]))
    grace = float(args[1]) if len(args) > 1 else 3.0
    spec = read_json("node.json") or {"env": {}}
    job_id = spec["env"].get("ORCH_JOB_ID")
    open("killed", "a").close()
    groups = set()
    started = read_json("pid.json")
    if started:
        groups.add(started["pgid"])
    for name in os.listdir("logs") if os.path.isdir("logs") else []:
        if name.endswith(".pid"):
            with contextlib.suppress(OSError, ValueError), open(os.path.join("logs", name)) as f:
                groups.add(int(f.read()))
    victims = {pid for pid, pgid in processes() if pgid in groups} | tagged(job_id)
    for pgid in groups:
        kill_group(pgid, signal.SIGTERM)
    for pid in tagged(job_id):
        signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and remaining(groups, job_id):
        time.sleep(POLL_S)
    left = remaining(groups, job_id)
    for pgid in groups:
        kill_group(pgid, signal.SIGKILL)
    for pid in left:
        signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and remaining(groups, job_id):
        time.sleep(POLL_S)
    # The supervisor records the exit status once torchrun is reaped.
    while time.monotonic() < deadline and started and not os.path.exists("exit.json"):
        time.sleep(POLL_S)
    print(
        json.dumps(
            {
                "killed": sorted(victims),
                "forced": sorted(left),
                "remaining": sorted(remaining(groups, job_id)),
            }
        )
    )
    return 0


def processes() -> list[tuple[int, int]]:
    """(pid, pgid) of every live, non-zombie process in this host's process table."""
    result = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            result.append((int(entry), int(fields[2])))
    return result


def tagged(job_id: str | None) -> set[int]:
    """Processes whose environment carries this job's tag, wherever they moved to."""
    if not job_id:
        return set()
    tag = f"ORCH_JOB_ID={job_id}".encode()
    me = os.getpid()
    found = set()
    for pid, _ in processes():
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    found.add(pid)
        except OSError:
            continue
    return found


def remaining(groups: set[int], job_id: str | None) -> set[int]:
    return {pid for pid, pgid in processes() if pgid in groups} | tagged(job_id)


def signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# ---------------------------------------------------------------- rank


def cmd_rank(args: list[str]) -> int:
    log_dir, kind, target, sep, *user_args = args
    if sep != "--":
        raise SystemExit("orch supervisor: malformed rank arguments")
    rank = os.environ.get("RANK", "0")
    os.makedirs(log_dir, exist_ok=True)
    # torchrun gave this process its own session: its pid is the rank's process group.
    with open(os.path.join(log_dir, f"rank-{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    fd = os.open(
        os.path.join(log_dir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
    )
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    entry = [target] if kind == "script" else ["-m", target]
    os.execv(sys.executable, [sys.executable, "-u", *entry, *user_args])
    return 127  # not reached


COMMANDS = {
    "probe": cmd_probe,
    "start": cmd_start,
    "follow": cmd_follow,
    "kill": cmd_kill,
    "rank": cmd_rank,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print("usage: orch_supervisor.py {" + ",".join(COMMANDS) + "} ...", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:  # the controller went away while following
        sys.exit(0)
