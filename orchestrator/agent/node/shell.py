"""`shell [-- COMMAND...]`, in a node's directory: a shell (or COMMAND) in the job's
code directory with the job's environment (`orch ssh`).

The environment is this session's with the node's on top (node.json: what its
torchrun started with: the job's `env:`, ORCH_* and the lease's devices), and the
directory of the job's interpreter first on PATH, so that `python` is the job's. What
only the ranks get (RANK, LOCAL_RANK, WORLD_SIZE...) torchrun sets for each rank, and
is not here. The environment goes to the shell through exec, never through an argv.
"""

from __future__ import annotations

import os
import pwd
import sys

from ..kernel.fileio import read_json
from ..kernel.layout import CODE, NODE_SPEC


def main(args: list[str]) -> int:
    spec = read_json(NODE_SPEC)
    if not isinstance(spec, dict):
        sys.stderr.write(f"orch: this node has no {NODE_SPEC}: it did not start here\n")
        return 2
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    argv = spec.get("argv") or []
    if argv:
        python_dir = os.path.dirname(os.path.expanduser(str(argv[0])))
        if python_dir:
            env["PATH"] = os.pathsep.join([python_dir, env.get("PATH", "/usr/bin:/bin")])
    code = os.path.join(os.getcwd(), CODE)
    os.chdir(code if os.path.isdir(code) else os.getcwd())
    command = args[1:] if args[:1] == ["--"] else args
    if command:
        target = ["/bin/sh", "-c", " ".join(command)]  # as ssh runs a command
    else:
        shell = env.get("SHELL") or pwd.getpwuid(os.getuid()).pw_shell or "/bin/sh"
        target = [shell, "-i"]
    sys.stdout.flush()
    try:
        os.execvpe(target[0], target, env)
    except OSError as exc:
        sys.stderr.write(f"orch: cannot run {target[0]}: {exc.strerror}\n")
        return 127
    return 0  # not reached
