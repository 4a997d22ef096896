"""A keeper's decisions (agent/keeper/decisions.py) driven as its daemon drives them,
in the wire's JSON: each member message parsed into its class as `Channel.hear`
parses it, each decision sent back as the data `Channel.tell` sends. The unit tests
then read as the messages on the wire."""

from __future__ import annotations

from typing import Any

from orchestrator.agent.keeper import wire
from orchestrator.agent.keeper.decisions import Keeping
from orchestrator.agent.kernel.messages import Message, parse_message


def sent(sends: list[tuple[str, Message]]) -> list[tuple[str, dict[str, Any]]]:
    """What the keeper decided, as the data its channels send."""
    for _, message in sends:
        assert type(message) in wire.TO_MEMBER.values(), message  # a message a member takes
    return [(host, wire.record(message)) for host, message in sends]


class Driven:
    """A Keeping spoken to in the wire's JSON; its state and record read through."""

    def __init__(self, keeping: Keeping) -> None:
        self.keeping = keeping

    def hear(self, host: str, data: dict[str, Any], now: float) -> list[tuple[str, Any]]:
        message = parse_message(wire.FROM_MEMBER[data["k"]], data, host)
        return sent(self.keeping.hear(host, message, now))

    def tick(self, now: float) -> list[tuple[str, Any]]:
        return sent(self.keeping.tick(now))

    def stop(self, now: float) -> list[tuple[str, Any]]:
        return sent(self.keeping.stop(now))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.keeping, name)
