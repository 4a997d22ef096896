"""`slurm-stack JOB_ROOT REQUEST`: `stack` for a node of a Slurm job, started on each node
of the allocation by `srun --overlap --jobid` from the login node (slurm/stack.py), as
`slurm-top` is.

It reads this node's directory of the job root (`node_dir_name(SLURMD_NODENAME)`) as
`stack` reads an SSH host's job directory, and prints one JSON line, `{"node": NAME,
"reply": StackReply}`: srun merges the nodes' stdout line by line. REQUEST (JSON, in
the argv: it holds no secret) is a StackRequest; py-spy is read from the login node's
tools directory, which the allocation's nodes share (a Slurm cluster's shared home).
"""

from __future__ import annotations

import json
import os
import socket
import sys

from ..kernel.messages import parse_message
from ..kernel.replies import StackReply
from ..kernel.requests import StackRequest
from ..kernel.slurm import node_dir_name
from . import stack


def main(args: list[str]) -> int:
    root = os.path.abspath(os.path.expanduser(args[0]))
    request = parse_message(StackRequest, json.loads(args[1]) if len(args) > 1 else {})
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    node_dir = os.path.join(root, node_dir_name(name))
    if os.path.isdir(node_dir):
        reply = stack.take(node_dir, request)
    else:
        reply = StackReply(exists=False, machine=os.uname().machine)
    sys.stdout.write(json.dumps({"node": name, "reply": reply.as_dict()}) + "\n")
    sys.stdout.flush()
    return 0
