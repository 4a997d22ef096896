"""`slurm-top JOB_ROOT REQUEST`: `top` for a node of a Slurm job, started on each node of
the allocation by `srun --overlap --jobid` from the login node (slurm/top.py).

It samples this node's directory of the job root (`node_dir_name(SLURMD_NODENAME)`) as
`top` samples an SSH host's job directory, and prints one JSON line, `{"node": NAME,
"sample": TopSample}`: srun merges the nodes' stdout line by line. REQUEST (JSON, in
the argv: it holds no secret) is `{"job_id": ID, "offsets": {NODE: {STREAM: BYTES}}}`.
A Slurm node has no supervisor's pid record: the node runs until its launcher wrote
`exit.json`.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from ..kernel.fileio import read_json
from ..kernel.layout import EXIT, NODE_SPEC
from ..kernel.messages import parse_message
from ..kernel.replies import TopSample
from ..kernel.requests import SlurmTopRequest
from ..kernel.slurm import node_dir_name
from . import state, top


def main(args: list[str]) -> int:
    root = os.path.abspath(os.path.expanduser(args[0]))
    request = parse_message(SlurmTopRequest, json.loads(args[1]) if len(args) > 1 else {})
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    node_dir = os.path.join(root, node_dir_name(name))
    if not os.path.isdir(node_dir):
        found = TopSample(exists=False, started=False, running=False)
    else:
        os.chdir(node_dir)
        offsets = (request.offsets or {}).get(name) or {}
        found = top.sample(request.job_id, offsets)
        ended = state.exit_record() if os.path.exists(EXIT) else None
        found.started = "argv" in (read_json(NODE_SPEC) or {})  # the controller's is {}
        found.running = found.started and ended is None
        found.ended = ended
    line = json.dumps({"node": name, "sample": found.as_dict()})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    return 0
