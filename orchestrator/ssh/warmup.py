"""`orch warm JOB`: the warm interpreters a job's ranks are forked from, started on its
hosts before its first submit (agent/node/warm/ `ahead`), so that they import torch
while the user edits and the first submit does not wait for that import.

The hosts are probed as a submit probes them, since a node's environment (the
interface that routes to the master, say) is part of a warm interpreter's key: the one
started here is the one the submit asks for.
"""

from __future__ import annotations

from orchestrator.agent.kernel.replies import WarmAhead, WarmRow
from orchestrator.agent.kernel.requests import StartRequest
from orchestrator.models.errors import HostError, InputError, OrchError
from orchestrator.models.inventory import Host, Inventory
from orchestrator.models.job import JobSpec
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.nodes.warm import TIMEOUT_S
from orchestrator.records.db import JobDB
from orchestrator.reporting.hosts import WarmInterpreter
from orchestrator.reporting.outcomes import WarmStart
from orchestrator.reporting.reporter import Reporter, phase
from orchestrator.transport import ConnectOptions, Transport


def warm_up(
    job: JobSpec, inventory: Inventory, reporter: Reporter
) -> tuple[dict[str, WarmStart], list[OrchError]]:
    """Start the job's warm interpreters on the hosts it would run on.

    Returns:
        Each host's warm interpreter, and the hosts' errors (one that would start the
        job cold says why).

    Raises:
        InputError: the job asks for cold starts (`warm: false`, `--cold`).
        InfraError / PreflightError: as a submit's connect and probe would.
    """
    from orchestrator.ssh import submit as submitting  # with ssh/check/: for the probe

    if job.cold:
        raise InputError(
            f"the job starts cold: {job.cold}", "remove warm: false from the job to start warm"
        )
    sub = submitting.prepare(job, inventory)
    with HostGroup(sub.hosts, ConnectOptions(notice=reporter.notice)) as group:
        phase(reporter, f"connecting to {len(sub.hosts)} hosts")
        group.connect()
        phase(reporter, f"checking {len(sub.hosts)} hosts")
        plan, _, _ = submitting.plan_with_facts(sub, group, sub.hosts, 0)
        nodes = {n.host.name: n for n in plan.nodes}

        def one(host: Host, transport: Transport) -> WarmStart:
            node = nodes[host.name]
            given = StartRequest(argv=list(node.argv), env=node.env, warm=node.template.warm)
            # On stdin: the env may hold secrets.
            reply = agent.run(
                host, transport, ["warm", "ahead"], [given.to_json().encode()], TIMEOUT_S
            )
            found = agent.parse(host, WarmAhead, reply)
            if found.error or found.pid is None:
                raise HostError(
                    host.name,
                    f"no warm interpreter: {found.error or 'no answer'}",
                    "the job's ranks start cold there (docs/WARM.md)",
                )
            return WarmStart(found.pid, found.started, tuple(job.preload))

        phase(reporter, f"starting warm interpreters on {len(nodes)} hosts")
        started, failures = group.try_each(one)
    # Outside any job's record: `orch kill --all` ends them too.
    JobDB().add_warm_hosts([h for h in sub.hosts if h.name in started])
    return started, failures


def interpreter(host: str, row: WarmRow) -> WarmInterpreter:
    """A warm interpreter as its host's agent listed it (`warm list`)."""
    return WarmInterpreter(
        host,
        row.pid,
        row.state,
        tuple(map(str, row.preload)),
        row.pss_kb,
        row.idle_s,
        row.key,
        row.python,
        row.expires_s,
    )
