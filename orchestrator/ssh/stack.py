"""`orch stack`: the Python stack of every rank of a running job, from every host at
once (one agent command, `stack`, per host: agent/node/stack.py), grouped and kept in
the job's records.

1. Every host is asked at the same time, each over its own connection, dialled before
   paramiko is imported where it surely goes straight to the host (transport/dial.py),
   so that the hosts' sshd accept while this process loads it; a host that
   has not answered `GRACE_S` after the last healthy one did is given up on (it is
   named, the others are shown): a lost host costs the slowest healthy host's time
   plus GRACE_S, never a connect or command timeout. A host being sent py-spy is not
   given up on that way: it is busy, not lost.
2. py-spy goes to a host only when the host lacks its hash (nodes/tools.py): the
   `stack` command says so, the binary is sent, and the command asked again.
3. A job that has ended has no stacks to take: the error names the dumps taken
   while it ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from orchestrator.agent.kernel.layout import tools_dir
from orchestrator.agent.kernel.replies import StackReply
from orchestrator.agent.kernel.requests import StackRequest
from orchestrator.models.errors import HostError, MultiHostError, OrchError
from orchestrator.nodes import tools
from orchestrator.records import stacks as kept
from orchestrator.records.db import JobDB, JobRecord, NodeRecord
from orchestrator.reporting import stacks
from orchestrator.reporting.reporter import Reporter
from orchestrator.reporting.stacks import StackOptions as Wanted
from orchestrator.reporting.taken import chosen, ended_error, keep
from orchestrator.ssh.pyspy import ask
from orchestrator.transport import ConnectOptions, Transport, dial_ahead, open_transport

GRACE_S = 2.0  # past the last healthy host's answer, a host still silent is lost
READ_TIMEOUT_S = 10.0


def take(store: JobDB, record: JobRecord, wanted: Wanted, reporter: Reporter) -> stacks.StackView:
    """Take the job's stacks, keep them in its records, and return them.

    Raises:
        InputError: the job has ended (the error names its kept dumps), or `wanted`
            names a host or rank the job does not have.
        HostError / MultiHostError: no host of the job answered.
    """
    if record.state.is_terminal():
        raise ended_error(record)
    nodes = chosen(record, wanted)
    taken = time.time()
    replies, unanswered = ask_all(record, nodes, wanted, kept.stamp(taken), reporter.notice)
    if not replies:
        raise _combined(unanswered)
    if not any(r.ranks for r in replies.values()):
        from orchestrator.ssh.reconcile import reconcile

        now = reconcile(store, record, reporter)
        if now.state.is_terminal():
            raise ended_error(now)
    return keep(record, taken, replies, unanswered)


def take_if_stalled(
    record: JobRecord, stall_after: float, reporter: Reporter
) -> tuple[stacks.StackView | None, float | None]:
    """The stall watchdog's look: every rank's stack, kept, where every node that
    answers has been silent `stall_after` seconds on its own clock; else (None, the
    least silence a node reported, None where no node said).

    Raises:
        HostError / MultiHostError: no host of the job answered.
    """
    nodes = chosen(record, Wanted())
    taken = time.time()
    replies, unanswered = ask_all(
        record, nodes, Wanted(), kept.stamp(taken), reporter.notice, stall_after
    )
    if not replies:
        raise _combined(unanswered)
    idle = [r.idle_s for r in replies.values() if r.exists and r.idle_s is not None]
    if any(r.skipped for r in replies.values()) or not idle:
        return None, min(idle, default=None)
    return keep(record, taken, replies, unanswered), min(idle)


def ask_all(
    record: JobRecord,
    nodes: Sequence[NodeRecord],
    wanted: Wanted,
    name: str,
    notice: Callable[[str], None],
    if_idle: float | None = None,
) -> tuple[dict[str, StackReply], list[OrchError]]:
    """Every node's reply, and the errors of the hosts that gave none (module
    docstring, 1)."""
    carried = tools.pyspy_tools()
    options = ConnectOptions(notice=notice)
    done = threading.Condition()
    replies: dict[str, StackReply] = {}
    failures: dict[str, OrchError] = {}
    busy: set[str] = set()  # receiving py-spy: not lost
    transports: dict[str, Transport] = {}
    # Every host's connection is dialled before the first thread imports paramiko:
    # the hosts accept while it does (transport/dial.py).
    dialled = dial_ahead([n.host for n in nodes], options)

    def one(node: NodeRecord) -> None:
        host = node.host
        try:
            transport = open_transport(host, options, dialled.pop(host.name, None))
            transports[host.name] = transport
            transport.connect()
            ranks = [r for r in wanted.ranks if r in node.ranks] or None
            request = StackRequest(
                job_id=record.id,
                ranks=ranks,
                native=wanted.native,
                tools_dir=tools_dir(host.workdir),
                pyspy={m: t.sha256 for m, t in carried.items()},
                taken=name,
                timeout=READ_TIMEOUT_S,
                if_idle=if_idle,
            )
            reply = ask(node, transport, request)
            if reply.need_tool:
                tool = next(t for t in carried.values() if t.sha256 == reply.need_tool)
                with done:
                    busy.add(host.name)
                tools.put(host, transport, tool)
                with done:
                    busy.discard(host.name)
                reply = ask(node, transport, request)
            with done:
                replies[host.name] = reply
                done.notify_all()
        except OrchError as exc:
            with done:
                failures[host.name] = exc
                done.notify_all()
        except Exception as exc:  # one host's surprise never hides the others
            with done:
                failures[host.name] = HostError(host.name, f"unexpected error: {exc!r}")
                done.notify_all()

    # Daemon threads: a lost host's call may block until its timeout, after this
    # command has shown the others and exited.
    for node in nodes:
        threading.Thread(target=one, args=(node,), daemon=True).start()
    names = [n.host.name for n in nodes]
    last = None
    with done:
        while len(replies) + len(failures) < len(names):
            answered = len(replies) + len(failures)
            if last is not None and not busy and time.monotonic() - last >= GRACE_S:
                break
            done.wait(timeout=0.1)
            if len(replies) + len(failures) > answered:
                last = time.monotonic()
        lost = [n for n in names if n not in replies and n not in failures]
        for name_ in lost:
            failures[name_] = HostError(
                name_, f"no answer {GRACE_S:.0f} s after the other hosts answered"
            )
    for name_, transport in list(transports.items()):
        if name_ in lost:  # a dead connection's close may wait: not this command
            threading.Thread(target=transport.close, daemon=True).start()
        else:
            transport.close()
    return replies, [failures[n] for n in names if n in failures]


def _combined(failures: Sequence[OrchError]) -> OrchError:
    return failures[0] if len(failures) == 1 else MultiHostError(failures)
