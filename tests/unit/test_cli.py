"""The command line: dry runs, exit codes, error lines, and where the inventory comes from.

Exit codes and `error:`/`hint:` lines are made by `cli.main`, so those tests go through
`main` (in this process, for speed) or run the real `python -m orchestrator` as a
subprocess; CliRunner, which calls the typer app directly, sees an OrchError as its
`exception`. No test here reaches a host: the 10.77.0.x addresses are never contacted.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli.app import app
from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.errors import SpecError
from tests.unit.conftest import Orch, WriteFile

THREE_HOSTS = """
hosts:
  - {name: node1, address: 10.77.0.11, python: /opt/venv/bin/python}
  - {name: node2, address: 10.77.0.12, slots: 2}
  - {name: node3, address: 10.77.0.13}
"""


def orch_process(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `orch ARGS` as the user would: a new process, private HOME, no ORCH_INVENTORY."""
    env = {k: v for k, v in os.environ.items() if k != "ORCH_INVENTORY"}
    env["HOME"] = str(cwd / "home")
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


@pytest.fixture
def job(write: WriteFile, tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "home").mkdir()
    return write("job.yaml", "script: train.py\nargs: [--epochs, '3', 'a b']\n")


@pytest.fixture
def three_hosts(write: WriteFile) -> Path:
    return write("inv/cluster.yaml", THREE_HOSTS)


def dry_run_hosts(stdout: str) -> list[str]:
    """The host names of the nodes a dry run planned, in node-rank order."""
    return re.findall(r"^\[(\S+)\] node rank \d+", stdout, re.MULTILINE)


def test_dry_run_prints_the_job_id_first_and_each_hosts_command(
    job: Path, three_hosts: Path, tmp_path: Path
) -> None:
    result = orch_process("submit", job, "-i", three_hosts, "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    match = re.match(r"job (job-[0-9a-f]{6})\b", lines[0])
    assert match, lines[0]
    job_id = match.group(1)
    assert dry_run_hosts(result.stdout) == ["node1", "node2", "node3"]
    assert "world size 4" in lines[1]
    commands = [line.strip() for line in lines if "torch.distributed.run" in line]
    assert len(commands) == 3
    assert commands[0].startswith("/opt/venv/bin/python -m torch.distributed.run --nnodes 3")
    assert "--node-rank 1 --nproc-per-node 2" in commands[1]
    assert all("--master-addr 10.77.0.11" in c for c in commands)
    assert all(c.endswith("-- --epochs 3 'a b'") for c in commands)
    assert f"cd ~/.orch/jobs/{job_id}/node3\n" in result.stdout
    assert f"each rank runs in ~/.orch/jobs/{job_id}/node3/code\n" in result.stdout
    assert result.stderr == ""


def test_dry_run_first_line_is_exactly_job_and_id(
    orch: Orch, job: Path, three_hosts: Path, tmp_path: Path
) -> None:
    result = orch("submit", job, "-i", three_hosts, "--dry-run", cwd=tmp_path)
    assert re.fullmatch(r"job job-[0-9a-f]{6}", result.stdout.splitlines()[0])


def test_bad_job_file_exits_2_with_error_and_hint_and_no_traceback(
    write: WriteFile, job: Path, tmp_path: Path
) -> None:
    bad = write("bad.yaml", "script: train.py\nnodse: 2\n")
    result = orch_process("submit", bad, "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: {bad}:2:8: nodse: unknown key",
        "hint: did you mean 'nodes'?",
    ]


def test_yaml_syntax_error_exits_2_without_traceback(
    orch: Orch, write: WriteFile, job: Path, tmp_path: Path
) -> None:
    bad = write("bad.yaml", "script: train.py\nargs: [a, b\n")
    result = orch("submit", bad, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {bad}:")
    assert "YAML syntax error" in result.stderr
    assert "\nhint: " in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_wrong_type_in_job_file_prints_a_hint(
    orch: Orch, write: WriteFile, job: Path, tmp_path: Path
) -> None:
    bad = write("bad.yaml", "script: train.py\nnodes: two\n")
    result = orch("submit", bad, "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert "integer" in result.stderr
    assert "\nhint: " in result.stderr


def test_missing_job_file_exits_2(orch: Orch, tmp_path: Path) -> None:
    result = orch("submit", tmp_path / "nope.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert "job file not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_more_nodes_than_hosts_exits_2(
    orch: Orch, write: WriteFile, job: Path, three_hosts: Path, tmp_path: Path
) -> None:
    five = write("five.yaml", "script: train.py\nnodes: 5\n")
    result = orch("submit", five, "-i", three_hosts, "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert f"error: {five}:2:8: nodes=5 but inventory has 3 hosts\n" in result.stderr
    assert f"hint: lower nodes, or add hosts to {three_hosts}" in result.stderr
    assert result.stdout == ""


def test_duplicate_host_names_exit_2(
    orch: Orch, write: WriteFile, job: Path, tmp_path: Path
) -> None:
    inv = write(
        "dup.yaml",
        """
        hosts:
          - {name: node1, address: 10.77.0.11}
          - {name: node1, address: 10.77.0.12}
        """,
    )
    result = orch("submit", job, "-i", inv, "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert f"error: {inv}:3:" in result.stderr
    assert "duplicate host name 'node1'" in result.stderr
    assert "hint: " in result.stderr


def test_missing_inventory_file_exits_2(orch: Orch, job: Path, tmp_path: Path) -> None:
    result = orch("submit", job, "-i", tmp_path / "nope.yaml", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert "inventory file not found" in result.stderr


@pytest.mark.parametrize("args", [["submit"], ["logs"], ["submit", "j.yaml", "--bogus"]])
def test_bad_arguments_exit_2(orch: Orch, tmp_path: Path, args: list[str]) -> None:
    result = orch(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert "Usage:" in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- inventory lookup


@pytest.fixture
def inventories(write: WriteFile) -> dict[str, Path]:
    """Three inventories whose single hosts tell them apart."""
    return {
        source: write(f"inv-{source}.yaml", f"hosts:\n  - {{name: {source}, address: 10.77.0.9}}\n")
        for source in ("cli", "env", "job")
    }


@pytest.fixture
def job_with_inventory(write: WriteFile, tmp_path: Path, inventories: dict[str, Path]) -> Path:
    (tmp_path / "jobs" / "code").mkdir(parents=True)
    (tmp_path / "jobs" / "code" / "train.py").write_text("")
    (tmp_path / "home").mkdir()
    # relative to the job file, not to where orch runs
    return write("jobs/job.yaml", "workdir: code\nscript: train.py\ninventory: ../inv-job.yaml\n")


def test_inventory_option_wins_over_env_and_job(
    orch: Orch, job_with_inventory: Path, inventories: dict[str, Path], tmp_path: Path
) -> None:
    result = orch(
        "submit", job_with_inventory, "-i", inventories["cli"], "--dry-run",
        cwd=tmp_path / "home", env={"ORCH_INVENTORY": str(inventories["env"])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert dry_run_hosts(result.stdout) == ["cli"]


def test_orch_inventory_env_wins_over_the_jobs_inventory(
    orch: Orch, job_with_inventory: Path, inventories: dict[str, Path], tmp_path: Path
) -> None:
    result = orch(
        "submit", job_with_inventory, "--dry-run",
        cwd=tmp_path / "home", env={"ORCH_INVENTORY": str(inventories["env"])},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert dry_run_hosts(result.stdout) == ["env"]


def test_jobs_inventory_key_is_used_relative_to_the_job_file(
    orch: Orch, job_with_inventory: Path, tmp_path: Path
) -> None:
    result = orch("submit", job_with_inventory, "--dry-run", cwd=tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert dry_run_hosts(result.stdout) == ["job"]


def test_without_any_inventory_the_job_runs_on_localhost_and_a_dry_run_touches_nothing(
    orch: Orch, job: Path, tmp_path: Path
) -> None:
    result = orch("submit", job, "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert dry_run_hosts(result.stdout) == ["localhost"]
    assert "master localhost at 127.0.0.1:" in result.stdout
    assert list((tmp_path / "home").iterdir()) == []  # no ~/.orch, no job dir
    command = next(
        line.strip() for line in result.stdout.splitlines() if "torch.distributed" in line
    )
    assert command.startswith(f"{sys.executable} -m torch.distributed.run")


# ---------------------------------------------------------------- CliRunner


def test_cli_runner_dry_run_prints_the_plan(job: Path, three_hosts: Path) -> None:
    result = CliRunner().invoke(app, ["submit", str(job), "-i", str(three_hosts), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert dry_run_hosts(result.output) == ["node1", "node2", "node3"]


def test_cli_runner_passes_input_errors_up_to_main(write: WriteFile, job: Path) -> None:
    bad = write("bad.yaml", "scirpt: train.py\n")
    result = CliRunner().invoke(app, ["submit", str(bad), "--dry-run"])
    assert isinstance(result.exception, SpecError)
    assert result.exception.exit_code == 2
    assert result.exception.hint == "did you mean 'script'?"


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("submit", "status", "logs", "kill", "check"):
        assert re.search(rf"^\W*{command}\b", result.output, re.MULTILINE), command


@given(
    data=st.lists(
        st.sampled_from([b"\n", b"a", b"\xe2\x82\xac", b"\xff", b"\xe2", b" "]), max_size=30
    ).map(b"".join),
    rank=st.one_of(st.none(), st.integers(0, 9)),
)
@settings(max_examples=300, deadline=None)
def test_output_prefixes_every_line_and_ends_with_a_newline(data: bytes, rank: int | None) -> None:
    """Each line of a chunk gets its `[host rN]` prefix; invalid UTF-8 becomes U+FFFD;
    a chunk without a final newline is ended; nothing else changes."""
    reporter = ConsoleReporter()
    out = io.BytesIO()
    reporter._out = out  # type: ignore[assignment]
    reporter.output("node1", rank, data)
    prefix = f"[node1 r{rank}] " if rank is not None else "[node1] "
    text = data.decode("utf-8", "replace")
    expected = "".join(
        prefix + line + "\n" for line in text.split("\n")[: -1 if text.endswith("\n") else None]
    )
    assert out.getvalue().decode("utf-8") == (expected if data else "")
