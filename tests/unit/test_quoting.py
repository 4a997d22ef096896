"""Command lines for /bin/sh: whatever text goes in comes out as the same words.

Every property is checked against the real /bin/sh, not against shlex: the point is
what the host's shell does with the line.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.models.inventory import Host
from orchestrator.models.job import JobSpec
from orchestrator.nodes import agent, ops
from orchestrator.nodes.shell import sh_join, sh_path
from orchestrator.ssh.plan import build_plan

SH = "/bin/sh"
# What /bin/sh cannot carry: NUL ends a C string. Surrogates are not text.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))
NASTY = st.sampled_from(
    [
        "a b",
        "'",
        '"',
        'it\'s "quoted"',
        "$(touch pwned)",
        "`touch pwned`",
        "; touch pwned",
        "&& touch pwned",
        "| cat",
        "\n",
        "line1\nline2",
        "$HOME",
        "${HOME:-x}",
        "\\",
        "\\'",
        "*",
        "~",
        "~/x",
        "-e",
        "--",
        "",
        " ",
        "\t",
        "!",
        "#comment",
        "é ü 中文 🎉",
    ]
)
WORD = st.one_of(TEXT, NASTY)
QUICK = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def sh_words(command_tail: str, cwd: Path, home: str = "/home/orch test") -> list[str]:
    """The words /bin/sh makes of `command_tail`, as printf gets them."""
    result = subprocess.run(
        [SH, "-c", "printf '%s\\0' " + command_tail],
        capture_output=True,
        cwd=cwd,
        env={"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        check=True,
    )
    return result.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


@QUICK
@given(path=WORD)
def test_sh_path_is_read_back_as_the_same_path(path: str, tmp_path: Path) -> None:
    home = "/home/o'rch $x"
    expected = home + path[1:] if path == "~" or path.startswith("~/") else path
    assert sh_words(sh_path(path), tmp_path, home) == [expected]
    assert not (tmp_path / "pwned").exists()


@QUICK
@given(words=st.lists(WORD, min_size=1, max_size=6))
def test_sh_join_is_read_back_as_the_same_words(words: list[str], tmp_path: Path) -> None:
    assert sh_words(sh_join(words), tmp_path) == words
    assert not (tmp_path / "pwned").exists()


def test_sh_path_expands_a_leading_tilde_to_home(tmp_path: Path) -> None:
    assert sh_words(sh_path("~/x y"), tmp_path, "/home/al ice") == ["/home/al ice/x y"]
    assert sh_words(sh_path("~"), tmp_path, "/home/al ice") == ["/home/al ice"]


def test_sh_path_keeps_a_tilde_elsewhere_literal(tmp_path: Path) -> None:
    assert sh_words(sh_path("~root/x"), tmp_path) == ["~root/x"]
    assert sh_words(sh_path("a/~/b"), tmp_path) == ["a/~/b"]


# ---------------------------------------------------------------- the start command

JOB_ID = "quote-0a1b2c"
WORKDIR = "~/work 'dir' $x"  # the host's workdir, under its (fake) home
ENV_NAME = st.from_regex(r"U_[A-Z0-9_]{0,8}", fullmatch=True)

FAKE_PYTHON = """#!/bin/sh
# Stands in for the host's python: reports where it ran and the words it got.
printf '%s\\0' "$PWD" "$@"
"""


@pytest.fixture(scope="module")
def fake_host(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Host]:
    """A home with the node's job dir in it, and a host whose python is a fake."""
    home = tmp_path_factory.mktemp("home") / "h o m e"
    job_dir = home / "work 'dir' $x" / "jobs" / JOB_ID / "n1"
    job_dir.mkdir(parents=True)
    python = home / "bin dir" / "py`thon"
    python.parent.mkdir()
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return home, Host(name="n1", address="10.77.0.11", python=str(python), workdir=WORKDIR)


def run_supervisor_command(command: str, home: Path) -> tuple[Path, list[str]]:
    result = subprocess.run(
        [SH, "-c", command],
        capture_output=True,
        cwd=home,
        env={"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        check=True,
    )
    cwd, *argv = result.stdout.decode("utf-8").split("\0")[:-1]
    return Path(cwd), argv


@QUICK
@given(
    args=st.lists(WORD, max_size=6),
    env=st.dictionaries(ENV_NAME, WORD, max_size=4),
)
def test_job_args_and_env_reach_the_supervisor_byte_identical(
    args: list[str], env: dict[str, str], fake_host: tuple[Path, Host]
) -> None:
    home, host = fake_host
    job = JobSpec(
        path="job.yaml",
        name="quote",
        workdir=Path("."),
        script="train.py",
        module=None,
        args=tuple(args),
        env=env,
    )
    (node,) = build_plan(job, [host], JOB_ID, "10.77.0.11", 29500).nodes
    spec = json.dumps({"argv": list(node.argv), "env": node.env})  # as launch.start sends it

    cwd, argv = run_supervisor_command(
        agent.job_command(host, node.job_dir, "start", ".", spec), home
    )

    assert cwd == home / "work 'dir' $x" / "jobs" / JOB_ID / "n1"
    assert argv == ["-I", "-S", "agent/run.py", "start", ".", spec]
    received = json.loads(argv[5])
    assert received["argv"][-len(args) - 1 :] == ["--", *args]
    assert {k: received["env"][k] for k in env} == env
    assert not (home / "pwned").exists()


def test_follow_command_reaches_the_supervisor_intact(
    fake_host: tuple[Path, Host],
) -> None:
    home, host = fake_host
    job = JobSpec(path="j", name="q", workdir=Path("."), script="t.py", module=None)
    (node,) = build_plan(job, [host], JOB_ID, "10.77.0.11", 29500).nodes
    offsets = {"node": 12, "3": 4096}
    _, argv = run_supervisor_command(ops.follow_command(node, offsets), home)
    assert argv == ["-I", "-S", "agent/run.py", "follow", ".", json.dumps(offsets)]
