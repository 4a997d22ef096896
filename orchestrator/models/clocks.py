"""How a host's clock stands to this machine's, as a probe measured it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HostClock:
    """The host's clock minus this machine's lies in [low, high].

    The probe stamps the host's time while it runs, so between the moment this machine
    sent it and the moment the answer came: no assumption about the network's
    symmetry, and the window is as wide as the probe took (a few hundred ms).
    """

    low: float
    high: float

    @staticmethod
    def measured(host_time: float, sent: float, received: float) -> HostClock:
        """From the host's stamp and this machine's clock around the probe."""
        return HostClock(host_time - received, host_time - sent)

    def here(self, host_time: float) -> tuple[float, float]:
        """A moment on the host's clock, on this machine's: the earliest and the latest
        it can have been."""
        return host_time - self.high, host_time - self.low

    def to_json(self) -> list[float]:
        return [self.low, self.high]


def clocks_from_json(data: Any) -> dict[str, HostClock]:
    """A job record's `clocks` (host: [low, high]); anything malformed is left out
    (that host's times are then not compared)."""
    clocks: dict[str, HostClock] = {}
    if not isinstance(data, Mapping):
        return clocks
    for name, window in data.items():
        if (
            isinstance(window, list)
            and len(window) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in window)
            and window[0] <= window[1]
        ):
            clocks[str(name)] = HostClock(float(window[0]), float(window[1]))
    return clocks
