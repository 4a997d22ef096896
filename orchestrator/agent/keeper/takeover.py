"""A member takes over its job's keeper (decisions.py says what the new keeper does).

Every member listens, from its start, on a standby port at its host's address and
says so in its hello; the keeper shares its snapshot (decisions.Keeping.snapshot)
with every member whenever it changed. When the keeper's channel closes without a
`bye`, or the keeper is silent for `lost_after`, each member goes through the
snapshot's successors in order (decisions.successors): the first is itself, and it
becomes the keeper, one epoch later, in its own process, on its standby listener,
writing keeper.json in its own directory; or it is another member, and it waits for
that one to greet it, until the new keeper's gathering would end, before it tries the
next. A member never follows a keeper whose epoch is older than one it has seen.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from typing import Any

from ..kernel.notify import FINISH_WAIT_S
from .daemon import KEEPER_FILE, KeeperDaemon
from .decisions import GATHER_S, Keeping, successors
from .wire import IO_TIMEOUT_S, Channel, join

RETRY_S = 0.5


def standby(addr: str) -> socket.socket | None:
    """A listener at `addr` for this member to keep the job on, should it have to;
    None where it cannot listen there (it then never keeps)."""
    if not addr:
        return None
    try:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        return socket.create_server((addr, 0), family=family, backlog=64)
    except OSError:
        return None


class Successor:
    """One member's part in a takeover.

    Args:
        host: this member's host.
        secret: the job's secret.
        listener: this member's standby listener, or None.
        home: the member's directory, where a keeper it becomes writes its record.
        notify: the job's `notify:` target (its member's config), for a keeper it becomes.
    """

    def __init__(
        self,
        host: str,
        secret: bytes,
        listener: socket.socket | None,
        home: str,
        notify: str | None = None,
    ) -> None:
        self.host, self.secret, self.listener, self.home = host, secret, listener, home
        self.notify = notify
        self.port = int(listener.getsockname()[1]) if listener is not None else None
        self.addr = str(listener.getsockname()[0]) if listener is not None else ""
        self.keeper: KeeperDaemon | None = None
        self.thread: threading.Thread | None = None

    def find(self, snapshot: dict[str, Any], lost_after: float) -> Channel | None:
        """The channel to the job's new keeper, this member's own or another's; None
        when no successor answered in time."""
        addrs = {str(c["host"]): str(c["addr"]) for c in snapshot["candidates"]}
        for host in successors(snapshot):
            if host == self.host:
                return self._become(snapshot) if self.listener is not None else None
            port = int(snapshot["roster"][host])
            deadline = time.monotonic() + lost_after + GATHER_S
            while time.monotonic() < deadline:
                try:
                    return join(addrs[host], port, self.secret, deadline - time.monotonic())
                except (OSError, EOFError, ValueError):
                    time.sleep(RETRY_S)
        return None

    def _become(self, snapshot: dict[str, Any]) -> Channel | None:
        assert self.listener is not None
        keeping = Keeping.take_over(snapshot, self.host, time.monotonic())
        path = os.path.join(self.home, KEEPER_FILE)
        keeper = KeeperDaemon(keeping, self.secret, self.listener, path, self.notify)
        keeper.save()
        print(f"keeping the job from now on, epoch {keeping.epoch}", flush=True)
        # `keeper stop` signals this process: the keeper stops the job, as its first did.
        signal.signal(signal.SIGTERM, lambda *_: setattr(keeper, "stopping", True))
        self.thread = threading.Thread(target=keeper.run, kwargs={"signals": False})
        self.thread.daemon = True
        self.thread.start()
        self.keeper, self.listener = keeper, None
        try:
            return join(self.addr, int(keeper.port), self.secret, IO_TIMEOUT_S)
        except (OSError, EOFError, ValueError):
            return None

    def wait(self) -> None:
        """Let a keeper this member became write its last record."""
        if self.thread is not None:  # and its last word (notify.py)
            self.thread.join(timeout=IO_TIMEOUT_S + FINISH_WAIT_S)
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.close()
