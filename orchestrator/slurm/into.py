"""Into a running Slurm job: `orch ssh`, `orch exec JOB` and `orch forward`, through the
login node, as a person would with `srun --overlap` and `ssh -L`.

- `orch ssh JOB [NODE]`: `srun --overlap --jobid -w NODE` from the node's directory of
  the job root (shared with the login node), running the agent's `shell` there as over
  SSH: the job's environment comes from the node's own node.json, which the node's
  launcher wrote (agent/node/srun.py), never an argv. On a terminal, with `--pty`.
- `orch exec JOB -- COMMAND`: one such step per node, all at once (nodes/execute.py's
  `run_lines`, each over a connection of its own to the login node, named by its
  node), so that each node's lines and exit code are its own, and Ctrl-C stops every
  step (srun ends its step's tasks when it is signalled).
- `orch forward JOB PORT`: a tunnel made by the login node's sshd to the node's address
  (`ssh -L LOCAL:NODE:PORT LOGIN`): the server on the node must listen on that address
  (0.0.0.0), not on its loopback only.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.agent.kernel import layout
from orchestrator.models.errors import ExecFailed, InputError
from orchestrator.models.states import JobState
from orchestrator.nodes.execute import HostRun
from orchestrator.nodes.into import Forwarding, ForwardOptions, ShellOptions, running_node
from orchestrator.nodes.into import exec_in_job as in_every_node
from orchestrator.nodes.shell import sh_path
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.reporting.reporter import Reporter
from orchestrator.slurm.follow import nodes_of, slurm_id_of
from orchestrator.slurm.jobs import connected, refresh
from orchestrator.slurm.login import LoginNode

NODE_ADDR = re.compile(r"\bNodeAddr=(\S+)")
# srun's own word on a task's exit code, which `orch exec` says once for every node
TASK_EXIT = re.compile(r"^srun: error: \S+: task \d+: Exited with exit code \d+$")


def step_command(
    record: JobRecord, node: NodeRecord, command: Sequence[str], *, pty: bool = False
) -> str:
    """The login node's line that runs the agent's `shell` (with `command`, if any) on
    `node`, in its directory, as a step of the job's allocation."""
    q = shlex.quote
    python = sh_path(str(node.host.python))
    shell = ("shell", "--", *command) if command else ("shell",)
    return (
        f"cd {sh_path(node.job_dir)} && exec srun --overlap --jobid={q(slurm_id_of(record))} "
        f"--nodelist={q(node.host.name)} --nodes=1 --ntasks=1 --quiet"
        f"{' --pty' if pty else ''} {python} -I -S {layout.AGENT}/{layout.RUN_SCRIPT} "
        f"{shlex.join(shell)}"
    )


def shell(store: JobDB, record: JobRecord, options: ShellOptions, reporter: Reporter) -> int:
    """`orch ssh` on a Slurm job: the shell's (or the command's) exit status.

    Raises:
        InputError: the job has ended, waits in Slurm's queue, or has no such node.
        HostError: the login node cannot be reached.
    """
    with connected(record, reporter.notice) as login:
        node = running_node(_placed(store, record, login, "orch ssh"), options.node, "orch ssh")
        pty = sys.stdin.isatty() and sys.stdout.isatty()
        return login.transport.interactive(step_command(record, node, options.command, pty=pty))


def exec_in_job(
    store: JobDB, record: JobRecord, command: Sequence[str], reporter: Reporter
) -> list[HostRun]:
    """`orch exec JOB -- COMMAND` on a Slurm job: each node's run, in node rank order.

    Raises:
        InputError: the job has ended or waits in Slurm's queue, or no command.
        ExecFailed: the command failed on some node (exit code: the worst node's).
        HostError: the login node cannot be reached.
    """
    with connected(record, reporter.notice) as login:
        placed = _placed(store, record, login, "orch exec")
    runs = in_every_node(
        placed,
        command,
        lambda node, line: (
            None if TASK_EXIT.match(line) else reporter.output(node, None, (line + "\n").encode())
        ),
        reporter.notice,
        lambda node: step_command(record, node, command),
    )
    if any(not r.ok for r in runs):
        raise ExecFailed(runs)
    return runs


def forward(
    store: JobDB, record: JobRecord, options: ForwardOptions, reporter: Reporter
) -> Forwarding:
    """`orch forward` on a Slurm job: the node's port through its login node.

    Raises:
        InputError: the job has ended or waits in Slurm's queue, no such node, or the
            local port is in use.
        HostError: the login node cannot be reached.
    """
    with connected(record, reporter.notice) as login:
        node = running_node(
            _placed(store, record, login, "orch forward"), options.node, "orch forward"
        )
        address = node_address(login, node.host.name)
    return Forwarding(login.host, options.port, options.local_port, reporter.notice, address)


def node_address(login: LoginNode, name: str) -> str:
    """The address Slurm reaches node `name` at (its NodeAddr), else its name, which
    the login node resolves."""
    said = login.run(f"scontrol show node --oneliner {shlex.quote(name)}").stdout
    found = NODE_ADDR.search(said)
    return found.group(1) if found and found.group(1) != "(null)" else name


def _placed(store: JobDB, record: JobRecord, login: LoginNode, verb: str) -> JobRecord:
    """The job as Slurm has it now, with its allocation's nodes.

    Raises:
        InputError: it has ended (the hint names its files) or waits in the queue.
    """
    record = refresh(store, record, login)
    if record.state is JobState.PENDING:
        raise InputError(
            f"job {record.id} waits in Slurm's queue: {verb} reaches running jobs",
            f"why it waits: orch status {record.id}",
        )
    if record.state.is_terminal():
        return record
    nodelist = str(record.spec["slurm"].get("nodelist") or "")
    return replace(record, nodes=nodes_of(record, login.host, nodelist))
