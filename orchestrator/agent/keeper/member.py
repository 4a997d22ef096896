"""`keeper member DIR`: one host's member of a detached job's keeper (daemon.py says
what the keeper and its members do, and how they talk): it connects out to the keeper,
says hello, sends a heartbeat every second and its node's end, and does what the
keeper asks: stop the node (the agent's `kill`, as a teardown does), find a free port,
start the host's node of the next attempt, answer for its node in line (the agent's
`lease`, kernel/line.py), or leave."""

from __future__ import annotations

import contextlib
import json
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
from ..kernel.line import REPLY_WAIT_S
from ..kernel.placement import render
from ..kernel.protocol import (
    AGENT,
    HEARTBEAT_S,
    MEMBER_FILE,
    RUN_SCRIPT,
    Message,
    last_json,
    write_json,
)
from ..node import state
from .decisions import START_WAIT_S, STOP_WAIT_S
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
    Start,
    Stop,
    Stopped,
    join,
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
    config = json.loads(sys.stdin.read())
    secret = bytes.fromhex(str(config.pop("secret")))

    def body(ready_fd: int) -> int:
        try:
            channel = join(str(config["addr"]), int(config["port"]), secret)
            channel.tell(Hello(host=config["template"]["host"]))
        except (OSError, EOFError, ValueError) as exc:
            where = f"{config['addr']}:{config['port']}"
            ready(ready_fd, {"error": f"cannot reach the job's keeper at {where}: {exc}"})
            return 1
        ready(ready_fd, {"pid": os.getpid()})
        Member(config, channel).run()
        return 0

    return daemonize(MEMBER_LOG, body)


class Member:
    """One host's member (point 3): reports its node, does what the keeper asks."""

    def __init__(self, config: dict[str, Any], channel: Channel) -> None:
        self.config, self.channel = config, channel
        self.template: dict[str, Any] = config["template"]
        given = config.get("node_dir")
        self.node_dir = os.path.expanduser(given) if given else None
        self.attempt = int(config.get("attempt") or 0)
        self.reported = False
        self.queued = False  # the node of the last start waits in line
        self.inbox: queue.Queue[Message | None] = queue.Queue()
        self.patience = max(PATIENCE_S, 3 * float(config.get("lost_after") or 0))
        # Where it lives: its record there keeps gc (and a takeover) off the snapshot.
        self.lives = os.path.join(os.getcwd(), MEMBER_FILE)

    def run(self) -> None:
        threading.Thread(
            target=read_messages, args=(self.channel, lambda _c, m: self.inbox.put(m)), daemon=True
        ).start()
        threading.Thread(target=self.beat, daemon=True).start()
        pid = os.getpid()
        write_json(
            self.lives, {"pid": pid, "start_time": proc.start_time(pid), "host": proc.host_id()}
        )
        try:
            self.serve()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.lives)

    def serve(self) -> None:
        """Do what the keeper asks until it says bye, goes, or is silent too long."""
        heard = touched = time.monotonic()
        while time.monotonic() - heard < self.patience:
            if time.monotonic() - touched > HEARTBEAT_S:
                with contextlib.suppress(OSError):
                    os.utime(self.lives)
                touched = time.monotonic()
            try:
                message = self.inbox.get(timeout=0.5)
            except queue.Empty:
                message = IDLE
            if message is None or isinstance(message, Bye):
                break
            if message is not IDLE:
                heard = time.monotonic()
            try:
                self.handle(message)
                self.report_end()
            except OSError:
                break
        self.channel.close()

    def beat(self) -> None:
        while not self.channel.closed:
            try:
                self.channel.tell(Heartbeat())
            except OSError:
                return
            time.sleep(HB_S)

    def handle(self, message: Message) -> None:
        if isinstance(message, Stop):
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

    def report_end(self) -> None:
        if self.node_dir is None or self.reported:
            return
        os.chdir(self.node_dir)
        ended = state.exit_record()
        if ended is not None:
            self.channel.tell(NodeEnd(attempt=self.attempt, **ended.as_dict()))
            self.reported = True

    def agent(self, node_dir: str, *args: str) -> list[str]:
        return [sys.executable, "-I", "-S", os.path.join(node_dir, AGENT, RUN_SCRIPT), *args]

    def kill(self) -> None:
        """Stop the node as a teardown does: the agent's kill, in its directory."""
        assert self.node_dir is not None
        job_id = str(self.template["job_id"])
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

    def start(self, place: dict[str, Any]) -> str | None:
        """Start this host's node of a new attempt; None, or what went wrong."""
        from ..store.content import ContentStore
        from ..store.sync import make_snapshot

        argv, env, job_dir = render(self.template, place)
        job_dir = os.path.expanduser(job_dir)
        store = ContentStore(os.path.expanduser(str(self.config["store"])))
        try:
            built = make_snapshot(store, {"digest": self.config["digest"], "job_dir": job_dir})
        except (OSError, ValueError) as exc:
            return f"cannot build the job's code in {job_dir}: {exc}"
        if not built.get("snapshot"):
            return f"the job's code is not whole in this host's store ({store.root})"
        self.node_dir, self.attempt, self.reported = job_dir, int(place["attempt"]), False
        spec: dict[str, Any] = {"argv": argv, "env": env}
        units = self.config.get("lease")
        if units:  # a shared host: the node waits its turn (the keeper's line says go)
            alone = len(place["hosts"]) == 1
            ticket = place.get("ticket") or [time.time(), self.template["job_id"]]
            lease = {"job": ticket[1], "ticket": ticket, "wait": True, "self_start": alone}
            spec["lease"] = {**units, **lease}
        try:
            done = subprocess.run(
                self.agent(job_dir, "start", "."),
                cwd=job_dir,
                input=json.dumps(spec).encode(),
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
