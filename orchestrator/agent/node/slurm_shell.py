"""`slurm-shell JOB_ROOT ATTEMPT -- COMMAND...`: `orch exec JOB` on every node of a Slurm
job at once, under one `srun --overlap --jobid --label` from the login node
(slurm/into.py), as `slurm-top` and `slurm-stack` are: one step and one SSH session
for the whole allocation, however many nodes it has.

On each node: its name first (NODE_MARK: srun labels lines by task, not node), then,
in its directory of the job root, the command as `shell` runs it (the job's
environment from the node's node.json, never an argv), and last its exit code
(EXIT_MARK): srun's own exit code is one for every node.
"""

from __future__ import annotations

import os
import socket
import sys

from ..kernel.slurm import EXIT_MARK, NODE_MARK, node_dir_name
from ..kernel.slurm_chain import attempt_dir
from . import shell


def main(args: list[str]) -> int:
    root = os.path.abspath(os.path.expanduser(args[0]))
    attempt = int(args[1])
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    sys.stdout.write(NODE_MARK + name + "\n")
    sys.stdout.flush()
    try:
        os.chdir(os.path.join(root, attempt_dir(node_dir_name(name), attempt)))
    except OSError as exc:
        sys.stdout.write(f"orch: no directory of this job on {name}: {exc.strerror}\n")
        code = 2
    else:
        code = _run(args[2:])
    sys.stdout.write(f"{EXIT_MARK}{code}\n")
    sys.stdout.flush()
    return 0


def _run(command: list[str]) -> int:
    """`shell` with `command`, in a child (it execs), and how that child ended."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(shell.main(command))
        except BaseException:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)
