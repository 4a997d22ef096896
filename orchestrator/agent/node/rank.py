"""`rank LOG_DIR CODE_DIR KIND TARGET [FLAG] -- ARGS`: how the user's code starts.

Under torchrun, once per rank: sends the rank's stdout and stderr to its own log file
in LOG_DIR and records its process group. With launcher python, once per node and
LOG_DIR `-`: the output stays the node's, and the supervisor records the group. Then
it moves into the code snapshot (torchrun runs in the node's directory: where hosts
share a filesystem, their nodes share one snapshot) and execs the user's script (KIND
script) or module (KIND module) with this interpreter. FLAG (`--local-rank` or
`--local_rank`) passes LOCAL_RANK as an argument before ARGS, as the legacy
torch.distributed.launch did, for scripts that read only that.

Before the user's code, the rank makes its stack readable (`traceable.arrange`, for
`orch stack`): under torchrun its interpreter is started through traceable.BOOT where
that way is faulthandler."""

from __future__ import annotations

import os
import sys

from ..host import proc
from . import traceable


def main(args: list[str]) -> int:
    if "--" not in args or len(args[: args.index("--")]) not in (4, 5):
        raise SystemExit("orch supervisor: malformed rank arguments")
    head, user_args = args[: args.index("--")], args[args.index("--") + 1 :]
    log_dir, code_dir, kind, target, *flag = head
    traced: dict[str, object] = {}
    rank = os.environ.get("RANK", "0")
    if log_dir != "-":
        traced = to_own_log(log_dir, rank)
    os.chdir(code_dir)
    entry = [target] if kind == "script" else ["-m", target]
    given = [f"{flag[0]}={os.environ.get('LOCAL_RANK', '0')}"] if flag else []
    argv = traceable.boot_argv(sys.executable, traced, [*entry, *given, *user_args])
    os.execv(sys.executable, argv)
    return 127  # not reached


def to_own_log(log_dir: str, rank: str) -> dict[str, object]:
    """The rank's start, cold and warm: its pid recorded, its output to its own log,
    its stack made readable (traceable.py); returns how (the trace record)."""
    os.makedirs(log_dir, exist_ok=True)
    # torchrun gave this process its own session: its pid is the rank's process group;
    # with its start time, kill can tell it from a later process given the same pid.
    with open(os.path.join(log_dir, f"rank-{rank}.pid"), "w") as f:
        f.write(f"{os.getpid()} {proc.start_time(os.getpid())}")
    fd = os.open(
        os.path.join(log_dir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return traceable.arrange(log_dir, rank)
