"""How a client condenses the ranks' progress bars (lines redrawn with `\\r`) and shows
a code push: what the CLI's console draws, and what any other client would."""

from typing import TYPE_CHECKING

from orchestrator.reporting.progress import (
    AUTO_MAX,
    PROGRESS_EVERY_S,
    Condenser,
    Key,
    Pacer,
    ProgressMode,
    choose,
    prefix,
    strip_ansi,
)

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
