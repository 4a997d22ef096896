"""`keeper`: a detached job's restarts, run on its hosts, without the laptop.

An attached `orch submit` restarts its job itself. A detached one with `restarts:` gets,
from the submit that started it:

- a **keeper** on its master host (`keeper start NODE_DIR`, a daemon): it listens on
  the master's address (the one the job's ranks reach it at) on a free port, decides
  as decisions.py says, and writes what happened to NODE_DIR/keeper.json;
- a **member** on every host the job may run on, spares included (`keeper member
  DIR`, a daemon: member.py): it connects out to the keeper, says hello, sends a heartbeat every
  second and its node's end, and does what the keeper asks: stop the node (the
  agent's `kill`, as a teardown does), find a free port, start the next attempt in
  `<host>.attempt<k>` (its snapshot built from the host's content store, its command
  rendered from the host's template by kernel/placement.py), or leave.

1. Only the job's hosts take part: the secret is new per job and travels on the SSH
   channels' stdin, never in an argv or a file. The keeper greets with a fresh nonce;
   a member answers HMAC(secret, nonce), and every message after, either way, carries
   an HMAC over the nonce, its direction and its number: nothing can be injected,
   replayed or reordered.
2. The job's env (secrets, maybe) never crosses that wire: each member renders its own
   node's command and env from its template; only placements travel.
3. A member lives while its job is kept: it leaves on `bye`; when the connection
   closes or the keeper is silent, it finds (or becomes) the next keeper, or leaves. Neither carries the
   job's tag (ORCH_JOB_ID), so that the kill of a node never takes them with it.
4. `keeper show DIR` prints {"record", "alive"}; `keeper stop DIR` has the keeper stop
   the job's nodes and dismiss its members (`orch kill`), waits for it, and prints the
   same. The master host lost takes the keeper with it, and a member takes over on
   another host (takeover.py): its own process runs the next KeeperDaemon.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import threading
import time
from typing import Any

from ..host import proc
from ..host.daemonize import daemonize
from ..kernel.fileio import read_json, write_json
from ..kernel.layout import STACKS
from ..kernel.messages import Message
from ..kernel.requests import KeeperConfig
from ..kernel.states import KEEPER_ACTING
from .decisions import STOP_WAIT_S, Keeping
from .notify import KeeperNotify
from .wire import (
    HB_S,
    Channel,
    Heartbeat,
    Hello,
    NodeEnd,
    State,
    greet,
    read_config,
    read_messages,
    ready,
)

TICK_S = 0.2
KEEPER_FILE = "keeper.json"  # in the master's node directory of attempt 0
KEEPER_LOG = "keeper.log"


# ---------------------------------------------------------------- daemons


def start_keeper(directory: str) -> int:
    """`keeper start DIR` (stdin: the config, its secret in hex): the keeper daemon,
    listening on its `bind` address; prints {"port", "pid"}."""
    os.chdir(directory)
    given = read_config(KeeperConfig, "start")
    if given is None:
        return 2
    secret = bytes.fromhex(given.secret)
    # The keeper keeps its state as its records and snapshots hold it: plain JSON.
    config = given.as_dict()
    del config["secret"]
    target = config.pop("notify", None)  # kept out of the record and snapshots: a token
    try:
        family = socket.AF_INET6 if ":" in given.bind else socket.AF_INET
        listener = socket.create_server((given.bind, 0), family=family, backlog=64)
    except OSError as exc:
        print(json.dumps({"error": f"cannot listen on {given.bind}: {exc}"}))
        return 1
    port = int(listener.getsockname()[1])

    def body(ready_fd: int) -> int:
        keeping = Keeping(config, time.monotonic())
        keeper = KeeperDaemon(keeping, secret, listener, os.path.abspath(KEEPER_FILE), target)
        keeper.save()
        ready(ready_fd, {"port": port, "pid": os.getpid()})
        keeper.run()
        return 0

    return daemonize(KEEPER_LOG, body)


class KeeperDaemon:
    """Runs Keeping: accepts members, feeds it their messages and the clock, sends
    what it answers, heartbeats, shares its snapshot with every member whenever that
    changed (for one of them to take over, takeover.py), and writes its record
    (`path`) whenever that changed, and tells the job's events to its `notify:` target
    (notify.py)."""

    def __init__(
        self,
        keeping: Keeping,
        secret: bytes,
        listener: socket.socket,
        path: str,
        notify: str | None = None,
    ) -> None:
        self.keeping, self.secret, self.listener, self.path = keeping, secret, listener, path
        self.notify = KeeperNotify(notify, keeping)
        self.port = int(listener.getsockname()[1])
        self.events: queue.Queue[tuple[Channel, Message | None]] = queue.Queue()
        self.channels: dict[str, Channel] = {}
        self.shared: dict[str, str] = {}  # the snapshot each member has, as sent
        self.stopping = False
        self.saved: dict[str, Any] | None = None

    def save(self) -> None:
        record = self.keeping.record()
        if record != self.saved:
            pid = os.getpid()
            write_json(
                self.path,
                {**record, "pid": pid, "start_time": proc.start_time(pid), "port": self.port},
            )
            self.saved = record

    def share(self) -> list[tuple[str, Message]]:
        if self.keeping.done:
            return []
        snapshot = self.keeping.snapshot()
        text = json.dumps(snapshot, sort_keys=True)
        stale = [h for h in self.channels if self.shared.get(h) != text]
        for host in stale:
            self.shared[host] = text
        return [(h, State(snapshot=snapshot)) for h in stale]

    def accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(sock,), daemon=True).start()

    def serve(self, sock: socket.socket) -> None:
        channel = greet(sock, self.secret)
        if channel is not None:
            read_messages(channel, lambda c, m: self.events.put((c, m)))

    def run(self, signals: bool = True) -> None:
        """Keep the job to its end. `signals`: SIGTERM stops the job (`keeper stop`);
        a member that took over (not the main thread) sets `stopping` itself."""
        if signals:
            signal.signal(signal.SIGTERM, self._on_term)
        threading.Thread(target=self.accept, daemon=True).start()
        beat = 0.0
        while not self.keeping.done:
            now = time.monotonic()
            sends = self.keeping.stop(now) if self.stopping else []
            try:
                channel, heard = self.events.get(timeout=TICK_S)
                sends += self.handle(channel, heard, time.monotonic())
            except queue.Empty:
                pass
            sends += self.keeping.tick(time.monotonic())
            if now - beat >= HB_S:
                sends += [(h, Heartbeat()) for h in self.channels]
                beat = now
            sends += self.share()
            for host, decided in sends:
                self.send(host, decided)
            self.keep_dumps()
            self.save()
            self.notify.observe(self.keeping)
        self.save()
        self.notify.observe(self.keeping)
        time.sleep(0.2)  # the members read their bye
        for channel in list(self.channels.values()):
            channel.close()
        self.listener.close()
        self.notify.finish()  # after the job's end is written: a slow hook holds nothing

    def keep_dumps(self) -> None:
        """Write the stacks the stall watchdog took: stacks/NAME.json, beside the
        keeper's record (`keeper show` hands them to the controller)."""
        while self.keeping.dumps:
            name, data = self.keeping.dumps.pop(0)
            folder = os.path.join(os.path.dirname(self.path), STACKS)
            try:
                os.makedirs(folder, mode=0o700, exist_ok=True)
                write_json(os.path.join(folder, f"{name}.json"), data)
            except OSError as exc:
                print(f"could not keep the stacks {name}: {exc}", flush=True)

    def _on_term(self, *_: object) -> None:
        self.stopping = True

    def handle(
        self, channel: Channel, message: Message | None, now: float
    ) -> list[tuple[str, Message]]:
        if message is None:  # the channel is gone
            if channel.host is not None and self.channels.get(channel.host) is channel:
                del self.channels[channel.host]
                self.keeping.gone(channel.host)
            return []
        if isinstance(message, Hello) and channel.host is None:
            channel.host = message.host
            old = self.channels.get(channel.host)
            if old is not None:
                old.close()
            self.channels[channel.host] = channel
            self.shared.pop(channel.host, None)
        if channel.host is None:
            return []
        if isinstance(message, NodeEnd):
            self.notify.heard_end(channel.host, message.attempt, message.rank, message.tail)
        return self.keeping.hear(channel.host, message, now)

    def send(self, host: str, message: Message) -> None:
        """Send what Keeping decided."""
        channel = self.channels.get(host)
        if channel is None:
            return
        try:
            channel.tell(message)
        except OSError:
            channel.close()


# ---------------------------------------------------------------- show, stop


def show(directory: str) -> int:
    """`keeper show DIR`: the keeper's record, and whether it runs."""
    print(json.dumps(_look(directory)))
    return 0


LEAVE_WAIT_S = 2.0  # `keeper stop`: the keeper's leaving, once the job's end is written


def stop(directory: str) -> int:
    """`keeper stop DIR`: the keeper stops the job's nodes and leaves; waits until the
    job's end is written (the keeper may then still be telling it, notify.py)."""
    found = _look(directory)
    if found["alive"]:
        proc.signal_pid(int(found["record"]["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S + 10
        # Until the job's end is written: the keeper may then still tell it (notify.py).
        while _acting(_look(directory)) and time.monotonic() < deadline:
            time.sleep(0.1)
        # Then it leaves at once, but for a notify: hook it still runs: nothing of the
        # job is left when the kill returns, and a slow hook holds it up LEAVE_WAIT_S.
        leave_by = min(deadline, time.monotonic() + LEAVE_WAIT_S)
        while _look(directory)["alive"] and time.monotonic() < leave_by:
            time.sleep(0.05)
        found = _look(directory)
    print(json.dumps(found))
    return 0


def _acting(found: dict[str, Any]) -> bool:
    """The keeper runs and its job has not ended."""
    return bool(found["alive"]) and (found["record"] or {}).get("state") in KEEPER_ACTING


def _look(directory: str) -> dict[str, Any]:
    record = read_json(os.path.join(directory, KEEPER_FILE))
    alive = False
    if record is not None and isinstance(record.get("pid"), int):
        pid = int(record["pid"])
        alive = proc.alive(pid) and proc.start_time(pid) == record.get("start_time")
    dumps = {}
    for stall in (record or {}).get("stalls") or []:
        name = str(stall.get("dump"))
        if "/" not in name:
            found = read_json(os.path.join(directory, STACKS, f"{name}.json"))
            if found is not None:
                dumps[name] = found
    return {"record": record, "alive": alive, "dumps": dumps}
