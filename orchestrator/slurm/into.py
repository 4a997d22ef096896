"""Into a running Slurm job: `orch ssh`, `orch exec JOB` and `orch forward`, through the
login node, as a person would with `srun --overlap` and `ssh -L`.

- `orch ssh JOB [NODE]`: `srun --overlap --jobid -w NODE` from the node's directory of
  the job root (shared with the login node), running the agent's `shell` there as over
  SSH: the job's environment comes from the node's own node.json, which the node's
  launcher wrote (agent/node/srun.py), never an argv. On a terminal, with `--pty`.
- `orch exec JOB -- COMMAND`: one labelled step for every node of the allocation, as
  `orch top` and `orch stack` are, over one SSH session to the login node (a session
  per node would meet sshd's MaxStartups and MaxSessions, 10 by default, at a few
  dozen nodes). The agent's `slurm-shell` on each node says its name first and its
  exit code last, so each node's lines and exit code are its own; Ctrl-C stops the
  step's session (nodes/execute.py's `run_lines`), and srun its tasks.
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
from orchestrator.agent.kernel.slurm import EXIT_MARK, NODE_MARK
from orchestrator.models.errors import ExecFailed, InputError
from orchestrator.models.states import JobState
from orchestrator.nodes.execute import LOST, HostRun, remote_command, run_lines
from orchestrator.nodes.into import (
    Forwarding,
    ForwardOptions,
    ShellOptions,
    exec_nodes,
    running_node,
)
from orchestrator.nodes.shell import sh_path
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.reporting.reporter import Reporter
from orchestrator.slurm.follow import nodes_of, slurm_id_of
from orchestrator.slurm.jobs import connected, refresh
from orchestrator.slurm.jobs import login_host as login_host_of
from orchestrator.slurm.login import LoginNode
from orchestrator.transport import ConnectOptions

NODE_ADDR = re.compile(r"\bNodeAddr=(\S+)")
# srun's own word on a task's exit code, which `orch exec` says once for every node
TASK_EXIT = re.compile(r"^srun: error: \S+: task \d+: Exited with exit code \d+$")
LABELLED = re.compile(r"^\s*(\d+): (.*)$")  # srun --label: "TASK: line"


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
        Interrupted: Ctrl-C; the step was stopped first.
    """
    with connected(record, reporter.notice) as login:
        placed = _placed(store, record, login, "orch exec")
    nodes = exec_nodes(placed, command)
    tasks: dict[str, str] = {}  # srun's task label -> its node
    ends: dict[str, int] = {}

    def on_line(login_name: str, line: str) -> None:
        label = LABELLED.match(line)
        if label is None:  # srun's own word
            if not TASK_EXIT.match(line):
                reporter.output(login_name, None, (line + "\n").encode())
            return
        task, said = label.groups()
        if said.startswith(NODE_MARK) and task not in tasks:
            tasks[task] = said.removeprefix(NODE_MARK)
        elif said.startswith(EXIT_MARK) and task in tasks:
            ends[tasks[task]] = int(said.removeprefix(EXIT_MARK))
        else:
            reporter.output(tasks.get(task, login_name), None, (said + "\n").encode())

    login_host = login_host_of(record)
    step = remote_command([exec_step(record, len(nodes), command)])
    (ran,) = run_lines(
        [login_host], {login_host.name: step}, on_line, ConnectOptions(notice=reporter.notice)
    )
    runs = [
        HostRun(n.host.name, ends[n.host.name])
        if n.host.name in ends
        else HostRun(n.host.name, LOST, ran.error)
        for n in nodes
    ]
    if any(not r.ok for r in runs):
        raise ExecFailed(runs)
    return runs


def exec_step(record: JobRecord, nodes: int, command: Sequence[str]) -> str:
    """The login node's line that runs `command` on every node of the job's allocation,
    each in its node's directory (the agent's `slurm-shell`), as one labelled step."""
    q = shlex.quote
    root = sh_path(str(record.spec["slurm"]["job_root"]))
    python = sh_path(str(login_host_of(record).python))
    return (
        f"cd {root} && exec srun --overlap --jobid={q(slurm_id_of(record))} --nodes={nodes} "
        f"--ntasks-per-node=1 --label --quiet {python} -I -S "
        f"{layout.AGENT}/{layout.RUN_SCRIPT} slurm-shell {root} {record.view.attempt} -- "
        f"{shlex.join(command)}"
    )


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
