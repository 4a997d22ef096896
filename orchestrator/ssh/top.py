"""`orch top`: how every node of a running job is doing, sampled over one connection per
host with one agent command (`top`, agent/top.py) per host and refresh.

Each refresh asks every node for its ranks' cumulative CPU seconds, resident memory,
GPUs and log growth; rates come from two consecutive samples of one host, on that
host's own monotonic clock (the network's delay is no part of them). The host reads
only what a log grew by since the last refresh, never a whole log.

Who falls behind is reporting/top_rates.py's (`laggards`).

`--once --json` prints `TopView.to_json()`: its shape is documented there and stable
(fields may be added, none renamed or removed).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from orchestrator.agent.kernel.replies import TopSample
from orchestrator.agent.kernel.requests import TopRequest
from orchestrator.models.errors import HostError, MultiHostError, OrchError
from orchestrator.models.inventory import Host
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup, connect_reachable
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.reporting.reporter import Reporter
from orchestrator.reporting.top import INTERVAL_S, SILENT_S, NodeView, TopView, ended_error
from orchestrator.reporting.top_rates import log_offsets, node_view, refreshes, top_view
from orchestrator.ssh.reconcile import SETTLED, reconcile
from orchestrator.transport import Transport

SAMPLE_TIMEOUT_S = 20.0


# ---------------------------------------------------------------- sampling


@dataclass
class Sampler:
    """Samples a job's nodes over a connected group, remembering what rates need: each
    host's last sample, its logs' offsets, and which ranks were seen printing. A host
    whose sample fails shows as unreachable from then on: asking it again would hold
    every later refresh for up to SAMPLE_TIMEOUT_S (a new `orch top` tries again)."""

    record: JobRecord
    group: HostGroup
    interval_s: float = INTERVAL_S
    silent_s: float = SILENT_S
    unreachable: dict[str, str] = field(default_factory=dict)
    last: dict[str, TopSample] = field(default_factory=dict)
    talked: set[tuple[str, str]] = field(default_factory=set)

    def sample(self) -> TopView:
        """One refresh of every node: a TopView (rates need a sample before it)."""
        nodes = {n.host.name: n for n in self.record.nodes}
        results, failures = self.group.try_each(
            lambda host, transport: self._ask(nodes[host.name], host, transport),
            only=[n for n in nodes if n not in self.unreachable],
        )
        for failure in failures:
            if isinstance(failure, HostError):
                self.unreachable[failure.host] = failure.what
        views = []
        for node in self.record.nodes:
            name = node.host.name
            if node.state in SETTLED:  # its end is recorded: not asked
                views.append(NodeView(name, node.node_rank, "ended"))
            elif name in results:
                views.append(node_view(node, results[name], self.last.get(name), self.talked))
                self.last[name] = results[name]
            else:
                error = self.unreachable.get(name, "not sampled")
                views.append(NodeView(name, node.node_rank, "unreachable", error=error))
        return top_view(self.record, views, self.interval_s, self.silent_s)

    def _ask(self, node: NodeRecord, host: Host, transport: Transport) -> TopSample:
        before = self.last.get(host.name)
        offsets = log_offsets(before) if before is not None else {}
        request = TopRequest(job_id=self.record.id, offsets=offsets).to_json().encode()
        reply = agent.run(
            host, transport, ["top", node.job_dir], stdin=[request], timeout=SAMPLE_TIMEOUT_S
        )
        return agent.parse(host, TopSample, reply)


def watch(
    store: JobDB,
    record: JobRecord,
    reporter: Reporter,
    interval_s: float = INTERVAL_S,
    silent_s: float = SILENT_S,
) -> Iterator[TopView]:
    """Refreshes of a running job, `interval_s` apart, until it ends (the last view
    says so) or the caller stops. The first view has no rates: they need two samples.
    `silent_s`: how long a rank that talks may be silent before it is behind.

    Raises:
        InputError: the job has ended before the first view (exit 2).
        HostError / MultiHostError: no host of the job answers (exit 3).
    """
    nodes = [n for n in record.nodes if n.state not in SETTLED]
    if not nodes:  # every node's end is recorded, the job's not yet
        raise ended_error(reconcile(store, record, reporter))
    group, failures = connect_reachable([n.host for n in nodes], reporter.notice)
    with group:
        if not group.transports:
            raise _combined(failures)
        sampler = Sampler(record, group, interval_s, silent_s)
        sampler.unreachable = {f.host: f.what for f in failures if isinstance(f, HostError)}
        view = sampler.sample()
        if not sampler.last:  # every host failed the sample itself
            raise _combined([HostError(n.host, n.error or "?") for n in view.nodes])
        if view.ended:
            raise ended_error(reconcile(store, record, reporter))

        def final() -> str:
            return reconcile(store, record, reporter).state.value

        yield from refreshes(view, sampler.sample, final, interval_s)


def _combined(failures: Sequence[OrchError]) -> OrchError:
    return failures[0] if len(failures) == 1 else MultiHostError(failures)
