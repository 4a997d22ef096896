"""The job file's `metrics:`: regular expressions whose named groups are numbers to plot
(reporting/metrics.py finds them in the ranks' lines; `orch ui` draws them)."""

from __future__ import annotations

import re

STEP_GROUP = "step"  # a group of this name is the step of the line's other numbers


def pattern_problem(pattern: str) -> str | None:
    """Why a `metrics:` pattern cannot be used, or None: it must compile and name at
    least one group other than `step` (the metric it finds)."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    if not set(compiled.groupindex) - {STEP_GROUP}:
        return "it names no group other than step"
    return None
