"""`rank LOG_DIR CODE_DIR KIND TARGET -- ARGS`: torchrun's entry for each rank. Sends
the rank's stdout and stderr to its own log file, records its process group, moves
into the code snapshot (torchrun runs in the node's directory: where hosts share a
filesystem, their nodes' ranks share one snapshot), then execs the user's script
(KIND script) or module (KIND module) with torchrun's interpreter."""

from __future__ import annotations

import os
import sys

from . import proc


def main(args: list[str]) -> int:
    log_dir, code_dir, kind, target, sep, *user_args = args
    if sep != "--":
        raise SystemExit("orch supervisor: malformed rank arguments")
    rank = os.environ.get("RANK", "0")
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
    os.chdir(code_dir)
    entry = [target] if kind == "script" else ["-m", target]
    os.execv(sys.executable, [sys.executable, "-u", *entry, *user_args])
    return 127  # not reached
