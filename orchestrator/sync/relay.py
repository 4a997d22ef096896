"""Relay push, the controller's side: the seed host's relay (agent/relay.py) for the
length of one push, and which hosts fetch from it (push.py for the whole push).

With a `Relay` (the job's master, at the address its ranks reach it), the laptop's
link carries each object once: the controller pushes to that seed host, while it
serves what it gets to the others, which fetch in one round trip that carries no
content. What a host could not fetch (a firewall, a host outside the cluster
network) it reports missing, and that goes to it directly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.agent.kernel import layout
from orchestrator.agent.kernel.requests import RelayConfig, RelayOrder
from orchestrator.models.errors import HostError
from orchestrator.nodes import agent
from orchestrator.nodes.group import HostGroup
from orchestrator.sync.manifest import Tree
from orchestrator.transport import RemoteProcess

log = logging.getLogger(__name__)

# A relay costs a server and a connection per host: worth it once the other hosts
# together lack this many bytes (an edited file goes directly, as before).
RELAY_MIN_BYTES = 4 << 20
RELAY_END_S = 5.0  # how long the last host's fetch may take to end, once its push did


@dataclass(frozen=True)
class Relay:
    """The host the others fetch from, and its address as they reach it."""

    seed: str
    addr: str


def relayed_hosts(
    tree: Tree, plans: Mapping[str, Any], relay: Relay | None
) -> dict[str, list[str]]:
    """The hosts that fetch from the relay, with the objects they may lack: every one
    but the seed, when it is among the hosts and the others lack enough."""
    if relay is None or relay.seed not in plans or len(plans) < 2:
        return {}
    lacking = {
        name: list(tree.objects) if plan.missing is None else list(plan.missing)
        for name, plan in plans.items()
        if name != relay.seed
    }
    size = sum(tree.objects[k].size for keys in lacking.values() for k in keys)
    return {name: keys for name, keys in lacking.items() if keys} if size >= RELAY_MIN_BYTES else {}


class RelayServer:
    """The relay on the seed host (agent/relay.py), for the length of one push: it
    serves the `expect` hosts that fetch from it, then ends."""

    def __init__(
        self,
        relay: Relay,
        process: RemoteProcess,
        port: int,
        secret: str,
        notice: Callable[[str], None],
    ) -> None:
        self.relay, self.process, self.port, self.secret = relay, process, port, secret
        self.notice = notice
        self.all_came = True  # every host that was to fetch reached the relay

    @classmethod
    def start(cls, group: HostGroup, relay: Relay, expect: int) -> RelayServer | None:
        """Start the relay, or None (with a notice) when it cannot start: the push then
        goes to every host directly."""
        host = next(h for h in group.hosts if h.name == relay.seed)
        secret = secrets.token_hex(32)
        config = RelayConfig(store=layout.store_dir(host.workdir), secret=secret, expect=expect)
        try:
            command, archive = agent.invocation(host, "relay")
            process = group.transports[host.name].stream(
                command, idle_timeout=RELAY_END_S, stdin=archive + config.to_json().encode()
            )
            port = int(json.loads(next(process.lines(), ""))["port"])
        except (HostError, OSError, ValueError, KeyError, TypeError) as exc:
            group.options.notice(
                f"cannot start the relay on {host.name} ({exc}); pushing to every host directly"
            )
            return None
        log.debug("[host=%s] relay on port %d for %d hosts", host.name, port, expect)
        return cls(relay, process, port, secret, group.options.notice)

    def request(self, keys: list[str]) -> RelayOrder:
        """The R frame's content for a host that lacks (at most) `keys`."""
        return RelayOrder(addr=self.relay.addr, port=self.port, secret=self.secret, keys=keys)

    def missed(self, message: str) -> None:
        """A host could not fetch from the relay: say so; the relay will not see it."""
        self.all_came = False
        self.notice(message)

    def close(self) -> None:
        """Once every host came, the relay ends by itself: wait for that (so that
        nothing of the push is left running), else stop it now."""
        if self.all_came:
            with contextlib.suppress(TimeoutError, OSError):
                for _ in self.process.lines():
                    pass
        self.process.close()
