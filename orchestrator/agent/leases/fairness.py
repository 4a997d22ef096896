"""The fair line's rules, pure: a ticket's priority and how waiting raises it, each
user's limit, fair share between users, and the host policy file's format. Records
in, answers out, like policy.py; admin.py reads the file, policy.py's `grant` asks
these rules in which order tickets go.

**Standing.** A ticket goes ahead of every ticket of a lower standing, never of a job
that runs (a lease is never taken back). Its standing is its level, then fair share,
then arrival (policy.ticket_key):

- level: `low` 0, `normal` 1, `high` 2 (a `high` ticket whose owner the policy does
  not let use it is read as `normal`), plus one per `age` waited (`Rules.age_s`,
  30 minutes unless the policy says otherwise), counted from the ticket's line time
  (policy.line_time: no earlier than LINE_SLACK_S before its file was made), on
  this host's clock: so no `normal` ticket that came more than two ages after a
  `low` one goes before it (one age, where their users hold as much), nor a `high`
  one three ages after it (two): no ticket waits behind newer ones for ever.
- fair share: between tickets of one level, the one whose user holds fewer units of
  its kind here (live leases, counted by their files' owner) goes first. A ticket of
  a job of several nodes counts as holding more than any user: its place must be
  the same on every host of the job (holdings differ between hosts), or two such
  jobs could each wait for the other; so claiming to be one never moves a ticket up.
- arrival: the time of submit, the job id (as before the fair line).

**Limits.** A user holds at most `limit` units of a kind on this host at once: a
ticket that would pass its user's limit waits, and holds nothing back from the
tickets behind it meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Dict, Tuple  # noqa: UP035

PRIORITIES = ("low", "normal", "high")
LEVELS = {name: level for level, name in enumerate(PRIORITIES)}
NORMAL = "normal"
# How long a ticket waits to rise one level, unless the policy says (`age MINUTES`):
# a `low` job passes the `normal` ones that came after it once it has waited this
# long, and is never overtaken by a `normal` one that came this long after it.
AGE_S = 30 * 60.0
KINDS = {"gpus": "gpu", "gpu": "gpu", "slots": "slot", "slot": "slot"}
EVERYONE = -1  # `*` in the policy: every user
MAX_POLICY = 64 << 10  # bytes of a policy file: a few lines
SEVERAL = float("inf")  # the fair share of a ticket of a job of several nodes

Record = Dict[str, Any]  # noqa: UP006 (run at import: hosts may have Python 3.8)
Limits = Dict[Tuple[int, str], int]  # noqa: UP006 ((uid or EVERYONE, kind): units)


class Rules:
    """A host's policy, as its administrator wrote it (admin.py reads the file):
    how fast waiting raises a ticket, who may use `high`, each user's limit. The
    default (no policy file): 30 minutes a level, `high` for nobody, no limits."""

    def __init__(
        self,
        age_s: float = AGE_S,
        high: frozenset[int] = frozenset(),
        limits: Limits | None = None,
        source: str = "",
    ) -> None:
        self.age_s = age_s
        self.high = high  # uids, or EVERYONE
        self.limits: Limits = dict(limits or {})
        self.source = source  # the file they came from ('' for the default)

    def may_use(self, uid: Any, priority: str) -> bool:
        """Whether user `uid` may submit with `priority`: `high` only where the
        policy names them (or `*`)."""
        return priority != "high" or EVERYONE in self.high or uid in self.high

    def limit(self, uid: Any, kind: str) -> int | None:
        """The most units of `kind` user `uid` may hold here at once; None: no limit.
        A line for the user wins over the one for every user."""
        own = self.limits.get((uid, kind)) if isinstance(uid, int) else None
        return own if own is not None else self.limits.get((EVERYONE, kind))


def priority_of(ticket: Record, rules: Rules) -> str:
    """The priority a ticket is read with: its own, where its owner may use it
    (`uid` is its file's owner, storage.py); else `normal`."""
    asked = ticket.get("priority", NORMAL)
    if asked not in LEVELS:
        return NORMAL
    return asked if rules.may_use(ticket.get("uid"), asked) else NORMAL


def level(ticket: Record, rules: Rules, now: float | None) -> int:
    """The ticket's level: its priority's, plus one per `rules.age_s` waited since its
    line time (`order`); with no clock (`now` None), its priority's alone."""
    base = LEVELS[priority_of(ticket, rules)]
    if now is None or rules.age_s <= 0:
        return base
    waited = now - float(ticket.get("order", now))
    return base + max(0, int(waited // rules.age_s))


def holdings(leases: list[Record], kind: str) -> dict[int, int]:
    """Units of `kind` each user holds here: live leases, by their files' owner."""
    held: dict[int, int] = {}
    for lease in leases:
        if lease.get("kind") == kind and isinstance(lease.get("uid"), int):
            held[lease["uid"]] = held.get(lease["uid"], 0) + len(lease.get("units") or ())
    return held


def standing(
    ticket: Record,
    rules: Rules,
    now: float | None,
    held: dict[int, int],
    arrival: Callable[[Record], tuple[float, str, str]],
) -> tuple[Any, ...]:
    """A ticket's place in the fair line, first first: its level (highest first), its
    user's holdings (fewest first; a job of several nodes after every user), then
    its arrival (`arrival`: policy.ticket_key)."""
    share = SEVERAL if ticket.get("several") else held.get(ticket.get("uid"), 0)  # type: ignore[arg-type]
    return (-level(ticket, rules, now), share, *arrival(ticket))


def over_limit(uid: Any, kind: str, count: int, held: dict[int, int], rules: Rules) -> bool:
    """Whether taking `count` more units would put user `uid` past their limit."""
    most = rules.limit(uid, kind)
    return most is not None and held.get(uid, 0) + count > most


# ---------------------------------------------------------------- the policy file


def parse_policy(
    text: str, source: str, user_id: Callable[[str], int | None]
) -> tuple[Rules, list[str]]:
    """The rules a policy file's text says, and a warning for each line ignored.

    One rule a line, words apart; `#` starts a comment:

        age MINUTES              how long a waiting job takes to rise one level
        high USER...             who may submit with priority high (* for everyone)
        limit USER gpus|slots N  the most a user holds here at once (* for everyone;
                                 a user's own line wins over *)

    Args:
        source: the file's path, for the warnings.
        user_id: a user name's uid on this host, None where there is none (a
            number is read as a uid).

    Returns:
        The rules (the default for what no line says), and the warnings, each
        naming the file, the line and why it was ignored.
    """
    age_s = AGE_S
    high: set[int] = set()
    limits: Limits = {}
    warnings: list[str] = []

    def who(word: str) -> int | None:
        if word == "*":
            return EVERYONE
        if word.isdigit() and int(word) < 1 << 32:
            return int(word)
        return user_id(word)

    for number, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        why = ""
        verb, rest = words[0], words[1:]
        if verb == "age":
            minutes = _number(rest[0]) if len(rest) == 1 else None
            if minutes is None or not 0 < minutes <= 10**6:
                why = "age takes one number of minutes above 0"
            else:
                age_s = minutes * 60.0
        elif verb == "high":
            users = [who(w) for w in rest]
            if not rest:
                why = "high names at least one user (or *)"
            elif None in users:
                why = f"no user {rest[users.index(None)]!r} on this host"
            else:
                high.update(u for u in users if u is not None)
        elif verb == "limit":
            if len(rest) != 3 or rest[1] not in KINDS or not rest[2].isdigit():
                why = "write: limit USER gpus|slots N"
            elif (uid := who(rest[0])) is None:
                why = f"no user {rest[0]!r} on this host"
            else:
                limits[(uid, KINDS[rest[1]])] = int(rest[2])
        else:
            why = f"unknown rule {verb!r} (age, high, limit)"
        if why:
            shown = raw.strip()[:120]
            warnings.append(f"{source}:{number}: {why}: ignored the line {shown!r}")
    return Rules(age_s, frozenset(high), limits, source), warnings


def _number(word: str) -> float | None:
    try:
        value = float(word)
    except ValueError:
        return None
    return value if value == value else None  # not NaN
