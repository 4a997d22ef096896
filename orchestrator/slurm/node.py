"""The launcher `srun` starts on each compute node of a Slurm job: one torchrun there.

Standard library only, valid on Python 3.8: the controller uploads this file beside
the batch script (`<job root>/slurm/node.py`) and the compute nodes run it with the
inventory's python. It is also imported by the controller (`expand_nodelist`), so the
node list is read one way on both ends.

On each node, from Slurm's environment and the job's spec (`slurm/spec.json`, never
an argv: it holds the job's env):

1. node rank = SLURM_NODEID; the master = the first node of the allocation, its
   address as Slurm reaches it (`scontrol show node`: NodeAddr), not from DNS;
2. the rendezvous port: the job's, else node rank 0 picks a free one on the master
   and leaves it on the shared home for the others (`slurm/rdzv-<slurm id>.json`);
3. `--local-addr` and GLOO/NCCL_SOCKET_IFNAME from the route to the master;
4. torchrun runs in `<job root>/<node name>` with the agent's rank entry, each rank
   writing its own `logs/rank-N.log` (what `orch` follows over the login node);
5. `exit.json` records how it ended, and the launcher exits with torchrun's code, so
   that `srun --kill-on-bad-exit=1` brings the allocation down on a failure. SIGTERM
   (scancel) goes on to torchrun, which stops its ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

SPEC = "spec.json"
PORT_WAIT_S = 120.0
# Where the controller leaves a job's master address and port in a node's args/env:
# they are known only on the nodes. NUL never occurs in an argv or env value.
MASTER_ADDR_MARK = "\0orch:master_addr\0"
MASTER_PORT_MARK = "\0orch:master_port\0"
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
RESERVED = ("code", "agent", "outputs", "slurm", "snapshot.json")


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed node list in full: `gpu[01-03,7],login` -> gpu01 gpu02 gpu03
    gpu7 login (zero padding kept; several bracket groups multiply out)."""
    names: list[str] = []
    for item in _split_top(nodelist):
        names.extend(_expand_one(item))
    return names


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        return [item]
    head, tail = item[: match.start()], item[match.end() :]
    out: list[str] = []
    for piece in match.group(1).split(","):
        low, _, high = piece.partition("-")
        if high:
            width = len(low)
            out.extend(f"{head}{n:0{width}d}" for n in range(int(low), int(high) + 1))
        else:
            out.append(f"{head}{low}")
    return [name for first in out for name in _expand_one(first + tail)]


def node_dir_name(name: str) -> str:
    """A node's directory in the job root: its Slurm name, unless that names a file
    orch keeps there."""
    return f"node-{name}" if name in RESERVED else name


def node_addr(name: str) -> str:
    """The address Slurm reaches node `name` at (NodeAddr), else what `name` resolves to."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "--oneliner", name],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    match = re.search(r"\bNodeAddr=(\S+)", out)
    if match and match.group(1) not in ("", "(null)"):
        return match.group(1)
    return socket.gethostbyname(name)


def route_to(address: str) -> tuple[str | None, str | None]:
    """This node's own address toward `address`, and the interface it leaves by."""
    try:
        out = subprocess.run(
            ["ip", "-o", "route", "get", address], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    dev = re.search(r"\bdev (\S+)", out)
    src = re.search(r"\bsrc (\S+)", out)
    iface = dev.group(1) if dev else None
    if iface == "lo":  # the master itself: the interface that holds its address
        iface = _iface_holding(address)
        return address, iface
    if src is None:  # no ip tool: the kernel's choice of source address
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((address, 9))
                return probe.getsockname()[0], iface
            except OSError:
                return None, iface
    return src.group(1), iface


def _iface_holding(address: str) -> str | None:
    try:
        out = subprocess.run(
            ["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == address:
            return fields[1]
    return None


def rendezvous_port(root: str, slurm_id: str, node_rank: int, master_addr: str) -> int:
    """Node rank 0 picks a free port on the master (itself) and writes it on the shared
    home; the others wait for it there."""
    path = os.path.join(root, "slurm", f"rdzv-{slurm_id}.json")
    if node_rank == 0:
        with socket.socket() as probe:
            probe.bind((master_addr, 0))
            port = int(probe.getsockname()[1])
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"port": port, "master_addr": master_addr}, f)
        os.replace(tmp, path)
        return port
    deadline = time.monotonic() + PORT_WAIT_S
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                return int(json.load(f)["port"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    raise SystemExit(f"orch: node rank 0 left no rendezvous port in {path}")


def _fill(value: str, master_addr: str, port: int) -> str:
    return value.replace(MASTER_ADDR_MARK, master_addr).replace(MASTER_PORT_MARK, str(port))


def _link(target: str, name: str) -> None:
    if not os.path.lexists(name):
        with contextlib.suppress(FileExistsError):  # the controller made it meanwhile
            os.symlink(target, name)


def main(args: list[str]) -> int:
    os.umask(0o077)  # the node's directory, logs and records are the user's alone
    root = os.path.abspath(os.path.expanduser(args[0]))
    with open(os.path.join(root, "slurm", SPEC)) as f:
        spec = json.load(f)
    node_rank = int(os.environ["SLURM_NODEID"])
    slurm_id = os.environ.get("SLURM_JOB_ID", "0")
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    nodes = expand_nodelist(os.environ["SLURM_JOB_NODELIST"])
    master_addr = node_addr(nodes[0])
    port = spec["port"] or rendezvous_port(root, slurm_id, node_rank, master_addr)
    local_addr, iface = route_to(master_addr)

    node_dir = os.path.join(root, node_dir_name(name))
    os.makedirs(os.path.join(node_dir, "logs"), exist_ok=True)
    os.chdir(node_dir)
    _link("../code", "code")
    _link("../agent", "agent")
    mine = spec["nodes"][node_rank]
    argv = [
        spec["python"],
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(len(spec["nodes"])),
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        str(mine["nproc"]),
        "--master-addr",
        master_addr,
        "--master-port",
        str(port),
        "--max-restarts",
        str(spec["max_restarts"]),
    ]
    if local_addr:
        argv += ["--local-addr", local_addr]
    argv += [_fill(a, master_addr, port) for a in spec["entry"] + mine["args"]]
    env = dict(os.environ)
    env.update({k: _fill(v, master_addr, port) for k, v in mine["env"].items()})
    if iface:
        for var in IFNAME_VARS:
            env.setdefault(var, iface)
    env.update(
        ORCH_SLURM_JOB_ID=slurm_id,
        ORCH_HOSTS=",".join(nodes),
        ORCH_OUTPUT_DIR=os.path.join(root, "outputs"),
    )
    os.makedirs(env["ORCH_OUTPUT_DIR"], exist_ok=True)
    with open("node.json", "w") as f:  # what ran here, for a person looking later
        json.dump({"argv": argv, "slurm_node": name, "node_rank": node_rank}, f)
    with open("torchrun.log", "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    returncode = proc.wait()
    tmp = f"exit.json.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"returncode": returncode, "ended": time.time()}, f)
    os.replace(tmp, "exit.json")
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
