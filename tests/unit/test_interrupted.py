"""Ctrl-C on an attached submit, pressed once, twice and three times (ssh/teardown.py).

The teardown itself runs against real hosts in tests/integration/test_failures.py;
here it is replaced by a recorder whose calls can be interrupted, to press Ctrl-C at
each point the integration test cannot time.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.models.errors import Interrupted
from orchestrator.nodes.ops import KILL_GRACE_S
from orchestrator.ssh import teardown as module

ENDED = -1.0  # in `Teardowns.events`: the graceful (first) call returned


class Notices:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.told = threading.Event()  # a notice was given

    def job_started(self, job_id: str) -> None: ...

    def output(self, host: str, rank: int | None, data: bytes) -> None: ...

    def notice(self, message: str) -> None:
        self.lines.append(message)
        self.told.set()


class Teardowns:
    """Stands in for `teardown`: records each call's grace in `graces`, and in `events`
    the graces and the graceful call's end (ENDED), in the order they came.

    The calls numbered in `interrupted` (from 0) are cut short by a Ctrl-C. The first
    runs in a thread of its own, as the graceful stop does: its Ctrl-C is a SIGINT to
    the main thread once the user was told to press it again, and it returns only once
    a later call has begun, as the agent's graceful kill ends once the forced one has
    killed what it waited for.
    """

    def __init__(self, interrupted: set[int]) -> None:
        self.interrupted = interrupted
        self.notices = Notices()
        self.graces: list[float] = []
        self.events: list[float] = []
        self._later = threading.Event()

    def __call__(self, *args: Any) -> dict[str, Any]:
        number = len(self.graces)
        self.graces.append(args[-1])
        self.events.append(args[-1])
        if number > 0:
            self._later.set()
        if number in self.interrupted:
            if threading.current_thread() is threading.main_thread():
                raise KeyboardInterrupt
            assert self.notices.told.wait(timeout=10)
            main = threading.main_thread().ident
            assert main is not None
            signal.pthread_kill(main, signal.SIGINT)
            self._later.wait(timeout=10)
            self.events.append(ENDED)
        return {}


@pytest.fixture(autouse=True)
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread, whatever the runner set."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def pressed(monkeypatch: pytest.MonkeyPatch, interrupted: set[int]) -> Teardowns:
    teardowns = Teardowns(interrupted)
    monkeypatch.setattr(module, "teardown", teardowns)
    return teardowns


def stop(teardowns: Teardowns, settle: bool = False) -> Notices:
    notices = teardowns.notices
    module.stop_interrupted("job-1", 29500, [], None, notices, lambda: settle)  # type: ignore[arg-type]
    return notices


def test_one_ctrl_c_gives_the_ranks_their_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    teardowns = pressed(monkeypatch, set())
    notices = stop(teardowns)
    assert teardowns.graces == [KILL_GRACE_S]
    assert notices.lines == [
        "interrupted: stopping the job on every host (Ctrl-C again to skip the grace period)"
    ]


def test_a_second_ctrl_c_kills_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    teardowns = pressed(monkeypatch, {0})
    notices = stop(teardowns)
    assert teardowns.graces == [KILL_GRACE_S, 0.0]
    assert "killing the job's processes now" in notices.lines[-1]


def test_a_second_ctrl_c_returns_only_once_the_graceful_stop_has_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    teardowns = pressed(monkeypatch, {0})
    stop(teardowns)
    assert teardowns.events == [KILL_GRACE_S, 0.0, ENDED]


def test_starts_under_way_are_stopped_again_with_the_same_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    teardowns = pressed(monkeypatch, set())
    stop(teardowns, settle=True)
    assert teardowns.graces == [KILL_GRACE_S, KILL_GRACE_S]
    teardowns = pressed(monkeypatch, {0})
    stop(teardowns, settle=True)
    assert teardowns.graces == [KILL_GRACE_S, 0.0, 0.0]


def test_a_third_ctrl_c_leaves_and_names_orch_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    teardowns = pressed(monkeypatch, {0, 1})
    with pytest.raises(Interrupted) as caught:
        stop(teardowns)
    assert teardowns.graces == [KILL_GRACE_S, 0.0]
    assert "left before it was stopped on every host" in caught.value.message
    assert caught.value.hint == "stop it: orch kill job-1"
    assert caught.value.exit_code == 130


def test_a_graceful_stop_that_fails_raises_in_the_caller_not_in_its_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The graceful stop runs in a thread of its own: its error is the caller's to
    show (an `error:` line), never a thread's traceback on stderr."""
    from orchestrator.models.errors import HostError

    def failing(*args: Any) -> dict[str, Any]:
        raise HostError("node1", "connection lost")

    hooked: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", hooked.append)
    monkeypatch.setattr(module, "teardown", failing)
    with pytest.raises(HostError, match="connection lost"):
        module.stop_interrupted("job-1", 29500, [], None, Notices(), lambda: False)  # type: ignore[arg-type]
    assert hooked == []
