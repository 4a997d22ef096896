"""What a running job tells the user: the protocols the CLI implements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from orchestrator.sync.push import PushProgress


class Reporter(Protocol):
    """What a running submit tells the user (implemented by the CLI).

    1. `job_started(job_id)` comes once, before any host is changed.
    2. `output()` comes with the next bytes of one rank, or of a node's torchrun (rank
       None), in each one's order, exactly as the host's file holds them: complete
       lines, except that a chunk may end inside a line that holds a `\\r` (a progress
       bar being redrawn, continued by the next chunk), and the stream's very last, or
       a piece of an overlong line, may end without a newline.
    3. `notice()` is a diagnostic for stderr: progress, host keys, teardown.
    """

    def job_started(self, job_id: str) -> None: ...

    def output(self, host: str, rank: int | None, data: bytes) -> None: ...

    def notice(self, message: str) -> None: ...


@runtime_checkable
class ProgressReporter(Protocol):
    """A Reporter that can also show how far a code push is (optional: those without
    `progress` get no progress).

    1. `progress()` comes from the hosts' threads, for each host at the start of its
       push, after each round trip, and once with `finished` at its end.
    """

    def progress(self, update: PushProgress) -> None: ...


@runtime_checkable
class PhaseReporter(Protocol):
    """A Reporter that can also say where a submit is before the job's output flows
    (optional: those without `phase` are told nothing).

    1. `phase()` comes as the submit moves on: connecting, probing, pushing, starting.
    """

    def phase(self, message: str) -> None: ...


def phase(reporter: Reporter, message: str) -> None:
    """Tell `reporter` where the submit is, if it wants to know."""
    if isinstance(reporter, PhaseReporter):
        reporter.phase(message)
