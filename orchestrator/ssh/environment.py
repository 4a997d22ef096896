"""A job's environment on its hosts, before its nodes start (docs/ENVIRONMENTS.md):
built where missing, one build for the hosts that share a filesystem, and each node
given the environment's python."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.kernel.replies import EnvReady
from orchestrator.agent.kernel.requests import NodeTemplate
from orchestrator.models.inventory import Host
from orchestrator.nodes import envs
from orchestrator.nodes.group import HostGroup
from orchestrator.reporting.reporter import Reporter
from orchestrator.ssh.plan import LaunchPlan, NodeLaunch
from orchestrator.transport import Transport

log = logging.getLogger(__name__)


def ensure_environment(
    plan: LaunchPlan,
    group: HostGroup,
    digest: str,
    reporter: Reporter,
    ready: dict[str, str],
) -> LaunchPlan:
    """Make sure every node's host has the job's environment (built where missing; hosts
    sharing a filesystem wait for one build) and give each node its python. `ready`:
    the hosts whose push found it built (host -> its python), asked nothing more.

    Raises:
        InfraError: a build failed: the packages and hosts, nothing started.
    """
    env = plan.job.environment
    assert env is not None
    nodes = {n.host.name: n for n in plan.nodes}

    def one(host: Host, transport: Transport) -> EnvReady:
        job_env = {**host.env, **plan.job.env}
        return envs.ensure(host, transport, nodes[host.name].job_dir, env, digest, job_env)

    # First the host of each group sharing a filesystem (it builds where needed), then
    # the others of the group, which find it there.
    firsts = [name for name in plan.snapshots() if name in nodes and name not in ready]
    replies = {name: EnvReady(python=python) for name, python in ready.items() if name in nodes}
    if replies:
        log.info("environment: the push found it built on %s", ", ".join(replies))
    if firsts:
        replies.update(builds(group, one, firsts, reporter))
    failed = {name: r for name, r in replies.items() if r.error is not None or not r.python}
    if failed:
        groups = plan.snapshots()  # a group's others would have used the same build
        raise envs.failure(
            env, {n.host.name: failed[name] for name in failed for n in groups[name]}
        )
    others = [name for name in nodes if name not in replies]
    if others:
        replies.update(builds(group, one, others, reporter))
        failed = {name: r for name, r in replies.items() if r.error is not None or not r.python}
        if failed:
            raise envs.failure(env, failed)
    built = [envs.built_at(name, r) for name, r in replies.items() if r.built]
    if built:
        reporter.notice(f"environment: built on {', '.join(built)}")
    else:
        log.info("environment ready on %s", ", ".join(replies))

    def in_env(node: NodeLaunch) -> NodeLaunch:
        python = replies[node.host.name].python
        assert python is not None
        # The template too: a detached job's keeper renders a later attempt's node
        # on this host from it, which then runs in the environment as well.
        template = parse_message(NodeTemplate, {**node.template.as_dict(), "python": python})
        return replace(node, python=python, template=template)

    return replace(plan, nodes=tuple(in_env(n) for n in plan.nodes))


def builds(
    group: HostGroup,
    one: Callable[[Host, Transport], EnvReady],
    names: Sequence[str],
    reporter: Reporter,
) -> dict[str, EnvReady]:
    """`one` on the hosts `names` at once. A Ctrl-C leaves without waiting for the
    builds under way: each goes on on its host (a command without a terminal is not
    stopped by its connection's end) and is published whole when it ends, or, killed
    halfway, leaves only its temporary directory, which no job uses and the next build
    removes (agent/host/envs.py)."""
    try:
        return group.each(one, only=names)
    except KeyboardInterrupt:
        group.abandon()
        reporter.notice(
            f"environment: the build under way on {', '.join(names)} goes on there; a "
            "later job uses it once it is whole"
        )
        raise
