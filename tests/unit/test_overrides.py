"""`orch submit` overrides for sweeps, and help texts that render
as written (item 4)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from orchestrator.cli.app import VERBS, app
from tests.unit.conftest import Orch, WriteFile

INVENTORY = """
hosts:
  - {name: node1, address: 10.77.0.11}
  - {name: node2, address: 10.77.0.12}
"""
JOB = """
name: sweep
script: train.py
args: [--lr, "0.01"]
env: {KEEP: "1"}
"""


@pytest.fixture
def job(write: WriteFile, tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("")
    write("inv.yaml", INVENTORY)
    return write("job.yaml", JOB)


def dry(orch: Orch, job: Path, *options: str) -> str:
    result = orch("submit", job, "-i", job.parent / "inv.yaml", "--dry-run", *options)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_sweep_changes_name_env_nodes_and_args_without_a_yaml_copy(orch: Orch, job: Path) -> None:
    out = dry(
        orch,
        job,
        "--name",
        "lr-0.1",
        "--env",
        "LR=0.1",
        "--env",
        "KEEP=2",
        "--nodes",
        "1",
        "--",
        "--lr",
        "0.1",
    )
    assert out.startswith("job lr-0.1-")
    assert "on 1 nodes" in out and "[node2]" not in out
    assert "  LR=0.1" in out and "  KEEP=2" in out
    assert out.count("-- --lr 0.01 --lr 0.1\n") == 1, "appended: the last --lr wins"


def test_replace_args_and_nproc_per_node(orch: Orch, job: Path) -> None:
    out = dry(orch, job, "--replace-args", "--nproc-per-node", "1", "--", "--epochs", "{node_rank}")
    assert (
        "code script train.py -- --epochs 0\n" in out
        and "code script train.py -- --epochs 1\n" in out
    )
    assert "--lr" not in out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--env", "LR"], "--env 'LR': expected NAME=value"),
        (["--env", "1X=2"], "--env: '1X' is not a valid environment variable name"),
        (["--name", "a b"], "--name: invalid job name 'a b'"),
        (["--nodes", "3"], "nodes=3 but inventory has 2 hosts"),
        (["--", "{nod_rank}"], "unknown placeholder {nod_rank}"),
    ],
)
def test_a_bad_override_is_an_input_error_naming_it(
    orch: Orch, job: Path, options: list[str], message: str
) -> None:
    result = orch("submit", job, "-i", job.parent / "inv.yaml", "--dry-run", *options)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def commands() -> list[tuple[str, str]]:
    for module in VERBS.values():  # each verb joins the app when its module is imported
        importlib.import_module(f"orchestrator.cli.{module}")
    found = []
    for info in app.registered_commands:
        assert info.callback is not None
        name = info.name or info.callback.__name__.replace("_", "-")
        found.append((name, info.callback.__doc__ or ""))
    return found


@pytest.mark.parametrize(("name", "doc"), commands())
def test_every_help_text_shows_its_docstring_as_written(name: str, doc: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    doc = doc.replace("\\[", "[")  # rich's escape, where a docstring needs one
    for bracketed in re.findall(r"\[[^\]]+\]", doc):  # what rich markup would eat
        assert bracketed in shown, f"orch {name} --help lost {bracketed}"
    first = " ".join(doc.strip().split("\n\n")[0].split())
    assert first in shown, f"orch {name} --help: {first!r} not in {shown!r}"


def test_typer_is_what_renders_them() -> None:
    assert isinstance(app, typer.Typer)


def test_shell_completion_offers_job_ids_and_scripts_generate(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from orchestrator.models.inventory import Host
    from orchestrator.models.states import JobState
    from orchestrator.records.db import JobDB, JobRecord, NodeRecord

    home = tmp_path / "state"
    db = JobDB(home)
    node = NodeRecord(Host(name="node1", address="10.77.0.11"), 0, 0, 1, "~/.orch/jobs/x/node1")
    for job_id in ("digits-3fa9c2", "digits-77aa01", "other-123456"):
        db.add(JobRecord(job_id, "digits", JobState.SUCCEEDED, "10.77.0.11", None, {}, [node]))
    env = {**os.environ, "ORCH_HOME": str(home), "_ORCH_COMPLETE": "complete_bash"}
    orch = [str(Path(sys.executable).with_name("orch"))]  # completion keys on the program name
    for verb in ("status", "logs", "kill", "pull"):
        words = {"COMP_WORDS": f"orch {verb} dig", "COMP_CWORD": "2"}
        done = subprocess.run(orch, env={**env, **words}, capture_output=True, text=True)
        assert sorted(done.stdout.split()) == ["digits-3fa9c2", "digits-77aa01"], (verb, done)
    for shell in ("bash", "zsh", "fish"):
        script = subprocess.run(
            [*orch, "--show-completion", shell],
            # The shell as an argument, not found among the ancestors: a suite started
            # in the background (`cmd &` from a shell that then exits) has none.
            env={
                **{k: v for k, v in env.items() if k != "_ORCH_COMPLETE"},
                "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1",
            },
            capture_output=True,
            text=True,
        )
        assert script.returncode == 0 and "_ORCH_COMPLETE" in script.stdout, (shell, script.stderr)
