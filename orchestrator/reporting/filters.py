"""Which of a job's lines `orch logs` shows (--node, --rank, --tail), for either backend."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.models.errors import InputError
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.reporting.reporter import Reporter


@dataclass
class LogFilter:
    """Which lines `orch logs` shows."""

    node: str | None = None
    rank: int | None = None
    tail: int | None = None

    def nodes(self, record: JobRecord) -> list[NodeRecord]:
        if self.node is None:
            chosen = record.nodes
        else:
            chosen = [n for n in record.nodes if n.host.name == self.node]
            if not chosen:
                raise InputError(
                    f"job {record.id} has no node '{self.node}'",
                    "its nodes: " + ", ".join(n.host.name for n in record.nodes),
                )
        if self.rank is not None:
            chosen = [n for n in chosen if self.rank in n.ranks]
            if not chosen:
                world = sum(n.nproc for n in record.nodes)
                raise InputError(
                    f"job {record.id} has no rank {self.rank} (on the nodes asked for)",
                    f"ranks are 0 to {world - 1}",
                )
        return chosen

    def wants(self, host: str, rank: int | None) -> bool:
        """Whether to show a stream: a rank's (rank) or a node's torchrun output (None)."""
        if self.node is not None and host != self.node:
            return False
        return self.rank is None or rank == self.rank


class FilteredReporter:
    """A Reporter that passes on only the streams a LogFilter wants."""

    def __init__(self, inner: Reporter, want: LogFilter) -> None:
        self.inner, self.want = inner, want

    def job_started(self, job_id: str) -> None:
        self.inner.job_started(job_id)

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        if self.want.wants(host, rank):
            self.inner.output(host, rank, data)

    def notice(self, message: str) -> None:
        self.inner.notice(message)
