"""The agent's entry: `COMMAND ARGS...`, each command in its own module (in the room
that holds it), imported only when it runs (a host command's start is on every path
of orch)."""

from __future__ import annotations

import importlib
import os
import sys

# command -> module; each module's main(args) returns the exit code
COMMANDS = {
    "probe": "host.probe",
    "nettest": "host.nettest",
    "start": "node.start",
    "status": "node.status",
    "follow": "node.follow",
    "kill": "node.kill",
    "rank": "node.rank",
    "setup": "node.setup",
    "outputs": "node.outputs",
    "top": "node.top",
    "stack": "node.stack",
    "shell": "node.shell",
    "tool-put": "host.tools",
    "slurm-node": "node.srun",
    "slurm-top": "node.slurm_top",
    "slurm-stack": "node.slurm_stack",
    "slurm-shell": "node.slurm_shell",
    "slurm-attempt": "node.chain",
    "sync": "store.sync",
    "relay": "store.relay",
    "gc": "store.gc",
    "lease": "leases.commands",
    "keeper": "keeper.commands",
    "warm": "node.warm.commands",
    "torchrun": "node.torchrun",
    "env": "host.envs",
}
USAGE = """usage: orch agent COMMAND ARGS...
  probe [MASTER|OPTIONS]              this host's facts as JSON (no torch import)
  start JOB_DIR                       (stdin: the node spec) start torchrun under a supervisor
  status JOB_DIR                      whether the node started, runs, ended how
  follow JOB_DIR [OFFSETS] [--once]   stream the node's logs until it ends
  kill JOB_DIR [GRACE [JOB_ID [PORT]]]
                                      stop every process of the job on this host
  rank LOG_DIR CODE KIND TARGET -- ARGS
                                      torchrun's entry for each rank
  sync                                (stdin: frames) store content, build a snapshot
  relay                               (stdin: store, secret) serve the store to a push's hosts
  outputs DIR                         (stdin: globs, what the controller has) send outputs
  setup JOB_DIR                       (stdin: its spec) run the job's setup:, mark it done
  gc                                  (stdin: a frame) drop old snapshots and content
  nettest TEST ARGS...                listen, connect, bwserve, bwclient
  keeper start|member|show|stop DIR   a detached job's restarts on its hosts (stdin: config)
  lease poll|take|untake|go JOB_DIR   a node's place in line for its GPUs or slots
  lease hosts                         every lease and ticket of this host
  lease dir                           where the lease directory is, and who owns it
  top JOB_DIR                         (stdin: offsets) CPU, memory, GPUs, log growth of its ranks
  stack JOB_DIR                       (stdin: which ranks) every rank's Python stack
  shell [-- COMMAND...]               (in a node's directory) a shell there, the job's env
  tool-put DIR NAME SHA256            (stdin: the binary) keep a tool orch carries (py-spy)
  slurm-node JOB_ROOT                 under srun, on each node of a Slurm job: its torchrun
  slurm-top JOB_ROOT REQUEST          under srun --overlap: `top` of this node of a Slurm job
  slurm-stack JOB_ROOT REQUEST        under srun --overlap: `stack` of this node of a Slurm job
  slurm-shell JOB_ROOT ATTEMPT -- CMD under srun --overlap: `shell` with CMD on this node, its code
  slurm-attempt begin|end JOB_ROOT ATTEMPT [PREVIOUS|RC]
                                      a Slurm job's restarts: run or skip, queue the next
  warm ensure|list|stop [KEY]         warm interpreters a job's ranks are forked from
  torchrun ARGS                       a node's torchrun (torch.distributed.run), leaner
  env ensure JOB_DIR | list ENVS | gc ENVS DAYS
                                      the jobs' virtual environments (stdin: the request)
"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(USAGE)
        return 2
    # Owner-only, whatever the login's umask: node.json holds the job's env, logs
    # what the ranks print; the ranks inherit it too (a multi-user host is the norm).
    os.umask(0o077)
    command = importlib.import_module(f".{COMMANDS[argv[0]]}", __package__)
    try:
        code: int = command.main(argv[1:])
    except BrokenPipeError:  # the controller went away while following
        return 0
    return code
