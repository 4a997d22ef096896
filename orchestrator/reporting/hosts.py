"""What the verbs about hosts (not jobs) find, as both backends say it: `orch status
--hosts` (each unit, each host's line, the warm interpreters), `orch warm` and the
results of a verb run on many hosts at once. Typed rows, never dicts: the CLI draws
them as tables, `--json` prints `as_json()`, a web page would draw the same rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from orchestrator.models.errors import OrchError

if TYPE_CHECKING:
    from orchestrator.models.inventory import Host

T = TypeVar("T")


class Row:
    """A row of a table of hosts, as JSON data (`as_json`): its fields that hold
    something, in their order (what `orch status --hosts --json` has always printed:
    no key for what a row lacks)."""

    def as_json(self) -> dict[str, Any]:
        found = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None:
                found[f.name] = list(value) if isinstance(value, tuple) else value
        return found


@dataclass(frozen=True)
class UnitRow(Row):
    """One GPU (or slot) a job may be given on a host: free, held by which job and user
    since when, or busy outside orch (by `pid`), or a state of the host's own
    (a Slurm node `down`, `drained`)."""

    host: str
    kind: str  # "gpu" or "slot"
    unit: int
    state: str  # "free", "held", "busy", or the node's own state
    job: str | None = None
    user: str | None = None
    since: float | None = None
    pid: int | None = None


@dataclass(frozen=True)
class QueueRow(Row):
    """A job waiting in a host's line (a Slurm partition's, there), first first."""

    host: str
    position: int  # 1 for the first in line
    job: str
    user: str
    kind: str  # what it waits for: "gpu" or "slot"
    count: int
    since: float | None = None
    priority: str = "normal"  # as the host's policy reads it (docs/SHARING.md)


@dataclass(frozen=True)
class Environment(Row):
    """One environment of this user on a host (docs/ENVIRONMENTS.md): its key, bytes on
    disk, when a job last used it (epoch seconds), and the requirements it holds."""

    host: str
    key: str
    size: int
    used: float
    requirements: tuple[str, ...] = ()


@dataclass(frozen=True)
class WarmInterpreter(Row):
    """One warm interpreter of this user on a host, that a job's ranks fork from: its
    memory is its proportional set size, `idle_s` the seconds since it last launched."""

    host: str
    pid: int
    state: str = "?"
    preload: tuple[str, ...] = ()
    pss_kb: int | None = None
    idle_s: float | None = None
    key: str | None = None
    python: str | None = None
    expires_s: float | None = None


@dataclass(frozen=True)
class HostsView:
    """`orch status --hosts`: each host's units, free or held by whom, the jobs waiting
    in each host's line, this user's warm interpreters, and the hosts that did not
    answer."""

    units: tuple[UnitRow, ...] = ()
    queue: tuple[QueueRow, ...] = ()
    warm: tuple[WarmInterpreter, ...] = ()
    errors: tuple[OrchError, ...] = ()

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        """What `orch status --hosts --json` prints."""
        return {
            "units": [r.as_json() for r in self.units],
            "queue": [r.as_json() for r in self.queue],
            "warm": [r.as_json() for r in self.warm],
        }


@dataclass(frozen=True)
class PerHost(Generic[T]):
    """A verb's result on many hosts: one result per host that answered, and the
    errors of those that did not (one host's failure never hides the others')."""

    results: Mapping[str, T] = field(default_factory=dict)
    errors: tuple[OrchError, ...] = ()

    @classmethod
    def of(cls, results: Mapping[str, T], errors: Sequence[OrchError]) -> PerHost[T]:
        return cls(dict(results), tuple(errors))


def environments(
    hosts: Sequence[Host], notice: Callable[[str], None]
) -> PerHost[tuple[Environment, ...]]:
    """`orch env`: each host's environments of this user (both backends: a Slurm
    cluster's are on its login node, in the shared home)."""
    from orchestrator.nodes import envs

    found, failures = envs.listing(list(hosts), notice)
    rows = {
        host: tuple(
            Environment(host, e.key, e.size, e.used, tuple(e.requirements)) for e in reply.envs
        )
        for host, reply in found.items()
    }
    return PerHost.of(rows, failures)
