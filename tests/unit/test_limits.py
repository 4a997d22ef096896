"""The open-files limit: the controller and each node's supervisor lift it to the hard
limit, and a child started afterwards inherits it."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from orchestrator.agent.kernel.limits import raise_open_files

CHILD = """
import resource
from orchestrator.agent.kernel.limits import raise_open_files
before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
now = raise_open_files()
import subprocess, sys
inherited = subprocess.run(
    [sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
    capture_output=True, text=True, check=True,
).stdout.strip()
print(before, now, inherited, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
"""


def _low_soft_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def test_a_low_soft_limit_is_raised_to_the_hard_limit_and_inherited() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard <= 256:
        pytest.skip(f"this process's hard limit is {hard}: nothing to raise")
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=_low_soft_limit,
    ).stdout.split()
    before, now, inherited, child_hard = map(int, out)
    assert before == 256
    assert now == inherited > 256
    if child_hard != resource.RLIM_INFINITY:
        assert now == child_hard


def test_it_never_lowers_the_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert raise_open_files() >= soft
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= soft
