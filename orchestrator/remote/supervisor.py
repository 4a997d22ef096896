"""orch's node supervisor: the only code orch runs on a host. Standard library only.

It is sent with the job's code and run with the host's own Python:

    probe [MASTER|OPTIONS]  print this host's facts as JSON (no torch import)
    start JOB_DIR           detach, start torchrun in its own session, record pids,
                            wait for it and record its exit status
    follow JOB_DIR [OFFS]   stream every rank's log lines as JSON, from byte offsets,
                            until the node's exit status is known
    kill JOB_DIR [GRACE]    TERM the node's process groups and every process that
                            carries the job's tag; the ranks get GRACE seconds,
                            torchrun goes once they are gone; KILL what is left
    rank LOG_DIR KIND TARGET -- ARGS
                            torchrun's entry for each rank: send the rank's output to
                            its own log file, then exec the user's script or module
    sync                    (stdin: framed) store pushed content, build a job's code/
                            snapshot from hard links into the store; see sync.py
    setup JOB_DIR SPEC      run the job's setup: command in code/, mark it done
    gc                      (stdin: framed) drop old snapshots and unused content

A job directory holds: node.json (argv, env), code/ (its snapshot; snapshot.json
names its manifest), setup.log, logs/rank-N.log and .pid, torchrun.log, pid.json,
exit.json, and `killed` once orch kill ran.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import signal
import struct
import sys
import time
import zlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import subprocess

# socket, subprocess, glob and shutil are imported by the commands that use them: this
# file starts for every command orch runs on a host, and they are a third of its start.

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
    import socket

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
    import socket

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
    import socket
    import subprocess

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
    import subprocess

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
    import subprocess

    try:
        return subprocess.Popen(
            GPU_QUERY, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except OSError:
        return None


def finish_gpu_query(proc: subprocess.Popen[str]) -> dict[str, Any]:
    import subprocess

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
    import socket

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
    import socket

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
    import subprocess

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
COMPRESS_FROM = 4096  # smaller chunks go as they are: latency matters more there


def cmd_follow(args: list[str]) -> int:
    """Stream the node's log files from the given byte offsets, as framed chunks.

    Each chunk is a JSON header line `{"k": "data", "s": STREAM, "o": OFFSET, "n": N}`
    followed by N raw bytes: complete lines only, exactly as they are in the file at
    OFFSET, so a reader can mirror the file and never double or lose a line. With
    `"z": Z` the chunk travels zlib-compressed in Z bytes (logs shrink ~10x, and the
    controller's SSH decryption is what limits throughput). A
    heartbeat `{"k": "hb"}` comes every HEARTBEAT_S while idle; the last record is
    `{"k": "exit", ...}` once the node has ended and every file is drained, or
    `{"k": "end"}` with `--once` (drain what is there now, then stop).
    """
    os.chdir(os.path.expanduser(args[0]))
    offsets: dict[str, int] = json.loads(args[1]) if len(args) > 1 else {}
    once = "--once" in args[2:]
    widen_pipe(1)
    out = sys.stdout.buffer
    last_beat = time.monotonic()
    while True:
        finished = node_ended()  # looked at before draining: no line can be missed
        sent = behind = False
        for stream, path in log_files():
            stream_sent, stream_behind = send_new(
                out, stream, path, offsets, final=finished is not None
            )
            sent, behind = sent or stream_sent, behind or stream_behind
        if sent:
            out.flush()  # now, not at the next heartbeat: latency is the point
            last_beat = time.monotonic()
        if behind:
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


def send_new(
    out: Any, stream: str, path: str, offsets: dict[str, int], final: bool
) -> tuple[bool, bool]:
    """Send the complete lines of `path` past its offset.

    A partial last line waits for its newline, unless the node has ended (`final`) or
    it grew past MAX_LINE: then it goes as it is.

    Returns:
        (whether anything was sent, whether more may be waiting already).
    """
    offset = offsets.get(stream, 0)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(MAX_LINE)
    except OSError:
        return False, False
    full = len(data) == MAX_LINE
    end = data.rfind(b"\n") + 1
    if (final and not full) or (end == 0 and full):
        end = len(data)  # the node ended: the rest goes; or one line too long for a block
    if end == 0:
        return False, False
    payload = data[:end]
    header: dict[str, Any] = {"k": "data", "s": stream, "o": offset, "n": end}
    if end >= COMPRESS_FROM:
        packed = zlib.compress(payload, 1)
        if len(packed) < end * 0.8:
            header["z"], payload = len(packed), packed
    send_record(out, header)
    out.write(payload)
    offsets[stream] = offset + end
    return True, full


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
    (those that escaped with setsid or a double fork). Everything but torchrun itself
    gets up to GRACE seconds to clean up; torchrun has nothing of the user's to save,
    and its interpreter teardown costs ~0.4 s of CPU a node, so it is KILLed as soon
    as the rest is gone. What is left after GRACE is KILLed, again until it is gone.
    Prints what it killed, and whether PORT is free again.
    """
    began = time.monotonic()
    job_dir = os.path.expanduser(args[0])
    grace = float(args[1]) if len(args) > 1 else 3.0
    job_id = args[2] if len(args) > 2 else None
    port = int(args[3]) if len(args) > 3 else None
    groups: set[int] = set()
    agent: set[int] = set()
    if os.path.isdir(job_dir):
        os.chdir(job_dir)
        started = read_json("pid.json") or {}
        job_id = job_id or ((read_json("node.json") or {}).get("env") or {}).get("ORCH_JOB_ID")
        open("killed", "a").close()
        groups = process_groups()
        agent = {int(started["pid"])} if "pid" in started else set()
    victims = {pid: cmdline(pid) for pid in remaining(groups, job_id)}
    for pgid in groups:
        kill_group(pgid, signal.SIGTERM)
    for pid in victims:
        signal_pid(pid, signal.SIGTERM)
    termed = time.monotonic()
    deadline = termed + grace
    while time.monotonic() < deadline and remaining(groups, job_id, spare=agent):
        time.sleep(POLL_S)
    rest_gone = time.monotonic()
    forced = remaining(groups, job_id, spare=agent)
    for pgid in groups:
        kill_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (left := remaining(groups, job_id)):
        for pid in left:  # tagged strays, and anything forked since the last pass
            signal_pid(pid, signal.SIGKILL)
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
        "seconds": {  # where the time went, for `orch -vv kill`
            "scan": round(termed - began, 3),
            "grace": round(rest_gone - termed, 3),
            "confirm": round(time.monotonic() - rest_gone, 3),
        },
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


def tagged(job_id: str | None, table: list[tuple[int, int]]) -> set[int]:
    """Processes whose environment carries this job's tag, wherever they moved to."""
    if not job_id:
        return set()
    tag = f"ORCH_JOB_ID={job_id}".encode()
    me = os.getpid()
    found = set()
    for pid, _ in table:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if tag in f.read().split(b"\0"):
                    found.add(pid)
        except OSError:
            continue
    return found


def remaining(
    groups: set[int], job_id: str | None, spare: set[int] | frozenset[int] = frozenset()
) -> set[int]:
    """The job's live processes: in its groups or carrying its tag, but the `spare` pids."""
    table = processes()
    tags = tagged(job_id, table)
    return {pid for pid, pgid in table if (pgid in groups or pid in tags) and pid not in spare}


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


# ---------------------------------------------------------------- sync
# The code push of orchestrator/sync.py. A host keeps one content store per workdir,
# WORKDIR/store: objects/<sha256>[.x] (read-only; `.x` is executable; one flat
# directory, as every mkdir and rename costs a journal commit on a busy disk),
# manifests/<digest>, setup/<key> (done markers), and bin/ (this script, as sync.py's
# loader runs it). Each job's code/ is a snapshot made of hard links into it,
# so a push never changes a job's files and ten jobs do not cost ten copies. Every
# name arrives framed on stdin (see orchestrator/wire.py), never through a shell.

FRAME = struct.Struct(">cQ")  # kind, payload length
MAX_FRAME = 256 << 20
KEY_RE = re.compile(r"[0-9a-f]{64}(\.x)?")
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
TOKEN_RE = re.compile(r"[0-9A-Za-z_-]{1,64}")
GC_GRACE_S = 600.0  # younger store files may belong to a push in flight
ABANDONED_S = 86400.0  # a snapshot never started (setup failed, say) this long is finished
SWEEP_EVERY_S = 86400.0
GC_EVERY_S = 60.0


class Mismatch(ValueError):
    """Received bytes whose hash is not their key: the file changed during the push."""

    def __init__(self, key: str) -> None:
        super().__init__(f"content of object {key} does not match its hash")
        self.key = key


class Missing(Exception):
    """A snapshot needs objects the store lacks."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"{len(keys)} objects missing")
        self.keys = keys


class ContentStore:
    """WORKDIR/store: content addressed by sha256, written whole or not at all."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.objects = os.path.join(root, "objects")
        self._made: set[str] = set()

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def made(self, path: str) -> str:
        """`path`, created if need be (once per command: a push makes thousands of calls)."""
        if path not in self._made:
            os.makedirs(path, exist_ok=True)
            self._made.add(path)
        return path

    def object_path(self, key: str) -> str:
        """Where an object lives. Keys from the wire are checked here; keys from a
        stored manifest were checked when it was stored."""
        if not KEY_RE.fullmatch(key):
            raise ValueError(f"bad object key {key!r}")
        return f"{self.objects}/{key}"

    def has(self, key: str, size: int) -> bool:
        try:
            return os.stat(f"{self.objects}/{key}").st_size == size
        except OSError:
            return False

    def put_piece(self, meta: dict[str, Any], data: bytes, push: str) -> bool:
        """Write one piece of an object; True when it completed (and was verified)."""
        key, size, off = str(meta["k"]), int(meta["size"]), int(meta["off"])
        final = self.object_path(key)
        if meta.get("z"):
            data = zlib.decompress(data)
        end = off + len(data)
        if off < 0 or end > size:
            raise ValueError(f"piece of {key} out of bounds")
        # Beside its final name: the rename then touches one directory only.
        tmp = f"{self.made(self.objects)}/{key}.{push}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if off == 0 else 0), 0o600)
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(fd, memoryview(data)[written:], off + written)
            if end == size:
                digest = hashlib.sha256(data) if off == 0 else file_hash(tmp)
                if digest.hexdigest() != key[:64]:
                    os.unlink(tmp)
                    raise Mismatch(key)
                # Read-only: the object is shared by every snapshot that links to it.
                os.fchmod(fd, 0o555 if key.endswith(".x") else 0o444)
        finally:
            os.close(fd)
        if end < size:
            return False
        os.replace(tmp, final)
        return True

    def add_manifest(self, body: bytes) -> str:
        parse_manifest(body)
        digest = hashlib.sha256(body).hexdigest()
        write_bytes(os.path.join(self.made(self.path("manifests")), digest), body)
        return digest

    def manifest(self, digest: str) -> list[list[Any]] | None:
        if not DIGEST_RE.fullmatch(digest):
            raise ValueError(f"bad manifest digest {digest!r}")
        try:
            with open(self.path("manifests", digest), "rb") as f:
                entries: list[list[Any]] = json.loads(f.read())["entries"]
                return entries  # checked by parse_manifest before it was stored
        except FileNotFoundError:
            return None

    def setup_marker(self, key: str) -> str:
        if not DIGEST_RE.fullmatch(key):
            raise ValueError(f"bad setup key {key!r}")
        return self.path("setup", key)


def file_hash(path: str) -> Any:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest


def write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write atomically, so a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def parse_manifest(body: bytes) -> list[list[Any]]:
    """The entries [path, kind, value, size] of a manifest, refused unless every path
    stays inside the snapshot: relative, no `..`, and never below a file or symlink."""
    entries: list[list[Any]] = json.loads(body)["entries"]
    if not all(isinstance(e, list) and len(e) == 4 and isinstance(e[0], str) for e in entries):
        raise ValueError("malformed manifest")
    leaves = {path for path, kind, _, _ in entries if kind != "d"}
    for path, kind, value, size in entries:
        parts = path.split("/")
        if (
            "\0" in path
            or any(p in ("", ".", "..") for p in parts)
            or any("/".join(parts[:i]) in leaves for i in range(1, len(parts)))
            or kind not in ("f", "x", "l", "d")
            or not isinstance(value, str)
            or (kind in ("f", "x") and not DIGEST_RE.fullmatch(value))
            or not isinstance(size, int)
        ):
            raise ValueError(f"unsafe manifest entry {path!r}")
    return entries


def entry_key(kind: str, value: str) -> str:
    return value + ".x" if kind == "x" else value


def read_exact(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError("input ended in the middle of a frame")
    return bytes(data)


def read_frame(stream: Any) -> tuple[bytes, bytes]:
    kind, size = FRAME.unpack(read_exact(stream, FRAME.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is too large")
    return kind, read_exact(stream, size)


def cmd_sync(args: list[str]) -> int:
    """Take pieces of objects, manifests and snapshot requests; answer in one JSON line.

    Frames: H header {"store", "push"} first, then any of P {"k", "off", "size", "z"}
    followed by B (its bytes), M (a zlib-compressed manifest), S (a snapshot request),
    and Z at the end.
    """
    widen_pipe(0)
    stream = sys.stdin.buffer
    reply: dict[str, Any] = {"stored": 0, "bytes": 0}
    after: dict[str, Any] | None = None
    try:
        kind, payload = read_frame(stream)
        header = json.loads(payload) if kind == b"H" else None
        if header is None or not TOKEN_RE.fullmatch(str(header.get("push"))):
            raise ValueError("the stream does not start with a valid header")
        store = ContentStore(os.path.expanduser(header["store"]))
        meta: dict[str, Any] = {}
        while True:
            kind, payload = read_frame(stream)
            if kind == b"P":
                meta = json.loads(payload)
            elif kind == b"B":
                reply["stored"] += store.put_piece(meta, payload, header["push"])
                reply["bytes"] += len(payload)
            elif kind == b"M":
                store.add_manifest(zlib.decompress(payload))
            elif kind == b"S":
                request = json.loads(payload)
                reply.update(make_snapshot(store, request))
                after = request if reply.get("snapshot") else None
            elif kind == b"Z":
                break
            else:
                raise ValueError(f"unknown frame {kind!r}")
    except Mismatch as exc:
        reply.update(error=str(exc), changed=exc.key)
    except (OSError, ValueError, KeyError, TypeError, EOFError, zlib.error) as exc:
        reply["error"] = describe_error(exc)
    if "error" in reply:
        with contextlib.suppress(OSError):
            while stream.read(1 << 20):  # take the rest, so that the reply gets through
                pass
    print(json.dumps(reply), flush=True)
    if after is not None and gc_due(store):
        in_background(collect_garbage, os.path.dirname(store.root), int(after["keep"]))
    return 1 if "error" in reply else 0


def widen_pipe(fd: int) -> None:
    """Give the pipe to or from sshd 1 MB instead of 64 kB (Linux): each side then
    waits for the other far less often (a push of 8 hosts on 2 cores: -20% CPU).
    Anything else (a file, a terminal) is left as it is."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def make_snapshot(store: ContentStore, request: dict[str, Any]) -> dict[str, Any]:
    """Build JOB_DIR/code from a stored manifest, if the store holds all of its objects."""
    digest = str(request["digest"])
    entries = store.manifest(digest)
    if entries is None:
        return {"need_manifest": True}
    sizes = {entry_key(k, v): s for _, k, v, s in entries if k in ("f", "x")}
    missing = sorted(key for key, size in sizes.items() if not store.has(key, size))
    if missing:
        return {"missing": missing}
    job_dir = os.path.expanduser(str(request["job_dir"]))
    os.makedirs(job_dir, exist_ok=True)
    try:
        build_tree(store, entries, os.path.join(job_dir, "code"))
    except Missing as exc:  # collected by a concurrent gc since the check above
        return {"missing": exc.keys}
    with open(__file__, "rb") as f:  # the copy in the store that runs this command
        write_bytes(os.path.join(job_dir, "orch_supervisor.py"), f.read(), 0o755)
    write_json(os.path.join(job_dir, "snapshot.json"), {"manifest": digest, "created": time.time()})
    setup = request.get("setup")
    done = isinstance(setup, str) and os.path.exists(store.setup_marker(setup))
    return {"snapshot": True, "setup_done": done}


def build_tree(store: ContentStore, entries: list[list[Any]], code: str) -> None:
    """Create `code` from the entries, all at once: it appears complete or not at all.

    Symlinks come last, so that no path is ever created through one.
    """
    if os.path.lexists(code):
        raise ValueError(f"{code} exists already")
    tmp = f"{code}.part{os.getpid()}"
    dirs = set()
    for path, kind, _, _ in entries:
        path = path if kind == "d" else path.rpartition("/")[0]
        while path and path not in dirs:
            dirs.add(path)
            path = path.rpartition("/")[0]
    os.makedirs(tmp)
    try:
        for path in sorted(dirs, key=lambda d: d.count("/")):  # parents first
            os.mkdir(f"{tmp}/{path}")
        for path, kind, value, _ in entries:
            if kind in ("f", "x"):
                place(store, entry_key(kind, value), f"{tmp}/{path}")
        for path, kind, value, _ in entries:
            if kind == "l":
                os.symlink(value, f"{tmp}/{path}")
        os.rename(tmp, code)
    except BaseException:
        remove_tree(tmp)
        raise


def place(store: ContentStore, key: str, target: str) -> None:
    import shutil

    source = f"{store.objects}/{key}"
    try:
        os.link(source, target)
    except FileNotFoundError:
        if not os.path.exists(source):
            raise Missing([key]) from None
        raise
    except OSError as exc:  # too many links, another filesystem, or no hard links at all
        if exc.errno not in (errno.EMLINK, errno.EXDEV, errno.EPERM, errno.ENOTSUP):
            raise
        shutil.copyfile(source, target)
        os.chmod(target, os.stat(source).st_mode & 0o777)


def in_background(function: Any, *args: Any) -> None:
    """Run `function` in a detached grandchild, after this command answered."""
    sys.stdout.flush()
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # let go of the SSH channel
            os.dup2(devnull, fd)
        function(*args)
    finally:
        os._exit(0)


def gc_due(store: ContentStore) -> bool:
    """Whether a push should collect in the background: at most once a minute, since
    a finished job's snapshot may wait that long, and pushes come in bursts."""
    stamp = store.path("gc.last")
    try:
        if time.time() - os.path.getmtime(stamp) < GC_EVERY_S:
            return False
    except OSError:
        pass
    with contextlib.suppress(OSError):
        write_bytes(stamp, b"")
    return True


def remove_tree(path: str) -> None:
    import shutil

    def writable(function: Any, failed: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            function(failed)

    shutil.rmtree(path, onerror=writable)


def snapshot_end(job_dir: str, created: float) -> float | None:
    """When the job that uses this snapshot ended; None while it runs (or may still)."""
    with contextlib.suppress(OSError):
        return os.path.getmtime(os.path.join(job_dir, "exit.json"))
    started = read_json(os.path.join(job_dir, "pid.json"))
    if started is not None:
        if alive(int(started.get("supervisor", 0))):
            return None
        return float(started.get("started", created))
    return created if time.time() - created > ABANDONED_S else None


def collect_garbage(
    workdir: str, keep: int, grace_s: float = GC_GRACE_S, sweep: bool = False
) -> dict[str, Any]:
    """Drop the snapshots of finished jobs but the newest `keep`, then content and
    manifests no snapshot uses (and older than `grace_s`: a push may be in flight).

    Without `sweep`, the store is swept only when a snapshot went, or once a day.
    """
    import glob

    store = ContentStore(os.path.join(workdir, "store"))
    os.makedirs(store.root, exist_ok=True)
    with open(store.path("gc.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if sweep else fcntl.LOCK_NB))
        except OSError:
            return {"busy": True}  # another gc is at it
        finished, kept, running = [], set(), 0
        for job_dir in glob.glob(os.path.join(glob.escape(workdir), "jobs", "*", "*")):
            meta = read_json(os.path.join(job_dir, "snapshot.json"))
            if meta is None or not os.path.isdir(os.path.join(job_dir, "code")):
                continue
            ended = snapshot_end(job_dir, float(meta.get("created", 0)))
            if ended is None:
                running += 1
                kept.add(str(meta.get("manifest")))
            else:
                finished.append((ended, job_dir, str(meta.get("manifest"))))
        finished.sort(reverse=True)
        kept.update(digest for _, _, digest in finished[:keep])
        for _, job_dir, _ in finished[keep:]:
            remove_tree(os.path.join(job_dir, "code"))
            os.unlink(os.path.join(job_dir, "snapshot.json"))
        report: dict[str, Any] = {
            "snapshots_removed": len(finished[keep:]),
            "snapshots_kept": min(len(finished), keep),
            "running": running,
            "objects_removed": 0,
            "bytes_freed": 0,
        }
        stamp = store.path("gc.stamp")
        due = not os.path.exists(stamp) or time.time() - os.path.getmtime(stamp) > SWEEP_EVERY_S
        if sweep or finished[keep:] or due:
            report.update(sweep_store(store, kept, time.time() - grace_s))
            write_bytes(stamp, b"")
        return report


def sweep_store(store: ContentStore, kept: set[str], before: float) -> dict[str, int]:
    """Remove objects no snapshot links to, and manifests and markers none refers to."""
    import glob

    removed = freed = 0
    for path in glob.glob(store.path("objects", "*")):
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if st.st_nlink == 1 and st.st_mtime < before:  # also parts of pushes cut short
                os.unlink(path)
                removed, freed = removed + 1, freed + st.st_size
    for path in glob.glob(store.path("manifests", "*")):
        with contextlib.suppress(OSError):
            if os.path.basename(path) not in kept and os.path.getmtime(path) < before:
                os.unlink(path)
    for path in glob.glob(store.path("setup", "*")):
        marker = read_json(path) or {}
        with contextlib.suppress(OSError):
            if marker.get("manifest") not in kept and os.path.getmtime(path) < before:
                os.unlink(path)
    return {"objects_removed": removed, "bytes_freed": freed}


def cmd_gc(args: list[str]) -> int:
    """`gc` with a header frame {"workdir", "keep", "grace"} on stdin: collect now."""
    try:
        _, payload = read_frame(sys.stdin.buffer)
        options = json.loads(payload)
        report = collect_garbage(
            os.path.expanduser(options["workdir"]),
            int(options["keep"]),
            float(options.get("grace", GC_GRACE_S)),
            sweep=True,
        )
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        report = {"error": describe_error(exc)}
    print(json.dumps(report))
    return 1 if "error" in report else 0


def cmd_setup(args: list[str]) -> int:
    """`setup JOB_DIR SPEC`: run the job's setup command in its code dir, streaming its
    output, and mark it done for this code version when it succeeds."""
    import subprocess

    os.chdir(os.path.expanduser(args[0]))
    spec = json.loads(args[1])
    env = dict(os.environ)
    env.update(spec.get("env", {}))
    # `pip install ...` should mean the pip of the interpreter that runs the job.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    with open("setup.log", "ab") as log:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", spec["script"]],
            cwd="code",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        code = proc.wait()
    if code == 0:
        marker = os.path.expanduser(spec["marker"])
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        write_json(marker, {"manifest": spec["manifest"], "done": time.time()})
    return code


COMMANDS = {
    "status": cmd_status,
    "probe": cmd_probe,
    "start": cmd_start,
    "follow": cmd_follow,
    "kill": cmd_kill,
    "rank": cmd_rank,
    "sync": cmd_sync,
    "setup": cmd_setup,
    "gc": cmd_gc,
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
