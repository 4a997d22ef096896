"""`slurm-node JOB_ROOT`: what `srun` starts on each compute node of a Slurm job: one
torchrun there, from the agent version the job pinned (`JOB_ROOT/agent`).

On each node, from Slurm's environment and the job's spec (`slurm/spec.json`, never
an argv: it holds the job's env):

1. node rank = SLURM_NODEID; the master = the first node of the allocation, its
   address as Slurm reaches it (`scontrol show node`: NodeAddr), not from DNS;
2. the rendezvous port: the job's, else node rank 0 picks a free one on the master
   and leaves it on the shared home for the others (`slurm/rdzv-<slurm id>.json`);
3. `--local-addr` and GLOO/NCCL_SOCKET_IFNAME from the route to the master, as the
   probe finds it on an SSH host (host/probe.py);
4. torchrun (its command as kernel/placement.py writes it) runs in the node's own
   directory of the job root with the agent's rank entry, each rank writing its own
   `logs/rank-N.log` (what `orch` follows over the login node); with launcher python
   the entry runs once per node under the interpreter alone, its output the node's
   (`torchrun.log`), with MASTER_ADDR, MASTER_PORT and NODE_RANK as over SSH; how it
   starts (command, environment, directory, session, output) is spawn.py's, as on an
   SSH host;
5. `exit.json` records how it ended, and the launcher exits with torchrun's code, so
   that `srun --kill-on-bad-exit=1` brings the allocation down on a failure. SIGTERM
   (scancel) reaches torchrun from Slurm itself, which signals every process of the
   step; torchrun stops its ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time

from ..host import probe
from ..kernel.fileio import read_json, write_json
from ..kernel.layout import AGENT, CODE, EXIT, LOGS, NODE_SPEC, OUTPUTS
from ..kernel.messages import parse_message
from ..kernel.placement import (
    PYTHON,
    set_ifname,
    set_launcher_env,
    torchrun_argv,
)
from ..kernel.replies import ExitRecord
from ..kernel.requests import SlurmSpec
from ..kernel.slurm import SPEC, expand_nodelist, fill_marks, node_dir_name, rendezvous_record
from ..kernel.slurm_chain import ATTEMPT_ENV, attempt_dir
from . import spawn

PORT_WAIT_S = 120.0


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
    facts = probe.route_facts(address, probe.own_addresses())
    return facts["local_addr"], facts["iface"]


def rendezvous_port(root: str, slurm_id: str, node_rank: int, master_addr: str) -> int:
    """Node rank 0 picks a free port on the master (itself) and writes it on the shared
    home; the others wait for it there."""
    path = os.path.join(root, rendezvous_record(slurm_id))
    if node_rank == 0:
        with socket.socket() as probe_socket:
            probe_socket.bind((master_addr, 0))
            port = int(probe_socket.getsockname()[1])
        write_json(path, {"port": port, "master_addr": master_addr})
        return port
    deadline = time.monotonic() + PORT_WAIT_S
    while time.monotonic() < deadline:
        record = read_json(path)
        if record is not None and "port" in record:
            return int(record["port"])
        time.sleep(0.1)
    raise SystemExit(f"orch: node rank 0 left no rendezvous port in {path}")


def node_launcher_argv(
    spec: SlurmSpec,
    launcher: str,
    node_rank: int,
    master_addr: str,
    port: int,
    local_addr: str | None,
) -> list[str]:
    """What starts the node's entry: torchrun (torch.distributed.launch's entry takes its
    --local_rank flag from the spec), or with launcher python the interpreter alone."""
    if launcher == PYTHON:
        return [spec.python]
    return torchrun_argv(
        spec.python,
        num_nodes=str(len(spec.nodes)),
        node_rank=str(node_rank),
        nproc=str(spec.nodes[node_rank].nproc),
        master_addr=master_addr,
        master_port=str(port),
        max_restarts=spec.max_restarts,
        local_addr=local_addr,
    )


def _link(target: str, name: str) -> None:
    if not os.path.lexists(name):
        with contextlib.suppress(FileExistsError):  # the controller made it meanwhile
            os.symlink(target, name)


def main(args: list[str]) -> int:
    root = os.path.abspath(os.path.expanduser(args[0]))
    with open(os.path.join(root, SPEC)) as f:
        spec = parse_message(SlurmSpec, json.load(f))
    node_rank = int(os.environ["SLURM_NODEID"])
    slurm_id = os.environ.get("SLURM_JOB_ID", "0")
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    nodes = expand_nodelist(os.environ["SLURM_JOB_NODELIST"])
    master_addr = node_addr(nodes[0])
    port = spec.port or rendezvous_port(root, slurm_id, node_rank, master_addr)
    local_addr, iface = route_to(master_addr)

    # A restart's attempt (ORCH_ATTEMPT from the batch script) has its own directory.
    attempt = int(os.environ.get(ATTEMPT_ENV) or 0)
    node_dir = os.path.join(root, attempt_dir(node_dir_name(name), attempt))
    os.makedirs(os.path.join(node_dir, LOGS), exist_ok=True)
    os.chdir(node_dir)
    _link(os.path.join(os.pardir, CODE), CODE)
    _link(os.path.join(os.pardir, AGENT), AGENT)
    mine = spec.nodes[node_rank]
    launcher = spec.launcher
    argv = node_launcher_argv(spec, launcher, node_rank, master_addr, port, local_addr)
    argv += [fill_marks(a, master_addr, port) for a in [*spec.entry, *mine.args]]
    env = dict(os.environ)
    env.update({k: fill_marks(v, master_addr, port) for k, v in mine.env.items()})
    set_ifname(env, iface)
    values = {"master_addr": master_addr, "master_port": str(port), "node_rank": str(node_rank)}
    set_launcher_env(env, launcher, values)
    env.update(ORCH_SLURM_JOB_ID=slurm_id, ORCH_HOSTS=",".join(nodes), ORCH_ATTEMPT=str(attempt))
    start = spawn.plan(spawn.SRUN, argv, env, node_dir, os.path.join(root, OUTPUTS))
    # What ran here, for a person looking later, and the environment the node's ranks
    # got beyond the step's own, which `orch ssh` and `orch exec JOB` give their command
    # (shell.py), with the umask the SSH nodes write theirs with.
    added = {k: v for k, v in start.env.items() if os.environ.get(k) != v}
    write_json(
        NODE_SPEC,
        {"argv": start.argv, "env": added, "slurm_node": name, "node_rank": node_rank},
    )
    proc = spawn.spawn(start)

    # Slurm signals every process of the step (scancel, --kill-on-bad-exit, a time
    # limit), torchrun included, whatever the proctrack plugin: a second SIGTERM sent
    # on from here would cut short torchrun's own shutdown of its ranks. This launcher
    # outlives the signal only to record how torchrun ended.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    returncode = proc.wait()
    write_json(EXIT, ExitRecord(returncode=returncode, ended=time.time()).as_dict())
    return returncode if returncode >= 0 else 128 - returncode
