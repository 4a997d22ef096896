"""A Slurm job's names, read alike by the controller and by each compute node's
launcher (node/srun.py): the node list Slurm compresses, a node's directory in the job
root, the job root's `slurm/` files, and the marks that stand for what only the nodes
know. Pure, standard library only, valid on Python 3.8.

The job root on the shared home (`<workdir>/jobs/<job id>`) holds the code snapshot
(code/, agent) as a push builds it, and beside it `slurm/` (the batch script, each
node rank's spec, srun's records) and one directory per node (`node_dir_name`).
"""

from __future__ import annotations

import re

from .layout import RESERVED_NAMES

SLURM_DIR = "slurm"
SPEC = f"{SLURM_DIR}/spec.json"  # each node rank's args and env (0600: the env may hold secrets)
# Where the controller leaves a job's master address and port in a node's args/env:
# they are known only on the nodes. NUL never occurs in an argv or env value.
MASTER_ADDR_MARK = "\0orch:master_addr\0"
MASTER_PORT_MARK = "\0orch:master_port\0"


def rendezvous_record(slurm_id: str) -> str:
    """Where node rank 0 leaves the rendezvous port it picked, for the others."""
    return f"{SLURM_DIR}/rdzv-{slurm_id}.json"


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
    """A node's directory in the job root: its Slurm name, unless that names what the
    job root holds besides (the snapshot's entries, `slurm/`)."""
    return f"node-{name}" if name in RESERVED_NAMES or name == SLURM_DIR else name


def fill_marks(value: str, master_addr: str, port: int) -> str:
    """`value` with the master's address and port where the controller left marks."""
    return value.replace(MASTER_ADDR_MARK, master_addr).replace(MASTER_PORT_MARK, str(port))


# `slurm-shell`'s lines (node/slurm_shell.py) among its command's: which node a task
# of srun's is, and how the command ended there
NODE_MARK = "@orch-node "
EXIT_MARK = "@orch-exit "
