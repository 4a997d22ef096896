"""Placeholders in a job's `args` and `env` values, expanded per node.

`{node_rank}` and the other NAMES become that node's value; `{{` is a literal `{`
(so `{{node_rank}` gives `{node_rank}`); `${NAME}` is left alone, as a shell's. Every
other character stays verbatim, so `{"lr": 0.1}` or a lone `}` pass through as today.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

NAMES = (
    "node_rank",  # this node's rank, 0 on the master
    "num_nodes",
    "master_addr",
    "master_port",
    "nproc",  # this node's process count
    "nprocs_list",  # every node's process count, comma-separated, in node order
    "world_size",
)
_TOKEN = re.compile(r"\{\{|\$\{[^}]*\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def unknown(value: str) -> list[str]:
    """The placeholder names in `value` that are not NAMES, in order."""
    return [m[1] for m in _TOKEN.finditer(value) if m[1] and m[1] not in NAMES]


def used(values: Iterable[str]) -> set[str]:
    """The placeholder names that occur in any of `values`."""
    return {m[1] for value in values for m in _TOKEN.finditer(value) if m[1]}


def suggestion(name: str) -> str:
    """A hint for an unknown name: the closest known one, and the whole list."""
    close = difflib.get_close_matches(name, NAMES, n=1)
    known = ", ".join("{" + n + "}" for n in NAMES)
    maybe = f"did you mean {{{close[0]}}}? " if close else ""
    return f"{maybe}placeholders: {known}; write {{{{ for a literal {{"


def expand(value: str, values: Mapping[str, str]) -> str:
    """`value` with each placeholder replaced by its entry in `values`.

    Raises:
        KeyError: a placeholder `values` lacks (the job's loader refuses unknown ones).
    """

    def one(match: re.Match[str]) -> str:
        token = match[0]
        if token == "{{":
            return "{"
        if match[1] is None:  # ${NAME}: a shell's, not ours
            return token
        return values[match[1]]

    return _TOKEN.sub(one, value)
