"""Numbers the ranks print, found in their lines: the curves of `orch ui`. Pure: no
I/O, no clock.

A training script already prints what a person watches (`epoch 1 loss 0.41`,
`loss=0.41`, `loss: 0.41`, the Hugging Face Trainer's `{'loss': 0.41, ...}`); the page
plots those numbers with no change to the script. What is found by default:

1. A dict line, as the Trainer logs it: every `'name': number` pair of a line that
   starts with `{` (`{'loss': 2.1, 'learning_rate': 5e-05, 'epoch': 0.5}`), a number
   wrapped as numpy and torch print theirs too (`np.float64(0.53)`, `tensor(0.5)`).
2. `name=number` and `name: number` anywhere in a line, for any name that starts with
   a letter (`lr=3e-4`, `val_acc: 0.91`).
3. `name number`, for the names a training loop prints that way: `loss` and every name
   ending in it (`val_loss 0.3`), and `acc`, `accuracy`, `lr`, `ppl`, `perplexity`,
   `epoch`, `step`, `iter`, `iteration`.

A line's `step`, `global_step`, `iter` or `iteration` is the step of the other numbers
on it, not a curve of its own. The job file's `metrics:` adds regular expressions
whose named groups are metrics (a group named `step` gives the step). Names are
lowercased, so that `Loss: 1.2` and `loss=1.1` are one curve.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.models.metrics import STEP_GROUP

# Only a line's start is searched: a rank that prints a megabyte on one line (a
# tensor, a base64 blob) costs the page no more than a short one.
SCAN_CHARS = 4096
STEP_NAMES = frozenset({"step", "global_step", "iter", "iteration"})

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_END = r"(?![\w]|\.\d)"  # the number ends here: not `1.2.3`, not `12abc`
# A value may come wrapped, as numpy 2 and torch print theirs: np.float64(0.53), tensor(0.5)
_DICT_PAIR = re.compile(
    rf"""['"]([A-Za-z_][\w./-]{{0,63}})['"]\s*:\s*(?:[A-Za-z_][\w.]{{0,31}}\()?({_NUMBER}){_END}"""
)
_SAID = re.compile(rf"(?<![\w.-])([A-Za-z][\w./-]{{0,63}}?)\s*[=:]\s*({_NUMBER}){_END}")
_SPOKEN = re.compile(
    rf"(?<![\w.-])(\w*loss|acc|accuracy|lr|ppl|perplexity|epoch|step|iter|iteration)"
    rf"\s+({_NUMBER}){_END}",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Reading:
    """One number found in a line: its metric's name, value, and the step the line
    names (None: it names none)."""

    name: str
    value: float
    step: float | None = None


class MetricParser:
    """Finds the numbers of a line (see the module's docstring).

    Args:
        patterns: the job's own `metrics:` regular expressions (checked when the job
            file is loaded: `pattern_problem`).
        defaults: whether the default forms are found too.
    """

    def __init__(self, patterns: Sequence[str] = (), defaults: bool = True) -> None:
        self._own = [re.compile(p) for p in patterns]
        self._defaults = defaults

    def parse(self, line: str) -> list[Reading]:
        """The numbers of one line of a rank's output (no newline), in the order found;
        one reading per name (the first)."""
        text = line[:SCAN_CHARS]
        found: dict[str, float] = {}
        step: float | None = None
        for pattern in self._own:
            for match in pattern.finditer(text):
                for name, raw in match.groupdict().items():
                    value = _number(raw)
                    if value is None:
                        continue
                    if name == STEP_GROUP:
                        step = value
                    else:
                        found.setdefault(name.lower(), value)
        if self._defaults and _has_digit(text):
            pairs = self._default_pairs(text)
            for name, raw in pairs:
                value = _number(raw)
                if value is None:
                    continue
                if name in STEP_NAMES:
                    step = value if step is None else step
                else:
                    found.setdefault(name, value)
        return [Reading(name, value, step) for name, value in found.items()]

    @staticmethod
    def _default_pairs(text: str) -> list[tuple[str, str]]:
        stripped = text.lstrip()
        if stripped.startswith("{"):
            pairs = _DICT_PAIR.findall(stripped)
            if pairs:
                return [(n.lower(), v) for n, v in pairs]
        matches = [*_SAID.finditer(text), *_SPOKEN.finditer(text)]
        matches.sort(key=lambda m: m.start())
        return [(m.group(1).lower(), m.group(2)) for m in matches]


_DIGIT = re.compile(r"\d")


def _has_digit(text: str) -> bool:
    return _DIGIT.search(text) is not None


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
