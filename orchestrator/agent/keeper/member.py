"""`keeper member DIR`: one host's member of a detached job's keeper (daemon.py says
what the keeper and its members do, and how they talk): it connects out to the keeper,
says hello, sends a heartbeat every second and its node's end, and does what the
keeper asks: stop the node (the agent's `kill`, as a teardown does), find a free port,
start the host's node of the next attempt, answer for its node in line (the agent's
`lease`, kernel/line.py), or leave. It keeps the keeper's latest snapshot and, when the
keeper is lost, finds or becomes the next one (takeover.py)."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from ..host import proc
from ..host.daemonize import daemonize
from ..kernel.fileio import write_json
from ..kernel.layout import AGENT, HEARTBEAT_S, MEMBER_FILE, RUN_SCRIPT
from ..kernel.line import REPLY_WAIT_S
from ..kernel.messages import Message, last_json
from ..kernel.placement import render
from ..kernel.requests import (
    LeaseRequest,
    MemberConfig,
    SnapshotRequest,
    StackRequest,
    StartRequest,
)
from ..node import state
from .decisions import DONE, START_WAIT_S, STOP_WAIT_S
from .notify import last_lines
from .takeover import Successor, standby
from .wire import (
    HB_S,
    Bye,
    Channel,
    Heartbeat,
    Hello,
    LeaseAnswered,
    LeaseAsked,
    NodeEnd,
    NodeStarted,
    PortFound,
    PortWanted,
    StackTaken,
    StackWanted,
    Start,
    State,
    Stop,
    Stopped,
    join,
    read_config,
    read_messages,
    ready,
)

MEMBER_LOG = "member.log"
PATIENCE_S = 30.0  # a member's wait for a word from its keeper, at least
KILL_GRACE_S = 3.0  # the node's ranks get this long after SIGTERM when the keeper stops it
IDLE = Heartbeat()  # no word from the keeper this while (never sent)


def start_member(directory: str) -> int:
    """`keeper member DIR` (stdin: the config, its secret in hex): the member daemon of
    this host, once connected to the keeper; prints {"pid"}."""
    os.chdir(directory)
    config = read_config(MemberConfig, "member")
    if config is None:
        return 2
    secret = bytes.fromhex(config.secret)
    host = config.template.host
    successor = Successor(host, secret, standby(config.template.addr or ""), ".", config.notify)

    def body(ready_fd: int) -> int:
        successor.home = os.getcwd()
        try:
            channel = join(config.addr, config.port, secret)
            channel.tell(Hello(host=host, port=successor.port))
        except (OSError, EOFError, ValueError) as exc:
            where = f"{config.addr}:{config.port}"
            ready(ready_fd, {"error": f"cannot reach the job's keeper at {where}: {exc}"})
            return 1
        ready(ready_fd, {"pid": os.getpid()})
        try:
            Member(config, channel, successor).run()
        finally:
            successor.wait()
        return 0

    return daemonize(MEMBER_LOG, body)


class Member:
    """One host's member (point 3): reports its node, does what the keeper asks."""

    def __init__(
        self, config: MemberConfig, channel: Channel, successor: Successor | None = None
    ) -> None:
        self.config, self.channel, self.successor = config, channel, successor
        self.template = config.template
        given = config.node_dir
        self.node_dir = os.path.expanduser(given) if given else None
        self.attempt = config.attempt
        self.reported = False
        self.queued = False  # the node of the last start waits in line
        self.inbox: queue.Queue[tuple[Channel, Message | None]] = queue.Queue()
        self.lost_after = config.lost_after
        self.patience = max(PATIENCE_S, 3 * self.lost_after)
        self.heard = time.monotonic()  # the keeper's last word, any
        self.snapshot: dict[str, Any] | None = None  # the keeper's latest (takeover.py)
        self.epoch = 0
        # Where it lives: its record there keeps gc (and a takeover) off the snapshot.
        self.lives = os.path.join(os.getcwd(), MEMBER_FILE)

    def run(self) -> None:
        self.attach(self.channel)
        pid = os.getpid()
        write_json(
            self.lives, {"pid": pid, "start_time": proc.start_time(pid), "host": proc.host_id()}
        )
        try:
            self.serve()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.lives)

    def attach(self, channel: Channel) -> None:
        """Listen to (and beat for) the keeper at the other end of `channel`."""
        self.channel, self.heard = channel, time.monotonic()

        def put(source: Channel, message: Message | None) -> None:
            if source is self.channel:
                self.heard = time.monotonic()
            self.inbox.put((source, message))

        threading.Thread(target=read_messages, args=(channel, put), daemon=True).start()
        threading.Thread(target=self.beat, args=(channel,), daemon=True).start()

    def serve(self) -> None:
        """Do what the keeper asks until it says bye, or until it goes or is silent
        too long and no other keeps the job (takeover.py)."""
        touched = time.monotonic()
        while True:
            if time.monotonic() - touched > HEARTBEAT_S:
                with contextlib.suppress(OSError):
                    os.utime(self.lives)
                touched = time.monotonic()
            try:
                source, message = self.inbox.get(timeout=0.5)
            except queue.Empty:
                source, message = self.channel, IDLE
            if source is not self.channel:
                continue  # a keeper this member left
            if isinstance(message, Bye):
                break
            if message is None or time.monotonic() - self.heard > self.silence():
                if self.take_over():
                    continue
                break
            try:
                self.handle(message)
                self.report_end()
            except OSError:
                self.channel.close()  # the keeper's channel is gone: the next turn sees it
        self.channel.close()

    def silence(self) -> float:
        """How long the keeper may be silent: `lost_after` where another could take
        over, as for any lost host; else PATIENCE_S, at least."""
        if self.snapshot is not None and self.successor is not None:
            return max(self.lost_after, 3 * HB_S)
        return self.patience

    def take_over(self) -> bool:
        """The keeper is gone: find or become the next one. False: none, leave."""
        snapshot, self.snapshot = self.snapshot, None
        self.channel.close()
        if snapshot is None or self.successor is None or snapshot["phase"] == DONE:
            return False
        print(f"the keeper on {snapshot['keeper']} is gone", flush=True)
        channel = self.successor.find(snapshot, self.lost_after)
        if channel is None:
            return False
        try:
            channel.tell(Hello(host=self.successor.host, port=self.successor.port))
        except OSError:
            return False
        self.reported = False  # the new keeper hears how the node ended, once more
        self.attach(channel)
        return True

    def beat(self, channel: Channel) -> None:
        while not channel.closed:
            node_dir = self.node_dir
            idle = state.idle(node_dir) if node_dir and not self.reported else None
            try:
                channel.tell(Heartbeat(idle=idle))
            except OSError:
                return
            time.sleep(HB_S)

    def handle(self, message: Message) -> None:
        if isinstance(message, State):
            epoch = int(message.snapshot.get("epoch") or 0)
            if epoch >= self.epoch:
                self.snapshot, self.epoch = message.snapshot, epoch
            else:  # a keeper older than one seen: fenced off
                print(f"left a keeper of epoch {epoch}", flush=True)
                self.channel.close()
        elif isinstance(message, Stop):
            if message.attempt == self.attempt and self.node_dir:
                self.kill()
            self.channel.tell(Stopped(attempt=message.attempt))
        elif isinstance(message, PortWanted):
            with socket.socket() as sock:
                sock.bind(("", 0))
                self.channel.tell(PortFound(port=sock.getsockname()[1]))
        elif isinstance(message, Start):
            place = message.place
            self.queued = False
            error = self.start(place)
            self.channel.tell(
                NodeStarted(
                    attempt=place["attempt"], ok=error is None, error=error, queued=self.queued
                )
            )
        elif isinstance(message, LeaseAsked):
            reply = self.lease(message.verb)
            self.channel.tell(LeaseAnswered(verb=message.verb, reply=reply))
        elif isinstance(message, StackWanted) and message.attempt == self.attempt and self.node_dir:
            taken = self.stacks(message)
            self.channel.tell(StackTaken(attempt=message.attempt, reply=taken))

    def report_end(self) -> None:
        if self.node_dir is None or self.reported:
            return
        os.chdir(self.node_dir)
        ended = state.exit_record()
        if ended is not None:
            rank: int | None = None
            tail: list[str] = []
            failed = ended.returncode != 0 and not ended.killed
            if failed and self.config.notify:  # the message shows the failing rank's end
                rank, tail = last_lines(".")
            self.channel.tell(
                NodeEnd(attempt=self.attempt, rank=rank, tail=tail, **ended.as_dict())
            )
            self.reported = True

    def agent(self, node_dir: str, *args: str) -> list[str]:
        return [sys.executable, "-I", "-S", os.path.join(node_dir, AGENT, RUN_SCRIPT), *args]

    def kill(self) -> None:
        """Stop the node as a teardown does: the agent's kill, in its directory."""
        assert self.node_dir is not None
        job_id = self.template.job_id
        command = self.agent(self.node_dir, "kill", self.node_dir, str(KILL_GRACE_S), job_id)
        try:
            subprocess.run(command, capture_output=True, timeout=STOP_WAIT_S)
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"kill in {self.node_dir} failed: {exc}", flush=True)

    def lease(self, verb: str) -> dict[str, Any]:
        """The agent's `lease VERB` for this host's node: where it stands in line."""
        if self.node_dir is None:
            return {"state": "gone", "error": "no node of the job on this host"}
        command = self.agent(self.node_dir, "lease", verb, self.node_dir)
        try:
            done = subprocess.run(command, capture_output=True, timeout=REPLY_WAIT_S - 10)
        except (OSError, subprocess.SubprocessError) as exc:
            return {"state": "gone", "error": f"lease {verb} failed: {exc}"}
        reply = last_json(done.stdout.decode("utf-8", "replace"))
        if reply is None:
            return {"state": "gone", "error": done.stderr.decode("utf-8", "replace")[-500:]}
        return reply

    def stacks(self, wanted: StackWanted) -> dict[str, Any]:
        """The agent's `stack` for this host's node (the stall watchdog)."""
        assert self.node_dir is not None
        request = StackRequest(
            job_id=self.template.job_id,
            tools_dir=wanted.tools_dir,
            pyspy=wanted.pyspy,
            taken=wanted.taken,
        )
        command = self.agent(self.node_dir, "stack", self.node_dir)
        try:
            done = subprocess.run(
                command, input=request.to_json().encode(), capture_output=True, timeout=60
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return {"ranks": [], "error": f"stack failed: {exc}"}
        reply = last_json(done.stdout.decode("utf-8", "replace"))
        return reply or {"ranks": [], "error": done.stderr.decode("utf-8", "replace")[-500:]}

    def start(self, place: dict[str, Any]) -> str | None:
        """Start this host's node of a new attempt; None, or what went wrong."""
        from ..store.content import ContentStore
        from ..store.sync import make_snapshot

        argv, env, job_dir = render(self.template, place)
        job_dir = os.path.expanduser(job_dir)
        store = ContentStore(os.path.expanduser(self.config.store))
        try:
            built = make_snapshot(
                store, SnapshotRequest(digest=self.config.digest, job_dir=job_dir)
            )
        except (OSError, ValueError) as exc:
            return f"cannot build the job's code in {job_dir}: {exc}"
        if not built.get("snapshot"):
            return f"the job's code is not whole in this host's store ({store.root})"
        self.node_dir, self.attempt, self.reported = job_dir, int(place["attempt"]), False
        spec = StartRequest(argv=argv, env=env)
        if self.template.warm:
            spec.warm = self.template.warm
        units = self.config.lease
        if units:  # a shared host: the node waits its turn (the keeper's line says go)
            alone = len(place["hosts"]) == 1
            ticket = place.get("ticket") or [time.time(), self.template.job_id]
            spec.lease = LeaseRequest(
                kind=units.kind,
                pool=units.pool,
                count=units.count,
                priority=units.priority,
                job=str(ticket[1]),
                ticket=ticket,
                wait=True,
                self_start=alone,
            )
        try:
            done = subprocess.run(
                self.agent(job_dir, "start", "."),
                cwd=job_dir,
                input=spec.to_json().encode(),
                capture_output=True,
                timeout=START_WAIT_S,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return f"cannot start the node: {exc}"
        reply = last_json(done.stdout.decode("utf-8", "replace")) or {}
        if "queued" in reply:
            self.queued = True
            return None
        if "pid" not in reply:
            return str(reply.get("error") or done.stderr.decode("utf-8", "replace")[-500:])
        return None
