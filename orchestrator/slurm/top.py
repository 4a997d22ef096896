"""`orch top` of a running Slurm job: every node of its allocation sampled at once by one
`srun --overlap --jobid` from the login node, which starts the agent's `slurm-top` on
each node (from the version the job pinned, `JOB_ROOT/agent`); each node answers one
JSON line. Rates and who falls behind are the same as over SSH
(reporting/top_rates.py).
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from orchestrator.agent.kernel import layout
from orchestrator.agent.kernel.messages import parse_message
from orchestrator.agent.kernel.replies import TopSample
from orchestrator.agent.kernel.requests import SlurmTopRequest
from orchestrator.models.errors import HostError, InputError
from orchestrator.models.states import JobState
from orchestrator.nodes.shell import sh_path
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.reporting.reporter import Reporter
from orchestrator.reporting.top import INTERVAL_S, SILENT_S, NodeView, TopView, ended_error
from orchestrator.reporting.top_rates import log_offsets, node_view, refreshes, top_view
from orchestrator.slurm.follow import nodes_of, slurm_id_of
from orchestrator.slurm.jobs import connected, refresh
from orchestrator.slurm.login import LoginNode

log = logging.getLogger(__name__)
SAMPLE_TIMEOUT_S = 30.0  # srun's step start on every node, then each node's sample


def top_command(record: JobRecord, python: str, nodes: int, request: str) -> str:
    """The srun line that samples every node of the job's allocation, in the job root.
    --overlap: beside the job's own step, on the resources it holds."""
    root = sh_path(str(record.spec["slurm"]["job_root"]))
    q = shlex.quote
    return (
        f"cd {root} && srun --overlap --jobid={q(slurm_id_of(record))} --nodes={nodes} "
        f"--ntasks-per-node=1 --quiet {q(python)} -I -S "
        f"{layout.AGENT}/{layout.RUN_SCRIPT} slurm-top {root} {q(request)}"
    )


def parse_samples(text: str) -> dict[str, TopSample]:
    """Each node's line of slurm-top, by node name; other lines (srun's) are skipped."""
    found = {}
    for line in text.splitlines():
        try:
            data = json.loads(line)
            found[str(data["node"])] = parse_message(TopSample, data["sample"], str(data["node"]))
        except (ValueError, KeyError, TypeError):
            continue
    return found


@dataclass
class SlurmSampler:
    """Samples a Slurm job's nodes, remembering each node's last sample (for rates and
    log offsets) and which ranks were seen printing."""

    record: JobRecord
    login: LoginNode
    nodes: list[NodeRecord]
    interval_s: float = INTERVAL_S
    silent_s: float = SILENT_S
    last: dict[str, TopSample] = field(default_factory=dict)
    talked: set[tuple[str, str]] = field(default_factory=set)
    view: TopView | None = None  # the last refresh

    def sample(self) -> TopView:
        """One refresh of every node (rates need a sample before it).

        Raises:
            HostError: srun could not sample the allocation (the job ended meanwhile, or
                the login node failed).
        """
        offsets = {name: log_offsets(sample) for name, sample in self.last.items()}
        request = SlurmTopRequest(job_id=self.record.id, offsets=offsets).to_json()
        python = str(self.login.host.python)
        command = top_command(self.record, python, len(self.nodes), request)
        result = self.login.transport.run(command, timeout=SAMPLE_TIMEOUT_S)
        samples = parse_samples(result.stdout)
        if not samples:
            said = (result.stderr.strip() or result.stdout.strip())[-500:]
            raise HostError(self.login.host.name, f"srun --overlap could not sample: {said}")
        views = []
        for node in self.nodes:
            name = node.host.name
            if name in samples:
                views.append(node_view(node, samples[name], self.last.get(name), self.talked))
                self.last[name] = samples[name]
            else:
                views.append(NodeView(name, node.node_rank, "unreachable", error="no sample"))
        self.view = top_view(self.record, views, self.interval_s, self.silent_s)
        return self.view


def watch(
    store: JobDB,
    record: JobRecord,
    reporter: Reporter,
    interval_s: float = INTERVAL_S,
    silent_s: float = SILENT_S,
) -> Iterator[TopView]:
    """Refreshes of a running Slurm job, `interval_s` apart, until it ends (the last
    view says so) or the caller stops.

    Raises:
        InputError: the job has ended, or waits in Slurm's queue (exit 2).
        HostError: the login node cannot be reached, or srun could not sample (exit 3).
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
        sampler = SlurmSampler(record, login, nodes, interval_s, silent_s)
        view = sampler.sample()

        def sample() -> TopView:
            """The next view; where srun finds no allocation because the job ended,
            the last one with every node ended."""
            try:
                return sampler.sample()
            except HostError:
                final = refresh(store, record, login)
                if not final.state.is_terminal():
                    raise
                before = sampler.view or view
                ended = tuple(replace(n, state="ended") for n in before.nodes)
                return replace(before, state=final.state.value, time=time.time(), nodes=ended)

        def final() -> str:
            return refresh(store, record, login).state.value

        yield from refreshes(view, sample, final, interval_s)
