"""orch's node supervisor: the only code orch runs on a host. Standard library only.

It is sent with the job's code and run with the host's own Python:

    probe [MASTER|OPTIONS]  print this host's facts as JSON (no torch import)
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
MAX_LINE = 8 << 20  # lines up to this long are kept whole; longer ones go in pieces


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

# Queried with nounits so memory is a plain MiB number; one CSV line per GPU.
GPU_QUERY = (
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,driver_version",
    "--format=csv,noheader,nounits",
)
GPU_QUERY_TIMEOUT_S = 10.0
TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


def cmd_probe(args: list[str]) -> int:
    """Print this host's facts as one JSON line, fast: it runs before every submit.

    args: `MASTER`, or one JSON object with any of master (address to route to),
    port (tell whether it is free and who holds it), workdir (free disk there),
    gpus (false skips nvidia-smi) and modules (top-level names to find).
    """
    opts = probe_options(args)
    want_gpus = bool(opts.get("gpus", True))
    # nvidia-smi can take a second on a big box: it runs while the rest is read.
    gpu_query = start_gpu_query() if want_gpus else None
    build = torch_build()
    facts: dict[str, object] = {
        "hostname": socket.gethostname(),
        "os": os_name(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": build.get("version"),
        "torch_cuda": build.get("cuda"),
        "torch_hip": build.get("hip"),
        "nccl": nccl_version(build.get("dir")),
        # The address sshd was reached at: what other hosts most likely reach us at too.
        "ssh_addr": ssh_server_addr(),
        "free_port": free_port(),
    }
    own = own_addresses()
    facts["addresses"] = own
    if opts.get("master"):
        facts.update(route_facts(str(opts["master"]), own))
    if opts.get("port"):
        facts["port"] = port_status(int(opts["port"]))
    if opts.get("workdir"):
        facts["disk_free"] = disk_free(str(opts["workdir"]))
    if opts.get("modules"):
        facts["modules"] = {name: module_found(name) for name in opts["modules"]}
    if gpu_query is not None:
        facts["gpus"] = finish_gpu_query(gpu_query)
    elif want_gpus:  # no nvidia-smi: the device nodes still tell the count
        facts["gpus"] = {"count": device_gpu_count(os.listdir("/dev")), "source": "/dev"}
    facts["time"] = time.time()  # last: the controller compares it with its own clock
    print(json.dumps(facts))
    return 0


def probe_options(args: list[str]) -> dict[str, Any]:
    if not args:
        return {}
    if args[0].startswith("{"):
        opts = json.loads(args[0])
        return opts if isinstance(opts, dict) else {}
    return {"master": args[0]}


def ssh_server_addr() -> str | None:
    """The address sshd was reached at ($SSH_CONNECTION's third field)."""
    fields = os.environ.get("SSH_CONNECTION", "").split()
    return fields[2] if len(fields) >= 3 else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
        return port


def os_name() -> str:
    """PRETTY_NAME of /etc/os-release (`Ubuntu 22.04.4 LTS`), else the kernel's name."""
    try:
        with open("/etc/os-release") as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key == "PRETTY_NAME" and value:
                    return value.strip("\"'")
    except OSError:
        pass
    uname = os.uname()
    return f"{uname.sysname} {uname.release}"


def torch_build() -> dict[str, str | None]:
    """torch's version, CUDA and HIP versions and install dir, read from its files.

    Importing torch costs seconds, and importlib.metadata a tenth of one: torch's own
    version.py holds all of it as plain assignments.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.origin:
        return {}
    torch_dir = os.path.dirname(spec.origin)
    try:
        with open(os.path.join(torch_dir, "version.py")) as f:
            values = parse_version_py(f.read())
    except OSError:
        values = {}
    return {
        "version": values.get("__version__") or "unknown",
        "cuda": values.get("cuda"),
        "hip": values.get("hip"),
        "dir": torch_dir,
    }


def parse_version_py(text: str) -> dict[str, str | None]:
    """The string (or None) constants of torch/version.py: `cuda: Optional[str] = '12.4'`."""
    import ast

    values: dict[str, str | None] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return values
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        constant = value.value if isinstance(value, ast.Constant) else 0
        if isinstance(target, ast.Name) and (constant is None or isinstance(constant, str)):
            values[target.id] = constant
    return values


def nccl_version(torch_dir: str | None) -> str | None:
    """The NCCL that torch loads: pip's `nvidia-nccl-cuXX` wheel beside torch.

    Its version is in the name of its .dist-info directory. None when torch carries
    its own (ROCm's RCCL, a static build) or has none (CPU builds).
    """
    if not torch_dir:
        return None
    try:
        names = os.listdir(os.path.dirname(torch_dir))
    except OSError:
        return None
    return nccl_from_listing(names)


def nccl_from_listing(names: list[str]) -> str | None:
    """`nvidia_nccl_cu12-2.21.5.dist-info` -> `2.21.5` (newest CUDA major first)."""
    found = sorted(
        (n for n in names if n.startswith("nvidia_nccl_cu") and n.endswith(".dist-info")),
        reverse=True,
    )
    if not found:
        return None
    return found[0][: -len(".dist-info")].split("-", 1)[1]


def route_facts(target: str, own: dict[str, str]) -> dict[str, str | None]:
    """The interface and source address this host uses to reach `target`.

    When `target` is one of this host's own addresses, the interface is the one that
    holds it (not `lo`, which `ip route get` reports for local addresses): peers reach
    the master through that interface. `route_error` says why there is no answer.
    """
    facts: dict[str, str | None] = {"iface": None, "local_addr": None, "route_error": None}
    try:
        addr = str(socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0])
    except OSError as exc:
        facts["route_error"] = f"cannot resolve {target}: {exc.strerror or exc}"
        return facts
    if addr in own:
        facts["iface"], facts["local_addr"] = own[addr], addr
        return facts
    try:
        result = subprocess.run(
            ["ip", "-o", "route", "get", addr], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError) as exc:
        facts["route_error"] = f"cannot run ip route get: {exc}"
        return facts
    words = result.stdout.split()
    if "dev" not in words:
        facts["route_error"] = result.stderr.strip() or f"no route to {addr}"
        return facts
    facts["iface"] = words[words.index("dev") + 1]
    facts["local_addr"] = words[words.index("src") + 1] if "src" in words else None
    return facts


def route_to(target: str) -> tuple[str | None, str | None]:
    """(interface, source address) this host uses to reach `target`."""
    facts = route_facts(target, own_addresses())
    return facts["iface"], facts["local_addr"]


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


def disk_free(workdir: str) -> int | None:
    """Bytes free to this user where `workdir` is, or would be once created."""
    path = os.path.abspath(os.path.expanduser(workdir))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def module_found(name: str) -> bool:
    """Whether a top-level module can be found, without running any of its code."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def start_gpu_query() -> subprocess.Popen[str] | None:
    try:
        return subprocess.Popen(
            GPU_QUERY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except OSError:
        return None


def finish_gpu_query(proc: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=GPU_QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"count": None, "error": f"nvidia-smi gave no answer in {GPU_QUERY_TIMEOUT_S:.0f} s"}
    return parse_gpu_query(out, proc.returncode)


def parse_gpu_query(out: str, returncode: int) -> dict[str, Any]:
    """nvidia-smi's CSV answer: the GPUs it lists, and what it said about the others.

    A GPU that fell off the bus shows as a line like `Unable to determine the device
    handle for GPU0000:CA:00.0: Unknown Error` among the others' rows.
    """
    gpus: list[dict[str, Any]] = []
    notes: list[str] = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 3 and fields[0].isdigit():
            memory = fields[2]
            gpus.append(
                {
                    "index": int(fields[0]),
                    "name": fields[1],
                    "memory_mib": int(memory) if memory.isdigit() else None,
                    "driver": fields[3] if len(fields) > 3 else None,
                }
            )
        elif line.strip():
            notes.append(line.strip())
    if returncode != 0 and not gpus:
        return {
            "count": None,
            "source": "nvidia-smi",
            "error": " ".join(notes)[:300] or f"nvidia-smi exited {returncode}",
        }
    result: dict[str, Any] = {"count": len(gpus), "source": "nvidia-smi", "list": gpus}
    if notes:
        result["error"] = " ".join(notes)[:300]
    return result


def device_gpu_count(dev_names: list[str]) -> int:
    """GPUs by their /dev/nvidiaN nodes, where nvidia-smi is not installed."""
    return sum(1 for n in dev_names if n.startswith("nvidia") and n[6:].isdigit())


def port_status(port: int) -> dict[str, Any]:
    """Whether `port` can be bound as torchrun's store binds it, and if not, by whom."""
    try:
        with socket.socket() as s:
            # As c10d's TCPStore does: a TIME_WAIT leftover does not make a port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
        return {"port": port, "free": True}
    except OSError as exc:
        return {"port": port, "free": False, "error": exc.strerror, "holders": port_holders(port)}


def port_holders(port: int) -> list[dict[str, Any]]:
    """The sockets on `port` and, where /proc lets us see them, their processes."""
    sockets: list[dict[str, Any]] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                sockets += [s for s in parse_tcp_table(f.read()) if s["port"] == port]
        except OSError:
            continue
    sockets = [s for s in sockets if s["state"] != "TIME_WAIT"]
    sockets.sort(key=lambda s: s["state"] != "LISTEN")
    owners = socket_owners({s["inode"] for s in sockets})
    holders = []
    for s in sockets:
        pid = owners.get(s["inode"])
        holders.append(
            {
                "pid": pid,
                "command": process_command(pid) if pid else None,
                "user": user_name(s["uid"]),
                "state": s["state"],
                "addr": s["addr"],
            }
        )
    return holders


def parse_tcp_table(text: str) -> list[dict[str, Any]]:
    """Rows of /proc/net/tcp or tcp6: local address and port, state, uid, inode."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or ":" not in fields[1]:
            continue
        hex_addr, hex_port = fields[1].rsplit(":", 1)
        rows.append(
            {
                "addr": hex_address(hex_addr),
                "port": int(hex_port, 16),
                "state": TCP_STATES.get(fields[3], fields[3]),
                "uid": int(fields[7]),
                "inode": int(fields[9]),
            }
        )
    return rows


def hex_address(hex_addr: str) -> str:
    """/proc/net/tcp's address (little-endian 32-bit words) as text."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words)


def socket_owners(inodes: set[int]) -> dict[int, int]:
    """Which process holds each socket inode; processes we may not look into are skipped."""
    wanted = {f"socket:[{inode}]": inode for inode in inodes if inode}
    owners: dict[int, int] = {}
    if not wanted:
        return owners
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(wanted[target], int(entry))
        if len(owners) == len(wanted):
            break
    return owners


def process_command(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return None
    return " ".join(w.decode("utf-8", "replace") for w in words)[:200]


def user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


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

HEARTBEAT_S = 2.0


def cmd_follow(args: list[str]) -> int:
    """Stream the node's log files from the given byte offsets, as framed chunks.

    Each chunk is a JSON header line `{"k": "data", "s": STREAM, "o": OFFSET, "n": N}`
    followed by N raw bytes: complete lines only, exactly as they are in the file at
    OFFSET, so a reader can mirror the file and never double or lose a line. A
    heartbeat `{"k": "hb"}` comes every HEARTBEAT_S while idle; the last record is
    `{"k": "exit", ...}` once the node has ended and every file is drained, or
    `{"k": "end"}` with `--once` (drain what is there now, then stop).
    """
    os.chdir(os.path.expanduser(args[0]))
    offsets: dict[str, int] = json.loads(args[1]) if len(args) > 1 else {}
    once = "--once" in args[2:]
    out = sys.stdout.buffer
    last_beat = time.monotonic()
    while True:
        finished = node_ended()  # looked at before draining: no line can be missed
        more = False
        for stream, path in log_files():
            more |= send_new(out, stream, path, offsets, final=finished is not None)
        if more:
            out.flush()
            continue  # catch up before sleeping
        if finished is not None:
            send_record(out, {"k": "exit", **finished})
            return 0
        if once:
            send_record(out, {"k": "end", **node_status()})
            return 0
        if time.monotonic() - last_beat >= HEARTBEAT_S:
            send_record(out, {"k": "hb"})
            last_beat = time.monotonic()
        time.sleep(POLL_S)


def node_ended() -> dict[str, Any] | None:
    """How the node ended, or None while it runs (or was never started)."""
    finished = read_json("exit.json")
    if finished is not None:
        finished["killed"] = os.path.exists("killed")
        return finished
    started = read_json("pid.json")
    if started and not alive(started["supervisor"]) and not os.path.exists("exit.json"):
        return {
            "returncode": None,
            "error": "the supervisor vanished (host rebooted?)",
            "killed": os.path.exists("killed"),
        }
    if not started and not os.path.exists("node.json"):
        return {
            "returncode": None,
            "error": "the node was never started",
            "killed": os.path.exists("killed"),
        }
    return None


def node_status() -> dict[str, Any]:
    started = read_json("pid.json")
    return {
        "started": started is not None,
        "ended": node_ended(),
        "running": started is not None and alive(started["pid"]),
    }


def cmd_status(args: list[str]) -> int:
    job_dir = os.path.expanduser(args[0])
    if not os.path.isdir(job_dir):
        send_record(
            sys.stdout.buffer, {"started": False, "running": False, "ended": None, "exists": False}
        )
        return 0
    os.chdir(job_dir)
    send_record(sys.stdout.buffer, {**node_status(), "exists": True})
    return 0


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


def send_new(out: Any, stream: str, path: str, offsets: dict[str, int], final: bool) -> bool:
    """Send the complete lines of `path` past its offset; True when more may be waiting.

    A partial last line waits for its newline, unless the node has ended (`final`) or
    it grew past MAX_LINE: then it goes as it is.
    """
    offset = offsets.get(stream, 0)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(MAX_LINE)
    except OSError:
        return False
    full = len(data) == MAX_LINE
    end = data.rfind(b"\n") + 1
    if (final and not full) or (end == 0 and full):
        end = len(data)  # the node ended: the rest goes; or one line too long for a block
    if end == 0:
        return False
    send_record(out, {"k": "data", "s": stream, "o": offset, "n": end})
    out.write(data[:end])
    offsets[stream] = offset + end
    return full


def send_record(out: Any, record: dict[str, Any]) -> None:
    out.write(json.dumps(record).encode() + b"\n")
    if record.get("k") != "data":
        out.flush()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ---------------------------------------------------------------- kill


def cmd_kill(args: list[str]) -> int:
    """kill JOB_DIR [GRACE [JOB_ID [PORT]]]: stop everything of the job on this host.

    TERM to torchrun's process group and each rank's (torchrun gives every rank its
    own session), and to every process carrying the job's tag in its environment
    (those that escaped with setsid or a double fork); KILL what is left after GRACE
    seconds. Prints what it killed, and whether PORT is free again.
    """
    job_dir = os.path.expanduser(args[0])
    grace = float(args[1]) if len(args) > 1 else 3.0
    job_id = args[2] if len(args) > 2 else None
    port = int(args[3]) if len(args) > 3 else None
    groups: set[int] = set()
    if os.path.isdir(job_dir):
        os.chdir(job_dir)
        job_id = job_id or ((read_json("node.json") or {}).get("env") or {}).get("ORCH_JOB_ID")
        open("killed", "a").close()
        groups = process_groups()
    victims = {pid: cmdline(pid) for pid in remaining(groups, job_id)}
    for pgid in groups:
        kill_group(pgid, signal.SIGTERM)
    for pid in victims:
        signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and remaining(groups, job_id):
        time.sleep(POLL_S)
    forced = remaining(groups, job_id)
    for pgid in groups:
        kill_group(pgid, signal.SIGKILL)
    for pid in forced:
        signal_pid(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and remaining(groups, job_id):
        time.sleep(POLL_S)
    # The supervisor records the exit status once torchrun is reaped.
    while (
        time.monotonic() < deadline
        and os.path.exists("pid.json")
        and not os.path.exists("exit.json")
    ):
        time.sleep(POLL_S)
    while port is not None and time.monotonic() < deadline and port_listening(port):
        time.sleep(POLL_S)
    report: dict[str, Any] = {
        "killed": [[pid, cmd] for pid, cmd in sorted(victims.items())],
        "forced": sorted(forced),
        "remaining": sorted(remaining(groups, job_id)),
    }
    if port is not None:
        report["port_free"] = not port_listening(port)
    send_record(sys.stdout.buffer, report)
    return 0


def process_groups() -> set[int]:
    """The process groups of the node: torchrun's, and each rank's own session."""
    groups = set()
    started = read_json("pid.json")
    if started:
        groups.add(int(started["pgid"]))
    for name in os.listdir("logs") if os.path.isdir("logs") else []:
        if name.endswith(".pid"):
            with contextlib.suppress(OSError, ValueError), open(os.path.join("logs", name)) as f:
                groups.add(int(f.read()))
    return groups


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return "?"


def port_listening(port: int) -> bool:
    """Whether anything on this host listens on TCP `port` (from /proc, no tools needed)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if (
                len(fields) > 3
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                return True
    return False


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
    "status": cmd_status,
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
