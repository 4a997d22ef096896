"""`probe [MASTER|OPTIONS]`: this host's facts as one JSON line, without importing torch
(that costs seconds): python, torch and its CUDA and NCCL, GPUs, addresses, the route
to the master, a port's holders, free disk, the clock."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING

from ..kernel.host_wire import GpuFacts, GpuRow, PortFacts, PortHolder, ProbeFacts, WheelTags
from ..kernel.layout import FS_MARKS, TOKEN_RE
from ..kernel.messages import parse_message
from ..kernel.requests import ProbeOptions
from . import nvidia, proc

if TYPE_CHECKING:
    import subprocess

MARK_TTL_S = 600.0  # marks of earlier probes go after this long
INDEX_TIMEOUT_S = 3.0  # to connect to the package index (orch check only)
GPU_QUERY = "gpu=index,name,memory.total,driver_version"  # one row per GPU (nvidia.py)
GPU_QUERY_TIMEOUT_S = 10.0


def main(args: list[str]) -> int:
    """Print this host's facts as one JSON line, fast: it runs before every submit.

    args: `MASTER`, or one JSON object with any of master (address to route to),
    port (tell whether it is free and who holds it), workdir (free disk there),
    gpus (false skips nvidia-smi), modules (top-level names to find), and mark and
    look (which hosts share the workdir's filesystem: `fs_marks`).
    """
    import socket

    try:
        opts = probe_options(args)
    except ValueError as exc:  # a MessageError: a controller of another version
        print(json.dumps({"error": f"probe: {exc}"}))
        return 2
    want_gpus = opts.gpus
    # nvidia-smi can take a second on a big box: it runs while the rest is read.
    gpu_query = start_gpu_query() if want_gpus else None
    build = torch_build()
    facts = ProbeFacts(
        hostname=socket.gethostname(),
        os=os_name(),
        python=sys.version.split()[0],
        executable=sys.executable,
        torch=build.get("version"),
        torch_cuda=build.get("cuda"),
        torch_hip=build.get("hip"),
        nccl=nccl_version(build.get("dir")),
        # The address sshd was reached at: what other hosts most likely reach us at too.
        ssh_addr=ssh_server_addr(),
        free_port=free_port(),
    )
    own = own_addresses()
    facts.addresses = own
    if opts.index:
        facts.index_reach = index_reach(opts.index)
    if opts.target:
        facts.target = wheel_tags()
    if opts.master:
        route = route_facts(opts.master, own)
        facts.iface, facts.local_addr = route["iface"], route["local_addr"]
        facts.route_error = route["route_error"]
    if opts.port:
        facts.port = port_status(opts.port)
    if opts.workdir:
        facts.disk_free = disk_free(opts.workdir)
    if opts.mark:
        workdir = opts.workdir or "~/.orch"
        facts.fs_seen = fs_marks(workdir, opts.mark, list(opts.look))
        facts.fs_mark = opts.mark if facts.fs_seen is not None else None
    if opts.modules:
        facts.modules = {name: module_found(name) for name in opts.modules}
    if gpu_query is not None:
        facts.gpus = finish_gpu_query(gpu_query)
    elif want_gpus:  # no nvidia-smi: the device nodes still tell the count
        facts.gpus = GpuFacts(count=device_gpu_count(os.listdir("/dev")), source="/dev")
    facts.time = time.time()  # last: the controller compares it with its own clock
    print(facts.to_json())
    return 0


def wheel_tags() -> WheelTags:
    """What wheels this python installs, as packaging.tags would tell (it is not in the
    standard library): the controller downloads them for it (`wheels: download`)."""
    import sysconfig

    impl = sys.implementation.name
    short = {"cpython": "cp", "pypy": "pp"}.get(impl, impl)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    # SOABI: cpython-311-x86_64-linux-gnu (cp311), cpython-313t-... (cp313t, free
    # threaded), pypy39-pp73-... (pypy39_pp73).
    soabi = str(sysconfig.get_config_var("SOABI") or "")
    parts = soabi.split("-")
    if impl == "cpython" and len(parts) > 1:
        abi = "cp" + parts[1]
    elif len(parts) > 1:
        abi = "_".join(parts[:2])
    else:
        abi = short + version.replace(".", "")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    glibc = None
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
        if found.startswith("glibc "):
            glibc = found.split()[1]
    except (ValueError, OSError, AttributeError):
        pass
    return WheelTags(
        implementation=short, python_version=version, abi=abi, platform=platform, glibc=glibc
    )


def probe_options(args: list[str]) -> ProbeOptions:
    """The probe's options: none, one JSON object, or a bare master address.

    Raises:
        MessageError: an option of the wrong type.
    """
    if not args:
        return ProbeOptions()
    if args[0].startswith("{"):
        opts = json.loads(args[0])
        return parse_message(ProbeOptions, opts) if isinstance(opts, dict) else ProbeOptions()
    return ProbeOptions(master=args[0])


def fs_marks(workdir: str, mine: str, look: list[str]) -> list[str] | None:
    """Which marks of `look` this host finds in WORKDIR/fsmarks, once it wrote `mine`
    there: hosts that find each other's marks share the filesystem of their workdir.

    Every host writes before it looks, so of two hosts probed at once at least one
    finds the other's mark. The names are fresh: an NFS client asks the server for
    them, where a listing might come from its cache. None: the workdir is not
    writable here, and nothing can be told.
    """
    marks = os.path.join(os.path.expanduser(workdir), FS_MARKS)
    if not TOKEN_RE.fullmatch(mine):
        return None
    try:
        os.makedirs(marks, exist_ok=True)
        os.close(os.open(os.path.join(marks, mine), os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError:
        return None
    seen = [m for m in look if TOKEN_RE.fullmatch(m) and os.path.exists(os.path.join(marks, m))]
    stale = time.time() - MARK_TTL_S
    try:
        names = os.listdir(marks)
    except OSError:
        names = []
    for name in names:  # the marks of earlier probes, written by this host or another
        path = os.path.join(marks, name)
        try:
            if os.lstat(path).st_mtime < stale:
                os.unlink(path)
        except OSError:
            pass
    return seen


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
    the master through that interface. `route_error` says why there is no answer
    (the probe's fields of the same names; node/srun.py reads the first two).
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


def start_gpu_query() -> subprocess.Popen[bytes] | None:
    smi = nvidia.find()
    if smi is None:
        return None
    try:
        return nvidia.start(smi, GPU_QUERY)
    except OSError:
        return None


def finish_gpu_query(query: subprocess.Popen[bytes]) -> GpuFacts:
    answer = nvidia.finish(query, GPU_QUERY_TIMEOUT_S)
    if answer.error is not None or answer.returncode is None:
        return GpuFacts(count=None, error=answer.error)
    return parse_gpu_query(answer.text, answer.returncode)


def parse_gpu_query(out: str, returncode: int) -> GpuFacts:
    """nvidia-smi's CSV answer: the GPUs it lists, and what it said about the others.

    A GPU that fell off the bus shows as a line like `Unable to determine the device
    handle for GPU0000:CA:00.0: Unknown Error` among the others' rows.
    """
    found, notes = nvidia.rows(out, 3)
    gpus = [
        GpuRow(
            index=int(fields[0]),
            name=fields[1],
            memory_mib=int(fields[2]) if fields[2].isdigit() else None,
            driver=fields[3] if len(fields) > 3 else None,
        )
        for fields in found
    ]
    if returncode != 0 and not gpus:
        return GpuFacts(
            count=None,
            source="nvidia-smi",
            error=" ".join(notes)[:300] or f"nvidia-smi exited {returncode}",
        )
    result = GpuFacts(count=len(gpus), source="nvidia-smi", list=gpus)
    if notes:
        result.error = " ".join(notes)[:300]
    return result


def device_gpu_count(dev_names: list[str]) -> int:
    """GPUs by their /dev/nvidiaN nodes, where nvidia-smi is not installed."""
    return sum(1 for n in dev_names if n.startswith("nvidia") and n[6:].isdigit())


def port_status(port: int) -> PortFacts:
    """Whether `port` can be bound as torchrun's store binds it, and if not, by whom."""
    import socket

    try:
        with socket.socket() as s:
            # As c10d's TCPStore does: a TIME_WAIT leftover does not make a port busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
        return PortFacts(port=port, free=True)
    except OSError as exc:
        return PortFacts(port=port, free=False, error=exc.strerror, holders=port_holders(port))


def port_holders(port: int) -> list[PortHolder]:
    """The sockets on `port` and, where /proc lets us see them, their processes."""
    sockets = [s for s in proc.tcp_sockets() if s["port"] == port and s["state"] != "TIME_WAIT"]
    sockets.sort(key=lambda s: s["state"] != "LISTEN")
    owners = proc.socket_owners({s["inode"] for s in sockets})
    holders = []
    for s in sockets:
        pid = owners.get(s["inode"])
        holders.append(
            PortHolder(
                pid=pid,
                command=proc.cmdline(pid) if pid else None,
                user=proc.user_name(s["uid"]),
                state=s["state"],
                addr=s["addr"],
            )
        )
    return holders


def index_reach(url: str, timeout: float = INDEX_TIMEOUT_S) -> str:
    """Whether a TCP connection to the package index at `url` can be made from here:
    "ok", or why not (what `pip install` from it would meet first)."""
    import socket
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "not a URL"
    if not host or parts.scheme not in ("http", "https"):
        return "not an http(s) URL"
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except socket.timeout:  # noqa: UP041 (Python 3.8 spelling kept with the agent's)
        return f"no answer within {timeout:.0f} s"
    except OSError as exc:
        return str(exc.strerror or exc)
    return "ok"
