"""Where a job's nodes go and what each one runs, written once for the controller's plan
(ssh/plan.py) and the host-side keeper of a detached job (keeper/), which starts a new
attempt on other hosts without the laptop.

A node's command is rendered from two parts:

- a **template** (requests.NodeTemplate, plan.node_template): what is known of the job and of one host before
  anyone knows where the host stands in the job: job id, launcher, entry, max_restarts,
  args and env with their placeholders unexpanded; the host's name, python, workdir,
  env, GPUs, the interface (`iface`) and address (`addr`) its peers reach it at;
- a **placement** (`placement()`): the job's hosts in node order, every node's process
  count, the master's address and port, and the attempt.

The template is a message and the placement a plain JSON-able dict: both travel to
the keeper and to each host's member.

Standard library only, valid on Python 3.8 (the agent runs it on the hosts). The same
module holds the pure rules of restarts (`next_hosts`, `restart_delay`), so that an
attached submit and a keeper choose alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .layout import AGENT, CODE, LOGS, RUN_SCRIPT, job_dir
from .requests import NodeTemplate
from .states import FAILED, LOST

TORCHRUN, PYTHON, LEGACY_LAUNCH = "torchrun", "python", "torch.distributed.launch"
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
UNKNOWN_PORT = "<free port on master>"
_TOKEN = re.compile(r"\{\{|\$\{[^}]*\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: str, values: Mapping[str, str]) -> str:
    """`value` with each placeholder (`{node_rank}` ...) replaced by its entry in
    `values`; `{{` is a literal `{`, `${NAME}` is left alone (models/placeholders.py
    checks the names when the job is loaded).

    Raises:
        KeyError: a placeholder `values` lacks.
    """

    def one(match: Any) -> str:
        token = str(match.group(0))
        if token == "{{":
            return "{"
        if match.group(1) is None:  # ${NAME}: a shell's, not ours
            return token
        return str(values[match.group(1)])

    return _TOKEN.sub(one, value)


def placement(
    hosts: Sequence[str],
    nprocs: Sequence[int],
    master_addr: str,
    master_port: int | None,
    attempt: int = 0,
) -> dict[str, Any]:
    """A placement: the hosts in node order (the first is the master) and their
    process counts."""
    return {
        "hosts": list(hosts),
        "nprocs": [int(n) for n in nprocs],
        "master_addr": master_addr,
        "master_port": master_port,
        "attempt": int(attempt),
    }


def values_of(place: dict[str, Any], node_rank: int) -> dict[str, str]:
    """The placeholder values of one node of a placement."""
    counts = place["nprocs"]
    port = place["master_port"]
    return {
        "node_rank": str(node_rank),
        "num_nodes": str(len(place["hosts"])),
        "master_addr": str(place["master_addr"]),
        "master_port": str(port) if port is not None else UNKNOWN_PORT,
        "nproc": str(counts[node_rank]),
        "nprocs_list": ",".join(map(str, counts)),
        "world_size": str(sum(counts)),
    }


def render(template: NodeTemplate, place: dict[str, Any]) -> tuple[list[str], dict[str, str], str]:
    """The node's torchrun (or python) command, its environment and its job directory,
    for the template's host at its place.

    Raises:
        ValueError: the template's host is not in the placement.
    """
    name = template.host
    if name not in place["hosts"]:
        raise ValueError(f"host {name!r} is not in the placement")
    node_rank = place["hosts"].index(name)
    values = values_of(place, node_rank)
    args = [expand(a, values) for a in template.args]
    if template.launcher == PYTHON:
        argv = [template.python, *_entry_argv(template, "-", args)]
    else:
        argv = _torchrun_argv(template, place, node_rank, values, args)
    env = _node_env(template, values, ",".join(place["hosts"]))
    env["ORCH_ATTEMPT"] = str(place["attempt"])
    return argv, env, job_dir(template.workdir, template.job_id, name, place["attempt"])


def _torchrun_argv(
    template: NodeTemplate,
    place: dict[str, Any],
    node_rank: int,
    values: Mapping[str, str],
    args: list[str],
) -> list[str]:
    argv = torchrun_argv(
        template.python,
        num_nodes=values["num_nodes"],
        node_rank=values["node_rank"],
        nproc=values["nproc"],
        master_addr=values["master_addr"],
        master_port=values["master_port"],
        max_restarts=template.max_restarts,
        local_addr=place["master_addr"] if node_rank == 0 else template.addr,
    )
    return argv + _entry_argv(template, LOGS, args)


def torchrun_argv(
    python: str,
    num_nodes: str,
    node_rank: str,
    nproc: str,
    master_addr: str,
    master_port: str,
    max_restarts: int,
    local_addr: str | None,
) -> list[str]:
    """torchrun's part of a node's command, before the entry: a static rendezvous at
    the master (node rank 0 is the master host), on an SSH host or a Slurm node."""
    argv = [
        python,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        num_nodes,
        "--node-rank",
        node_rank,
        "--nproc-per-node",
        nproc,
        "--master-addr",
        master_addr,
        "--master-port",
        master_port,
        "--max-restarts",
        str(max_restarts),
    ]
    if local_addr:
        # Without it torchrun hands workers its FQDN, which peers may not resolve.
        argv += ["--local-addr", local_addr]
    return argv


def _entry_argv(template: NodeTemplate, logs: str, args: list[str]) -> list[str]:
    """The agent's `rank` entry, which starts the user's code: under torchrun once per
    rank, it sends the rank's stdout and stderr to its own log file (`logs`); with
    launcher python once per node, `-` leaves them in the node's output. It moves into
    the code snapshot (shared by the nodes of a shared filesystem) and execs the
    user's code with the job pinned agent version. Paths are the node directory's,
    where the node's command runs."""
    argv = [f"{AGENT}/{RUN_SCRIPT}", "rank", logs, CODE, *template.entry]
    if template.launcher == LEGACY_LAUNCH and template.local_rank_arg:
        argv.append(template.local_rank_arg)  # the rank adds =LOCAL_RANK before the args
    return [*argv, "--", *args]


def _node_env(template: NodeTemplate, values: Mapping[str, str], names: str) -> dict[str, str]:
    env = dict(template.host_env)
    env.update({k: expand(v, values) for k, v in template.env.items()})
    set_ifname(env, template.iface)
    gpus = list(template.gpus)
    if gpus and gpus != list(range(len(gpus))):
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, gpus)))
    set_launcher_env(env, template.launcher, values)
    env.update(
        ORCH_JOB_ID=template.job_id,
        ORCH_NODE_RANK=values["node_rank"],
        ORCH_NUM_NODES=values["num_nodes"],
        ORCH_NPROC=values["nproc"],
        ORCH_NPROCS_LIST=values["nprocs_list"],
        ORCH_WORLD_SIZE=values["world_size"],
        ORCH_HOSTS=names,
        PYTHONUNBUFFERED="1",
    )
    return env


def set_launcher_env(env: dict[str, str], launcher: str, values: Mapping[str, str]) -> None:
    """With launcher python, what torchrun would have told the script's own spawning:
    the master and this node's rank (an SSH host and a Slurm node alike)."""
    if launcher == PYTHON:
        env.update(
            MASTER_ADDR=values["master_addr"],
            MASTER_PORT=values["master_port"],
            NODE_RANK=values["node_rank"],
        )


def set_ifname(env: dict[str, str], iface: str | None) -> None:
    """Point gloo and NCCL at the interface that routes to the master, where the job or
    the host did not name one: names differ per host, and a wrong one hangs the job."""
    if iface:
        for var in IFNAME_VARS:
            env.setdefault(var, iface)


# ---------------------------------------------------------------- restarts

RESTART_DELAY_S = (1.0, 60.0)  # the second restart's wait, doubled each time, up to this


def restart_delay(attempt: int) -> float:
    """The wait before `attempt` (1: the first restart). The first comes at once: the
    failed host is replaced or the failure was the job's own; a job that fails again
    waits 1 s, then 2, 4 ... up to a minute."""
    first, most = RESTART_DELAY_S
    return 0.0 if attempt <= 1 else float(min(most, first * 2 ** (attempt - 2)))


def failed_hosts(states: Mapping[str, str]) -> tuple[set[str], set[str]]:
    """The hosts an attempt failed on, and those of them that were lost, from each
    node's end state (`failed`, `lost`, `killed`, `succeeded`). A lost host takes its
    peers' ranks down with it: when one was lost, only the lost ones count."""
    lost = {h for h, s in states.items() if s == LOST}
    return (lost or {h for h, s in states.items() if s == FAILED}), lost


def next_hosts(
    current: Sequence[str], candidates: Sequence[str], bad: set[str], lost: set[str]
) -> list[str] | None:
    """The hosts of the next attempt: the current ones but those that failed (`bad`),
    replaced by spares in the selection's order; where spares run short, a host whose
    node failed is taken again (a process failed, the host may be fine), a lost one
    never. None when too few are left."""
    spares = [h for h in candidates if h not in bad and h not in current]
    chosen = []
    for host in current:
        if host not in bad:
            chosen.append(host)
        elif spares:
            chosen.append(spares.pop(0))
        elif host not in lost:
            chosen.append(host)
        else:
            return None
    return chosen
