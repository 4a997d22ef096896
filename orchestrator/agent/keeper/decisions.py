"""What a detached job's keeper decides (daemon.py runs it): pure, fed the members'
messages and the clock, answering with the messages to send. No I/O, so that the unit
tests drive it with fake messages.

A keeper follows one job through its attempts:

    (line: its nodes wait for their leases on shared hosts, kernel/line.py) --> running
    --a node failed or was lost--> stopping --all stopped--> waiting (the restart
    delay) --> port (a free rendezvous port from the new master's member)
    --> starting --all started--> (line, on shared hosts) --> running (the next attempt)

On shared hosts a later attempt waits in line as the first did: its members start its
nodes with their lease request (all under one ticket, the restart's time), and when
any has to wait, the keeper takes their leases together (kernel/line.py) before `running`.

It ends `succeeded` (every node of an attempt succeeded), `failed` (it failed and no
restart is left, or too few hosts are), or `killed` (`orch kill`: `stop()`, or a node
found killed by someone else). It never restarts after a kill.

Messages are the classes of keeper/wire.py. From a member: Hello, Heartbeat, NodeEnd
{attempt, returncode, killed, error}, NodeStarted {attempt, ok, error, queued},
Stopped {attempt}, PortFound {port}, LeaseAnswered {verb, reply}. To a member: Stop
{attempt}, Start {place}, PortWanted, LeaseAsked {verb}, Bye. A job that never gets
its nodes out of the line is not restarted.

With `stall_after:` (docs/STACKS.md), the keeper is the job's stall watchdog too
(stall.py): when every node of a running attempt has been silent that long, it takes
the stacks and, unless `on_stall: warn`, stops the attempt as failed: restarts apply.

When the keeper's host is lost, a member takes over (takeover.py): `snapshot()` is what
the keeper shares with its members, `Keeping.take_over` the new keeper made from it,
one epoch later. The new keeper first gathers the members (`taking over`) and then
goes on from where the snapshot stood: the nodes whose members do not come back are
lost, and the attempt restarts as for any lost host. Fencing: a keeper starts a new
attempt only while more than half of the job's members (the hosts that said hello,
spares included) talk to it, so that a keeper cut off from the others (the old one,
behind a partition) can never start an attempt beside the new one; it gives up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..kernel import states
from ..kernel.layout import job_dir
from ..kernel.lease_wire import LeaseState
from ..kernel.line import Line, Outcome
from ..kernel.messages import Message, MessageError, parse_message
from ..kernel.placement import failed_hosts, next_hosts, placement, restart_delay
from . import wire
from .stall import StallWatch

LINE, RUNNING, STOPPING, WAITING, PORT, STARTING, KILLING, DONE, TAKING = (
    "line",
    "running",
    "stopping",
    "waiting",
    "port",
    "starting",
    "killing",
    "done",
    "taking over",
)
STOP_WAIT_S = 40.0  # for the members to stop their nodes (the kill's grace, and more)
START_WAIT_S = 120.0  # for the members to build the snapshot and start torchrun
PORT_WAIT_S = 30.0
HELLO_WAIT_S = 30.0
GATHER_S = 10.0  # beyond lost_after, for a new keeper's members to find it (takeover.py)
ACTIVE = states.NODE_ACTIVE

if TYPE_CHECKING:  # a runtime alias would need Python 3.9; hosts may run 3.8
    Send = list[tuple[str, Message]]  # (host, message) to send


def successors(snapshot: dict[str, Any]) -> list[str]:
    """Who takes over from the keeper of `snapshot` when it is lost, in turn: the
    members that talked to it and can keep (a standby port), in the selection's order
    (the job's hosts by node rank, then its spares), its own host left out. Each
    member tries them in this order; the first that answers keeps the job."""
    roster, talking = snapshot["roster"], set(snapshot["connected"])
    return [
        str(c["host"])
        for c in snapshot["candidates"]
        if c["host"] != snapshot["keeper"]
        and c["host"] in talking
        and isinstance(roster.get(c["host"]), int)
    ]


def _lease_asks(asks: list[tuple[str, str]]) -> Send:
    """The line's asks (kernel/line.py) as messages to the members."""
    return [(host, wire.LeaseAsked(verb=verb)) for host, verb in asks]


class Keeping:
    """The keeper's state: the attempt, its nodes and how each ended, the earlier
    attempts, and which members are connected and when each was last heard from.

    Args:
        config: job_id, restarts, lost_after, rendezvous_port (None: ask the master),
            place (attempt 0's placement), candidates [{host, nproc, addr, workdir}]
            in the selection's order; line: attempt 0's nodes wait in line, "together"
            (the keeper takes their leases) or "alone" (one node takes its own).
        now: the clock (monotonic seconds); every member gets `lost_after` from now
            to say hello.
        wall: the time of day, for a restart's place in the hosts' lines.
    """

    def __init__(
        self, config: dict[str, Any], now: float, wall: Callable[[], float] = time.time
    ) -> None:
        self.wall = wall
        self.job_id = str(config["job_id"])
        self.restarts = int(config["restarts"])
        self.lost_after = float(config["lost_after"])
        self.pinned_port = config.get("rendezvous_port")
        self.candidates = {c["host"]: c for c in config["candidates"]}
        self.order = [c["host"] for c in config["candidates"]]
        self.place: dict[str, Any] = config["place"]
        self.attempt = int(self.place["attempt"])
        line = config.get("line")
        self.line = Line(self.place["hosts"], line == "alone") if line else None
        first = states.QUEUED if self.line else states.RUNNING
        self.nodes = {h: self._node(first) for h in self.place["hosts"]}
        self.heard = {h: now for h in self.order}
        self.connected: set[str] = set()
        self.greeted: set[str] = set()  # members that said hello once
        self.history: list[dict[str, Any]] = []  # the earlier attempts, as `record` shows them
        self.phase = LINE if self.line else RUNNING
        self.outcome: str | None = None  # once DONE: succeeded, failed or killed
        self.reason: str | None = None  # why the last attempt ended
        self.pending: set[str] = set()  # whose stop or start is awaited
        self.deadline = 0.0
        self.chosen: list[str] = []
        # Takeover (takeover.py): the keeper's generation, its host, and the members'
        # standby ports (None: an agent that cannot keep), by host, from their hello.
        self.epoch = int(config.get("epoch") or 0)
        self.host = str(config.get("host") or self.place["hosts"][0])
        self.roster: dict[str, int | None] = {}
        self.resumed = RUNNING  # the phase a taken-over keeper goes on from
        self.gave_way = False  # it ended for want of a quorum: another may keep the job
        self.lost_keeper: str | None = None
        self.stall = StallWatch(config)  # the stall watchdog (stall.py)

    @staticmethod
    def _node(state: str) -> dict[str, Any]:
        return {"state": state, "exit_code": None, "error": None}

    @property
    def done(self) -> bool:
        return self.phase == DONE

    # ------------------------------------------------------------ events

    def hear(self, host: str, msg: Message, now: float) -> Send:
        """A message from `host`'s member (a Heartbeat only says it is there)."""
        if host not in self.heard:
            return []
        self.heard[host] = now
        if isinstance(msg, wire.Heartbeat):
            self.stall.heard(host, msg.idle, now)
        elif isinstance(msg, wire.StackTaken):
            if self.stall.took(host, msg, self.attempt):
                return self.stall.taken(self, now)
        elif isinstance(msg, wire.Hello):
            self.connected.add(host)
            self.greeted.add(host)
            self.roster[host] = msg.port
            if self.phase in (STOPPING, KILLING) and host in self.pending:
                return [(host, wire.Stop(attempt=self.attempt))]  # it was awaited
        elif isinstance(msg, wire.NodeEnd):
            return self._ended(host, msg, now)
        elif isinstance(msg, wire.Stopped) and msg.attempt == self.attempt:
            node = self.nodes.get(host)
            if node is not None and node["state"] in ACTIVE:
                node["state"] = states.KILLED
            self.pending.discard(host)
            return self._after_stop(now)
        elif isinstance(msg, wire.NodeStarted) and msg.attempt == self.attempt:
            return self._started(host, msg, now)
        elif isinstance(msg, wire.PortFound) and self.phase == PORT and self.chosen:
            return self._start(msg.port, now) if host == self.chosen[0] else []
        elif isinstance(msg, wire.LeaseAnswered) and self.phase == LINE and self.line:
            try:
                reply = parse_message(LeaseState, msg.reply, host)
            except MessageError as exc:  # a round goes on without it
                reply = LeaseState(error=f"unreadable lease answer: {exc}")
            asks, outcome = self.line.hear(host, msg.verb, reply, now)
            return _lease_asks(asks) + (self._out_of_line(outcome, now) if outcome else [])
        return []

    def gone(self, host: str) -> None:
        """`host`'s member closed its connection: it is silent from now on."""
        self.connected.discard(host)

    def tick(self, now: float) -> Send:
        """The clock moved: nodes silent too long are lost; waits run out."""
        silent = self._silent(now)
        if self.phase == TAKING:
            gathered = self._members() - {str(self.lost_keeper)} <= self.connected
            return self._resume(now) if gathered or now >= self.deadline else []
        if self.phase == LINE and self.line:
            lost = (silent | self.line.overdue(now)) & set(self.nodes)
            if lost:
                for host in sorted(lost):
                    self.nodes[host].update(state=states.LOST, error="silent while in line")
                return self._give_up_line(now)
            return _lease_asks(self.line.tick(now, set(self.nodes) <= self.connected))
        if self.phase in (RUNNING, STARTING):
            for host in sorted(silent & set(self.nodes)):
                node = self.nodes[host]
                if node["state"] in ACTIVE:
                    node.update(state=states.LOST, error=f"silent for {self.lost_after:.0f} s")
            if any(n["state"] == states.LOST for n in self.nodes.values()):
                if self.phase == STARTING:
                    self.pending -= silent
                    return self._after_start(now)
                return self._stop_attempt(now)
            if self.phase == RUNNING:
                return self.stall.watch(self, now)
        elif self.phase in (STOPPING, KILLING):
            for host in list(self.pending):
                if host in silent or now > self.deadline:
                    self.nodes[host].update(state=states.LOST, error="did not stop")
                    self.pending.discard(host)
            return self._after_stop(now)
        elif self.phase == WAITING and now >= self.deadline:
            if self.pinned_port:
                return self._start(int(self.pinned_port), now)
            self.phase, self.deadline = PORT, now + PORT_WAIT_S
            return [(self.chosen[0], wire.PortWanted())]
        elif self.phase == PORT and now > self.deadline:
            self.reason = f"{self.chosen[0]} gave no port for attempt {self.attempt + 2}"
            return self._finish(states.FAILED)
        elif self.phase == STARTING and now > self.deadline:
            for host in self.pending:
                self.nodes[host].update(state=states.FAILED, error="did not start in time")
            self.pending.clear()
            return self._after_start(now)
        return []

    # ------------------------------------------------------------ the stall watchdog's

    @property
    def running(self) -> bool:
        return self.phase == RUNNING

    @property
    def dumps(self) -> list[tuple[str, dict[str, Any]]]:
        """The stacks the stall watchdog took, for the daemon to keep."""
        return self.stall.dumps

    def stop_stalled(self, reason: str, now: float) -> Send:
        """The stall watchdog stops the attempt as failed, for `reason`."""
        sends = self._stop_attempt(now)
        self.reason = f"attempt {self.attempt + 1} {reason}"
        return sends

    def _silent(self, now: float) -> set[str]:
        """The hosts not heard from for lost_after (a member that never said hello yet
        gets HELLO_WAIT_S: many hosts' members start one SSH command each)."""
        return {
            h
            for h, t in self.heard.items()
            if now - t
            > (self.lost_after if h in self.greeted else max(self.lost_after, HELLO_WAIT_S))
        }

    def stop(self, now: float) -> Send:
        """`orch kill`: stop the attempt's nodes, never start another."""
        if self.phase in (DONE, KILLING):
            return []
        self.phase, self.deadline = KILLING, now + STOP_WAIT_S
        return self._send_stops(now)

    # ------------------------------------------------------------ transitions

    def _ended(self, host: str, msg: wire.NodeEnd, now: float) -> Send:
        node = self.nodes.get(host)
        if msg.attempt != self.attempt or node is None or node["state"] not in ACTIVE:
            return []
        code = msg.returncode
        state = states.KILLED if msg.killed else states.SUCCEEDED if code == 0 else states.FAILED
        node.update(state=state, exit_code=code, error=msg.error)
        if self.phase in (STOPPING, KILLING):
            self.pending.discard(host)
            return self._after_stop(now)
        if state == states.KILLED:  # orch kill reached the node before the keeper: no restart
            return self.stop(now)
        if self.phase == LINE:  # its supervisor left the line
            return self._give_up_line(now)
        if self.phase == STARTING:
            return []  # judged once every start answered
        if all(n["state"] == states.SUCCEEDED for n in self.nodes.values()):
            return self._finish(states.SUCCEEDED)
        if state == states.FAILED:
            return self._stop_attempt(now)
        return []

    def _out_of_line(self, outcome: Outcome, now: float) -> Send:
        """Every node started (or could not), or one left the line."""
        for host, why in outcome.left.items():
            self.nodes[host].update(state=states.FAILED, error=why)
        if outcome.left:
            return self._give_up_line(now)
        for host, reply in outcome.started.items():
            if reply.pid is not None or reply.state == "started":
                self.nodes[host]["state"] = states.RUNNING
            else:
                error = reply.error or "did not start"
                self.nodes[host].update(state=states.FAILED, error=error)
        return self._after_start(now)

    def _give_up_line(self, now: float) -> Send:
        """A node left the line or went silent in it: stop the others, no restart."""
        self.restarts = self.attempt
        return self._stop_attempt(now)

    def _stop_attempt(self, now: float) -> Send:
        """The attempt failed: stop its nodes still running, then decide."""
        ends = {h: n["state"] for h, n in self.nodes.items()}
        bad, lost = failed_hosts(ends)
        what = "lost" if bad and bad <= lost else "failed"
        self.reason = f"attempt {self.attempt + 1} {what} on {', '.join(sorted(bad))}"
        self.phase, self.deadline = STOPPING, now + STOP_WAIT_S
        sends = self._send_stops(now)
        return sends + self._after_stop(now)

    def _send_stops(self, now: float) -> Send:
        """Stop every node still active. The first keeper waits for a member that has
        yet to say hello (its SSH command still starting), as long as a hello may
        take: it gets its stop when it connects (`hear`), and is lost only once
        silent. A keeper that took over gave the members their time to gather."""
        self.pending = set()
        silent = self._silent(now)
        starting = self.epoch == 0
        for host, node in self.nodes.items():
            if node["state"] not in ACTIVE:
                continue
            awaited = starting and host not in self.greeted and host not in silent
            if host in self.connected or awaited:
                self.pending.add(host)
            else:
                node.update(state=states.LOST, error="member not connected")
        stop = wire.Stop(attempt=self.attempt)
        return [(h, stop) for h in sorted(self.pending) if h in self.connected]

    def _after_stop(self, now: float) -> Send:
        if self.pending or self.phase not in (STOPPING, KILLING):
            return []
        if self.phase == KILLING:
            return self._finish(states.KILLED)
        if self.stall.stalled:  # stopped by the watchdog: its nodes failed, for that reason
            for node in self.nodes.values():
                if node["state"] == states.KILLED:
                    node.update(state=states.FAILED, error=self.stall.stalled)
        if self.attempt >= self.restarts:
            return self._finish(states.FAILED)
        ends = {h: n["state"] for h, n in self.nodes.items()}
        bad, lost = failed_hosts(ends)
        silent = self._silent(now)
        absent = {h for h in self.order if h not in self.connected} | silent
        chosen = next_hosts(self.place["hosts"], self.order, bad | absent, lost | absent)
        if chosen is None:
            self.reason = f"{self.reason}; too few hosts left to start again"
            return self._finish(states.FAILED)
        if not self._quorum(now):
            return self._give_way()
        self.chosen = chosen
        self.phase, self.deadline = WAITING, now + restart_delay(self.attempt + 1)
        return self.tick(now)

    def _start(self, port: int, now: float) -> Send:
        """Start the next attempt on the chosen hosts, its master at `port`."""
        self.history.append(self._attempt_record())
        counts = [int(self.candidates[h]["nproc"]) for h in self.chosen]
        master_addr = str(self.candidates[self.chosen[0]]["addr"])
        self.place = placement(self.chosen, counts, master_addr, port, self.attempt + 1)
        self.place["ticket"] = [self.wall(), self.job_id]  # one place in every host's line
        self.attempt += 1
        self.stall.next_attempt()
        self.nodes = {h: self._node(states.STARTING) for h in self.chosen}
        self.phase, self.deadline = STARTING, now + START_WAIT_S
        self.pending = set(self.chosen)
        return [(h, wire.Start(place=self.place)) for h in self.chosen]

    def _started(self, host: str, msg: wire.NodeStarted, now: float) -> Send:
        node = self.nodes.get(host)
        if node is None or self.phase != STARTING:
            return []
        if node["state"] == states.STARTING:
            if msg.ok:
                node["state"] = states.QUEUED if msg.queued else states.RUNNING
            else:
                node.update(state=states.FAILED, error=msg.error or "could not start")
        self.pending.discard(host)
        return self._after_start(now)

    def _after_start(self, now: float) -> Send:
        if self.pending:
            return []
        queued = [h for h, n in self.nodes.items() if n["state"] == states.QUEUED]
        if queued and self.phase == STARTING:  # a restart on shared hosts: its turn first
            self.phase = LINE
            self.line = Line(list(self.nodes), alone=len(self.nodes) == 1)
            return _lease_asks(self.line.tick(now, set(self.nodes) <= self.connected))
        self.phase = RUNNING
        return self._judge_running(now)

    # ------------------------------------------------------------ takeover

    @classmethod
    def take_over(
        cls,
        snapshot: dict[str, Any],
        host: str,
        now: float,
        wall: Callable[[], float] = time.time,
    ) -> Keeping:
        """The keeper that `host`'s member becomes when the keeper of `snapshot` is
        lost: one epoch later, gathering the members before it goes on (`tick`)."""
        config = {**snapshot, "line": None, "epoch": int(snapshot["epoch"]) + 1, "host": host}
        keeping = cls(config, now, wall)
        keeping.nodes = {h: dict(n) for h, n in snapshot["nodes"].items()}
        keeping.history = list(snapshot["history"])
        keeping.reason = snapshot.get("reason")
        keeping.roster = dict(snapshot["roster"])
        keeping.lost_keeper = str(snapshot["keeper"])
        keeping.resumed = str(snapshot["phase"])
        keeping.phase, keeping.deadline = TAKING, now + keeping.lost_after + GATHER_S
        return keeping

    def snapshot(self) -> dict[str, Any]:
        """What the keeper shares with its members, for one of them to take over:
        the job's config as it now stands, and where the keeping is."""
        return {
            "job_id": self.job_id,
            "restarts": self.restarts,
            "lost_after": self.lost_after,
            "rendezvous_port": self.pinned_port,
            "candidates": [self.candidates[h] for h in self.order],
            "place": self.place,
            "epoch": self.epoch,
            "keeper": self.host,
            "nodes": self.nodes,
            "history": self.history,
            "reason": self.reason,
            "phase": self.phase if self.phase != TAKING else self.resumed,
            "roster": {h: p for h, p in self.roster.items() if h in self._members()},
            "connected": sorted(self.connected),
            **self.stall.snapshot(),
        }

    def _members(self) -> set[str]:
        return set(self.roster) | self.greeted

    def _quorum(self, now: float) -> bool:
        """More than half of the job's members talk to this keeper."""
        members = self._members()
        live = (self.connected - self._silent(now)) & members
        return 2 * len(live) > len(members)

    def _give_way(self) -> Send:
        """Too few members talk to this keeper: another may keep the job; leave the
        nodes as they are and start nothing."""
        members = self._members()
        reached = len(self.connected & members)
        why = f"its keeper on {self.host} reached only {reached} of {len(members)} members"
        self.reason = f"{self.reason}; {why}" if self.reason else why
        self.gave_way = True
        return self._finish(states.FAILED)

    def _resume(self, now: float) -> Send:
        """The members had their time to find this new keeper: go on from the
        snapshot; a node whose member did not come is lost."""
        for host, node in self.nodes.items():
            if node["state"] in ACTIVE and host not in self.connected:
                node.update(state=states.LOST, error="lost with the job's keeper")
        if not self._quorum(now):
            return self._give_way()
        self.phase = RUNNING
        if self.resumed == DONE:
            return self._finish(states.SUCCEEDED if self._all_succeeded() else states.FAILED)
        if self.resumed == KILLING:
            return self.stop(now)
        if self.resumed == RUNNING:
            return self._judge_running(now)
        # Stopping, waiting, starting or in line when its keeper went: what was said
        # to the lost keeper is unknown; stop this attempt and decide again.
        return self._stop_attempt(now)

    def _all_succeeded(self) -> bool:
        return all(n["state"] == states.SUCCEEDED for n in self.nodes.values())

    def _judge_running(self, now: float) -> Send:
        """A running attempt: ended when every node succeeded, stopped when one failed
        or was lost, the job stopped when one was killed, else nothing to do."""
        if self._all_succeeded():
            return self._finish(states.SUCCEEDED)
        if any(n["state"] in (states.FAILED, states.LOST) for n in self.nodes.values()):
            return self._stop_attempt(now)
        if any(n["state"] == states.KILLED for n in self.nodes.values()):
            return self.stop(now)
        return []

    def _finish(self, outcome: str) -> Send:
        self.phase, self.outcome = DONE, outcome
        return [(h, wire.Bye()) for h in sorted(self.connected)]

    # ------------------------------------------------------------ record

    def _attempt_record(self) -> dict[str, Any]:
        """The attempt as `record` lists it: its nodes, where, how each ended."""
        counts = self.place["nprocs"]
        nodes = []
        for rank, host in enumerate(self.place["hosts"]):
            node = self.nodes[host]
            workdir = str(self.candidates[host]["workdir"])
            nodes.append(
                {
                    "host": host,
                    "node_rank": rank,
                    "first_rank": sum(counts[:rank]),
                    "nproc": counts[rank],
                    "job_dir": job_dir(workdir, self.job_id, host, self.attempt),
                    **node,
                }
            )
        return {
            "attempt": self.attempt,
            "master_addr": self.place["master_addr"],
            "master_port": self.place["master_port"],
            "nodes": nodes,
            "reason": self.reason,
        }

    def record(self) -> dict[str, Any]:
        """What the keeper writes for `orch status`: `state` (running, restarting,
        stopping, or how it ended), the current attempt and the earlier ones. An
        attempt shows once every node of it started: until then the last one is the
        current one, `restarting`."""
        if self.phase == STARTING:
            *earlier, current = self.history
            state = states.RESTARTING
        else:
            earlier, current = self.history, self._attempt_record()
            state = {
                LINE: states.QUEUED,
                RUNNING: states.RUNNING,
                TAKING: states.RUNNING,
                KILLING: states.STOPPING,
                DONE: str(self.outcome),
            }.get(self.phase, states.RESTARTING)
        return {
            "job_id": self.job_id,
            "state": state,
            "current": current,
            "attempts": earlier,
            "epoch": self.epoch,
            "keeper": self.host,
            "gave_way": self.gave_way,
            "stalls": self.stall.stalls,
        }
