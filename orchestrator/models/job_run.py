"""Job-file keys about the job while it runs, each read and checked at load: the
stall watchdog (`stall_after:`, `on_stall:`), ports forwarded to the laptop
(`forward:`), warm starts (`warm:`, `preload:`) and the curves the page draws
(`metrics:`). job.py puts them into the JobSpec."""

from __future__ import annotations

import re

from orchestrator.models.metrics import pattern_problem
from orchestrator.models.schema import Where, get_str, get_str_list

STALL_MIN_S = 10  # below this a stall is a step, not a hang: `stall_after:` says at least this
ON_STALL = ("fail", "warn")

_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


STALL_HINT = (
    f"seconds with no line from any rank, at least {STALL_MIN_S}: a few times the job's "
    "longest quiet stretch (a step, an eval, a checkpoint), e.g. stall_after: 600"
)


def load_stall_after(where: Where) -> int | None:
    value = where.mapping.get("stall_after")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error("stall_after", f"expected a number of seconds, got {value!r}", STALL_HINT)
    if value < STALL_MIN_S:
        raise where.error(
            "stall_after", f"must be at least {STALL_MIN_S} s, got {value}", STALL_HINT
        )
    return int(value)


def port_pair(text: str) -> tuple[int, int | None]:
    """`PORT` or `PORT:LOCAL` (LOCAL 0: any free port on the laptop).

    Raises:
        ValueError: not that, or a number out of range.
    """
    remote, _, local = text.partition(":")
    port, local_port = int(remote), (int(local) if local else None)
    if not 1 <= port <= 65535 or not (local_port is None or 0 <= local_port <= 65535):
        raise ValueError(text)
    return port, local_port


def load_forward(where: Where) -> tuple[tuple[int, int | None], ...]:
    value = where.mapping.get("forward")
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    found = []
    for item in items:
        try:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                raise ValueError(item)
            found.append(port_pair(str(item)))
        except ValueError:
            raise where.error(
                "forward",
                f"not a port: {item!r}",
                "forward: [6006] or forward: ['8888:18888'] (the master's port, and the laptop's)",
            ) from None
    return tuple(found)


# A job's place in a shared host's line (docs/SHARING.md): the agent's own list is
# agent/leases/fairness.py PRIORITIES (models import nothing of the agent but its
# state names; a unit test holds the two equal).
PRIORITIES = ("low", "normal", "high")
PRIORITY_HINT = (
    "low, normal or high: a higher one goes ahead in a shared host's line "
    "(high only for the users the hosts' policy names)"
)


def load_priority(where: Where) -> str:
    value = get_str(where, "priority", "normal") or "normal"
    if value not in PRIORITIES:
        raise where.error("priority", f"unknown priority {value!r}", PRIORITY_HINT)
    return value


def load_on_stall(where: Where) -> str:
    value = get_str(where, "on_stall", "fail") or "fail"
    if value not in ON_STALL:
        raise where.error(
            "on_stall",
            f"unknown on_stall {value!r}",
            "fail (take the stacks and fail the job, so that restarts: apply) or warn "
            "(take and show them, and let it run)",
        )
    return value


def load_preload(where: Where) -> tuple[str, ...]:
    if "preload" not in where.mapping:
        return ("torch",)
    names = get_str_list(where, "preload")
    for name in names:
        if not _MODULE_RE.match(name):
            raise where.error(
                "preload", f"preload: {name!r} is not a module name", "write e.g. [torch, numpy]"
            )
    return names


def load_metrics(where: Where) -> tuple[str, ...]:
    patterns = get_str_list(where, "metrics")
    for pattern in patterns:
        if (why := pattern_problem(pattern)) is not None:
            raise where.error(
                "metrics",
                f"bad pattern {pattern!r}: {why}",
                "write a regular expression with a named group per number, e.g. "
                "'val acc (?P<val_acc>[0-9.]+)'",
            )
    return patterns


def load_warm(where: Where) -> str | None:
    value = where.mapping.get("warm", True)
    if not isinstance(value, bool):
        raise where.error("warm", f"warm: {value!r} is not true or false", "write warm: false")
    return None if value else "warm: false in the job file"


def pattern_error(pattern: str) -> str | None:
    """Why no gitignore matcher can read `pattern` (`!` alone, a lone backslash,
    `[z-a]`), or None: the one rule for `exclude:` and the workdir's ignore files."""
    import pathspec  # only where a pattern is read: not on `orch kill`'s path

    try:
        pathspec.GitIgnoreSpec.from_lines([pattern])
    except (ValueError, re.error) as exc:
        return str(exc)
    return None
