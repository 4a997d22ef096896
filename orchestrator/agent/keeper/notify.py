"""A detached job's word when it ends (`notify:`), sent by its keeper on its host, so
that it comes with the laptop closed (kernel/notify.py sends it).

1. The keeper's daemon calls `observe` after every round: a new attempt is
   `restarted`, a new entry of the record's stalls `stalled`, the end `ended` or
   `failed`; each once. A keeper that took over counts from the snapshot it took over
   (what its predecessor saw is not told again); one that gave way for want of a
   quorum tells no end: the keeper that took its place does.
2. The sends run in one thread of their own, in order, so that a hook that hangs or
   fails holds up neither the job's restarts nor its members; `finish` waits for the
   last of them (FINISH_WAIT_S at most) before the keeper leaves.
3. The target (a webhook's URL may hold a token) comes in the keeper's config on
   stdin, never an argv or the keeper's record or snapshot; the keeper's log names
   only its scheme and host.
4. The failing node's member sends, with its end, which of its ranks failed and that
   rank's last lines (`last_lines`): the message carries them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..kernel import notify, states
from ..kernel.layout import LOGS, TORCHRUN_LOG

if TYPE_CHECKING:
    from .decisions import Keeping

TAIL_LINES = 20
TAIL_BYTES = 16384  # of each rank's log, from its end
_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")


def last_lines(node_dir: str) -> tuple[int | None, list[str]]:
    """The failing rank of the node in `node_dir` and its last lines: the rank whose
    log shows a traceback, else the node's own output where that does (torchrun's, or
    `launcher: python`'s script: rank None), else the rank that wrote last; ([]) where
    nothing was written."""
    found: list[tuple[bool, bool, float, int | None, list[str]]] = []
    logs: list[tuple[str, int | None]] = [(os.path.join(node_dir, TORCHRUN_LOG), None)]
    try:
        names = os.listdir(os.path.join(node_dir, LOGS))
    except OSError:
        names = []
    for name in names:
        matched = _RANK_LOG.match(name)
        if matched is not None:
            logs.append((os.path.join(node_dir, LOGS, name), int(matched.group(1))))
    for path, rank in logs:
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - TAIL_BYTES))
                text = f.read().decode("utf-8", "replace")
            written = os.stat(path).st_mtime
        except OSError:
            continue
        lines = [line.rstrip("\r") for line in text.splitlines()][-TAIL_LINES:]
        if lines:
            found.append(("Traceback" in text, rank is not None, written, rank, lines))
    if not found:
        return None, []
    *_, rank, lines = max(found, key=lambda f: f[:3])
    return rank, lines


class KeeperNotify:
    """Tells a kept job's events to its `notify:` target (module docstring).

    Args:
        target: the job's notify target, or None (then nothing is sent).
        keeping: the keeper's decisions, as they stand when the daemon starts.
    """

    def __init__(self, target: str | None, keeping: Keeping) -> None:
        self.courier = notify.Courier(target, _log, _log) if target else None
        self.attempt = keeping.attempt
        self.stalls = len(keeping.stall.stalls)
        self.ended = keeping.done
        self.tails: dict[str, tuple[int, int | None, Sequence[str]]] = {}

    def heard_end(self, host: str, attempt: int, rank: int | None, tail: Sequence[str]) -> None:
        """A member's node ended: which rank failed there, and its last lines."""
        self.tails[host] = (attempt, rank, tail)

    def observe(self, keeping: Keeping) -> None:
        """Queue the events that happened since the last call."""
        if self.courier is None:
            return
        if keeping.attempt > self.attempt:
            self.attempt = keeping.attempt
            why = keeping.reason or "a node failed"
            self._tell(keeping, notify.RESTARTED, states.RESTARTING, None, [why])
        stalls = keeping.stall.stalls
        for stall in stalls[self.stalls :]:
            what = "stopped" if stall.get("action") == "stopped" else "warned"
            detail = [
                f"no rank printed a line for {keeping.stall.stall_after or 0:.0f} s "
                f"in attempt {int(stall.get('attempt') or 0) + 1}; every rank's stack was "
                f"taken ({what})",
                f"the stacks: orch stack {keeping.job_id} --list",
            ]
            self._tell(keeping, notify.STALLED, states.RUNNING, None, detail)
        self.stalls = len(stalls)
        if keeping.done and not self.ended:
            self.ended = True
            if keeping.gave_way:  # cut off from the members: another keeper may go on
                _log("notify: no word of the end: another keeper may keep the job")
                return
            outcome = str(keeping.outcome)
            event = notify.FAILED if outcome == states.FAILED else notify.ENDED
            code = 0 if outcome == states.SUCCEEDED else 1
            self._tell(keeping, event, outcome, code, self._detail(keeping, outcome))

    def finish(self) -> None:
        """Wait for the sends queued (notify.FINISH_WAIT_S at most): the keeper leaves
        next."""
        if self.courier is not None:
            self.courier.finish()

    def _detail(self, keeping: Keeping, outcome: str) -> list[str]:
        if outcome != states.FAILED:
            return []
        lines = [keeping.reason] if keeping.reason else []
        current = keeping.record()["current"]
        for node in current["nodes"]:
            if node["state"] not in (states.FAILED, states.LOST):
                continue
            host = str(node["host"])
            code, error = node.get("exit_code"), node.get("error")
            how = f"exited with code {code}" if code is not None else (error or node["state"])
            lines.append(f"node {host} {how}")
            attempt, rank, tail = self.tails.get(host, (-1, None, ()))
            if attempt == keeping.attempt and tail:
                lines.append(f"last lines of [{host}{'' if rank is None else f' r{rank}'}]:")
                lines.extend(f"  {line}" for line in tail)
                break
        return lines

    def _tell(
        self,
        keeping: Keeping,
        event: str,
        state: str,
        code: int | None,
        detail: list[str],
    ) -> None:
        head = notify.message(keeping.job_id, event, state, code)
        more = f"more: orch status {keeping.job_id}; orch logs {keeping.job_id}"
        text = "\n".join([head, *detail, more])
        assert self.courier is not None
        self.courier.tell(notify.Event(keeping.job_id, event, state, code, text))


def _log(line: str) -> None:
    print(line, flush=True)  # the keeper's log
