"""What `orch stack` asks of one node (the agent's `stack` command), and py-spy carried
to a detached job's hosts ahead of its stall watchdog: the parts of stack.py that the
keeper's start needs too, apart so that neither imports the other's callers."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.agent.kernel.layout import tools_dir
from orchestrator.agent.kernel.replies import StackReply
from orchestrator.agent.kernel.requests import StackRequest
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent, tools
from orchestrator.nodes.group import HostGroup
from orchestrator.nodes.ops import NodeRef
from orchestrator.reporting.reporter import Reporter
from orchestrator.transport import Transport

COMMAND_TIMEOUT_S = 30.0  # the agent's own reads time out at stack.READ_TIMEOUT_S per rank


def carry_pyspy(nodes: Sequence[NodeRef], group: HostGroup, reporter: Reporter) -> dict[str, str]:
    """Send py-spy to the nodes' hosts that lack it (the stall watchdog of a detached
    job takes stacks there without this controller); returns what the stack requests
    name (machine -> hash). A host it cannot reach is said, and left as it is."""
    carried = tools.pyspy_tools()
    wanted = {m: t.sha256 for m, t in carried.items()}
    by_host = {n.host.name: n for n in nodes}

    def carry(host: Host, transport: Transport) -> None:
        node = by_host[host.name]
        request = StackRequest(ranks=[], tools_dir=tools_dir(host.workdir), pyspy=wanted)
        reply = ask(node, transport, request)
        if reply.need_tool:
            tool = next(t for t in carried.values() if t.sha256 == reply.need_tool)
            tools.put(host, transport, tool)

    _, failures = group.try_each(carry, only=list(by_host))
    for failure in failures:
        reporter.notice(f"warning: py-spy not carried there: {failure.message}")
    return wanted


def ask(node: NodeRef, transport: Transport, request: StackRequest) -> StackReply:
    data = request.to_json().encode()
    reply = agent.run(
        node.host, transport, ["stack", node.job_dir], stdin=[data], timeout=COMMAND_TIMEOUT_S
    )
    return agent.parse(node.host, StackReply, reply)
