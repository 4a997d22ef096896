"""A dump of stacks, whichever backend took it: which of a job's nodes are asked
(`chosen`), the dump kept with the job's records (`keep`: records/stacks.py, as
`orch stack -v` prints it and as `--json`), and the error for a job that has ended,
naming the dumps kept (`ended_error`)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from orchestrator.models.errors import HostError, InputError, OrchError
from orchestrator.models.states import JobState
from orchestrator.records import stacks as kept
from orchestrator.records.db import JobRecord, NodeRecord
from orchestrator.reporting import stacks
from orchestrator.reporting.stacks import StackOptions as Wanted

if TYPE_CHECKING:
    from orchestrator.agent.kernel.replies import StackReply

SETTLED = (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED)


def keep(
    record: JobRecord,
    taken: float,
    replies: dict[str, StackReply],
    unanswered: list[OrchError],
) -> stacks.StackView:
    """The replies as a StackView, kept in the job's records."""
    for host, reply in list(replies.items()):
        if not reply.exists:
            unanswered.append(HostError(host, "the job's directory is not on this host"))
            del replies[host]
    order = [n.host.name for n in record.nodes]
    missing = [(f.host or "?", f.what) for f in unanswered]
    found = stacks.view(record.id, taken, replies, missing, order)
    text = "\n".join(stacks.lines(found, verbose=True)) + "\n"
    path = kept.save(record.id, taken, text, found.to_json())
    return replace(found, saved=str(path))


def chosen(record: JobRecord, wanted: Wanted) -> list[NodeRecord]:
    """The job's nodes that hold a wanted rank and have not ended.

    Raises:
        InputError: a host or rank that is not the job's.
    """
    names = {n.host.name for n in record.nodes}
    for name in wanted.nodes:
        if name not in names:
            raise InputError(
                f"--node {name}: job {record.id} has no node there",
                f"its nodes: {', '.join(sorted(names))}",
            )
    ranks = {r for n in record.nodes for r in n.ranks}
    for rank in wanted.ranks:
        if rank not in ranks:
            last = max(ranks) if ranks else -1
            raise InputError(
                f"--rank {rank}: job {record.id} has no rank {rank}",
                f"its ranks are 0 to {last}",
            )
    return [
        n
        for n in record.nodes
        if n.state not in SETTLED
        and (not wanted.nodes or n.host.name in wanted.nodes)
        and (not wanted.ranks or set(wanted.ranks) & set(n.ranks))
    ]


def ended_error(record: JobRecord) -> InputError:
    """The job has ended: what it kept of its stacks, if anything."""
    dumps = kept.saved(record.id)
    if dumps:
        more = f" ({len(dumps)} in all, in {dumps[-1].parent})" if len(dumps) > 1 else ""
        hint = f"the stacks taken while it ran: {dumps[-1]}{more}"
    else:
        hint = f"no stacks were taken while it ran; what it printed: orch logs {record.id}"
    return InputError(
        f"job {record.id} has ended ({record.state.value}): its ranks have no stacks to take",
        hint,
    )
