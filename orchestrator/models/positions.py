"""A YAML mapping that remembers where each of its keys and values was written."""

from __future__ import annotations

from typing import Any


class PosDict(dict[str, Any]):
    """A mapping that remembers the (line, column) of each key, 1-based, and the
    source text of each value: YAML 1.1 would read `1.10` as 1.1, `on` as True and
    `010` as 8, and args and env values must reach the script as they were written."""

    def __init__(self) -> None:
        super().__init__()
        self.positions: dict[str, tuple[int, int]] = {}
        self.start: tuple[int, int] = (1, 1)
        self.source: dict[str, Any] = {}
