"""How a client condenses the ranks' progress bars (lines redrawn with `\\r`) and shows
a code push: what the CLI's console draws, and what any other client would. The
names are reporting/progress.py's, given here so that a client needs only the API."""

from typing import TYPE_CHECKING

# What a user picks: which bars show (`--progress`), how often a moving one is printed.
from orchestrator.reporting.progress import AUTO_MAX, PROGRESS_EVERY_S, ProgressMode

# isort: split
# What a client draws them with: a rank's stream condensed, the bars chosen and paced.
from orchestrator.reporting.progress import Condenser, Key, Pacer, choose, prefix, strip_ansi

if TYPE_CHECKING:  # a push's module is not for `orch kill` or `orch status` to import
    from orchestrator.sync.push import PushProgress

__all__ = [
    "AUTO_MAX",
    "PROGRESS_EVERY_S",
    "Condenser",
    "Key",
    "Pacer",
    "ProgressMode",
    "PushProgress",
    "choose",
    "prefix",
    "strip_ansi",
]
