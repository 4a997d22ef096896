"""A job's outputs, from its nodes' ORCH_OUTPUT_DIR to this machine (`orch pull`, and
at the end of a job that names `outputs:`), over SSH: which nodes to ask. The copying
itself is reporting/receive.py, which the Slurm backend uses too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orchestrator.nodes.group import HostGroup
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.reporting.receive import bring_back


def sources(record: JobRecord, every_node: bool | None = None) -> list[NodeRecord]:
    """The nodes to pull from: node rank 0, or all (as the job's `outputs:` says)."""
    every = record.view.outputs_from == "all" if every_node is None else every_node
    return sorted(record.nodes, key=lambda n: n.node_rank)[: None if every else 1]


def bring_outputs(
    record: JobRecord, group: HostGroup, target: Path | None, notice: Callable[[str], None]
) -> None:
    """At a job's end: pull what its `outputs:` name from the nodes that answer, and say
    where it went (reporting/receive.py bring_back)."""
    nodes = [n for n in sources(record) if n.host.name in group.transports]
    bring_back(record, group, nodes, target, notice)
