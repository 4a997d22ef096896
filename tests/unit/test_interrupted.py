"""Ctrl-C on an attached submit, pressed once, twice and three times (jobs/teardown.py).

The teardown itself runs against real hosts in tests/integration/test_failures.py;
here it is replaced by a recorder whose calls can be interrupted, to press Ctrl-C at
each point the integration test cannot time.
"""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.models.errors import Interrupted
from orchestrator.nodes.ops import KILL_GRACE_S
from orchestrator.ssh import teardown as module


class Notices:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def job_started(self, job_id: str) -> None: ...

    def output(self, host: str, rank: int | None, data: bytes) -> None: ...

    def notice(self, message: str) -> None:
        self.lines.append(message)


def pressed(monkeypatch: pytest.MonkeyPatch, interrupted: set[int]) -> list[float]:
    """The grace of each teardown call; the calls numbered in `interrupted` (from 0)
    are cut short by a Ctrl-C."""
    graces: list[float] = []

    def teardown(*args: Any) -> dict[str, Any]:
        graces.append(args[-1])
        if len(graces) - 1 in interrupted:
            raise KeyboardInterrupt
        return {}

    monkeypatch.setattr(module, "teardown", teardown)
    return graces


def stop(settle: bool = False) -> Notices:
    notices = Notices()
    module.stop_interrupted("job-1", 29500, [], None, notices, lambda: settle)  # type: ignore[arg-type]
    return notices


def test_one_ctrl_c_gives_the_ranks_their_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    graces = pressed(monkeypatch, set())
    notices = stop()
    assert graces == [KILL_GRACE_S]
    assert notices.lines == [
        "interrupted: stopping the job on every host (Ctrl-C again to skip the grace period)"
    ]


def test_a_second_ctrl_c_kills_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    graces = pressed(monkeypatch, {0})
    notices = stop()
    assert graces == [KILL_GRACE_S, 0.0]
    assert "killing the job's processes now" in notices.lines[-1]


def test_starts_under_way_are_stopped_again_with_the_same_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graces = pressed(monkeypatch, set())
    stop(settle=True)
    assert graces == [KILL_GRACE_S, KILL_GRACE_S]
    graces = pressed(monkeypatch, {0})
    stop(settle=True)
    assert graces == [KILL_GRACE_S, 0.0, 0.0]


def test_a_third_ctrl_c_leaves_and_names_orch_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    graces = pressed(monkeypatch, {0, 1})
    with pytest.raises(Interrupted) as caught:
        stop()
    assert graces == [KILL_GRACE_S, 0.0]
    assert "left before it was stopped on every host" in caught.value.message
    assert caught.value.hint == "stop it: orch kill job-1"
    assert caught.value.exit_code == 130
