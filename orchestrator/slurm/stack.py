"""`orch stack` of a running Slurm job: every node of its allocation read at once by one
`srun --overlap --jobid` from the login node, which starts the agent's `slurm-stack`
on each node (from the version the job pinned, `JOB_ROOT/agent`), as `orch top` does
(slurm/top.py); each node answers one JSON line. What is shown, and kept, is the same
as over SSH (reporting/stacks.py, reporting/taken.py).

py-spy: the allocation's nodes share the login node's home, so it is carried once, to
the login node's tools directory (nodes/tools.py), where a node's answer says it lacks
it; a node of another platform than the login node's reads through faulthandler
where its ranks arranged it.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import replace

from orchestrator.agent.kernel import layout
from orchestrator.agent.kernel.messages import MessageError, parse_message
from orchestrator.agent.kernel.replies import StackReply
from orchestrator.agent.kernel.requests import StackRequest
from orchestrator.models.errors import HostError, InputError, OrchError
from orchestrator.models.states import JobState
from orchestrator.nodes import tools
from orchestrator.nodes.shell import sh_path
from orchestrator.records import stacks as kept
from orchestrator.records.db import JobDB, JobRecord
from orchestrator.reporting.reporter import Reporter
from orchestrator.reporting.stacks import StackOptions, StackView
from orchestrator.reporting.taken import chosen, ended_error, keep
from orchestrator.slurm.follow import nodes_of, slurm_id_of
from orchestrator.slurm.jobs import connected, refresh
from orchestrator.slurm.login import LoginNode

STACK_TIMEOUT_S = 60.0  # srun's step start on every node, then each node's reads


def stack_command(record: JobRecord, python: str, nodes: int, request: str) -> str:
    """The srun line that reads every node of the job's allocation, in the job root."""
    root = sh_path(str(record.spec["slurm"]["job_root"]))
    q = shlex.quote
    return (
        f"cd {root} && srun --overlap --jobid={q(slurm_id_of(record))} --nodes={nodes} "
        f"--ntasks-per-node=1 --quiet {q(python)} -I -S "
        f"{layout.AGENT}/{layout.RUN_SCRIPT} slurm-stack {root} {q(request)}"
    )


def parse_replies(text: str) -> dict[str, StackReply]:
    """Each node's line of slurm-stack, by node name; other lines (srun's) are skipped."""
    found = {}
    for line in text.splitlines():
        try:
            data = json.loads(line)
            found[str(data["node"])] = parse_message(StackReply, data["reply"], str(data["node"]))
        except (ValueError, KeyError, TypeError, MessageError):
            continue
    return found


def take(store: JobDB, record: JobRecord, wanted: StackOptions, reporter: Reporter) -> StackView:
    """Take a Slurm job's stacks, keep them in its records, and return them.

    Raises:
        InputError: the job has ended (the error names its kept dumps), waits in
            Slurm's queue, or `wanted` names a node or rank it does not have.
        HostError: the login node cannot be reached, or srun could not read the nodes.
    """
    with connected(record, reporter.notice) as login:
        record = refresh(store, record, login)
        if record.state.is_terminal():
            raise ended_error(record)
        if record.state is JobState.PENDING:
            raise InputError(
                f"job {record.id} waits in Slurm's queue: no rank runs yet",
                f"why it waits: orch status {record.id}",
            )
        nodes = nodes_of(record, login.host, str(record.spec["slurm"].get("nodelist") or ""))
        placed = replace(record, nodes=nodes)
        asked = {n.host.name for n in chosen(placed, wanted)}
        ranks = sorted(r for n in nodes if n.host.name in asked for r in n.ranks)
        if wanted.ranks:
            ranks = [r for r in ranks if r in wanted.ranks]
        carried = tools.pyspy_tools()
        taken = time.time()
        request = StackRequest(
            job_id=record.id,
            ranks=ranks if (wanted.ranks or wanted.nodes) else None,
            native=wanted.native,
            tools_dir=layout.tools_dir(login.host.workdir),
            pyspy={m: t.sha256 for m, t in carried.items()},
            taken=kept.stamp(taken),
        )
        replies = _read(record, login, len(nodes), request)
        lacking = {r.need_tool for r in replies.values() if r.need_tool}
        if lacking:
            for tool in (t for t in carried.values() if t.sha256 in lacking):
                tools.put(login.host, login.transport, tool)
            replies = _read(record, login, len(nodes), request)
        replies = {name: r for name, r in replies.items() if name in asked}
        unanswered: list[OrchError] = [
            HostError(n.host.name, "no answer through srun")
            for n in nodes
            if n.host.name in asked and n.host.name not in replies
        ]
        return keep(placed, taken, replies, unanswered)


def _read(
    record: JobRecord, login: LoginNode, nodes: int, request: StackRequest
) -> dict[str, StackReply]:
    command = stack_command(record, str(login.host.python), nodes, request.to_json())
    result = login.transport.run(command, timeout=STACK_TIMEOUT_S)
    replies = parse_replies(result.stdout)
    if not replies:
        said = (result.stderr.strip() or result.stdout.strip())[-500:]
        raise HostError(login.host.name, f"srun --overlap could not read the nodes: {said}")
    return replies
