"""Launchers and placeholders: `launcher:` python / torch.distributed.launch,
`{node_rank}` and the other placeholders in args and env, expanded per node."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.models import placeholders
from orchestrator.models.inventory import Host
from orchestrator.models.job import JobSpec, load_job, local_rank_spelling
from orchestrator.ssh.plan import build_plan, describe
from tests.unit.conftest import WriteFile, expect_input_error

HOSTS = [
    Host(name="node1", address="10.77.0.11", slots=2),
    Host(name="node2", address="10.77.0.12", slots=1),
]
VALUES = {name: f"<{name}>" for name in placeholders.NAMES}


def job(write: WriteFile, tmp_path: Path, text: str, script: str = "") -> JobSpec:
    (tmp_path / "train.py").write_text(script)
    return load_job(write("job.yaml", "script: train.py\n" + text))


def test_placeholders_expand_and_everything_else_stays_verbatim() -> None:
    assert placeholders.expand("-i {node_rank} -g {nprocs_list}", VALUES) == (
        "-i <node_rank> -g <nprocs_list>"
    )
    for verbatim in ('{"lr": 0.1}', "a } b", "${HOME}/x", "{ node_rank }", "{}", "50%"):
        assert placeholders.expand(verbatim, VALUES) == verbatim
    assert placeholders.expand("{{node_rank}", VALUES) == "{node_rank}"
    assert placeholders.expand("{{{node_rank}", VALUES) == "{<node_rank>"


@given(st.text(alphabet="{}$ab_x", max_size=30))
def test_expansion_is_total_on_any_text_without_unknown_names(text: str) -> None:
    if not placeholders.unknown(text):
        expanded = placeholders.expand(text, {n: "" for n in placeholders.NAMES})
        assert expanded.count("{") <= text.count("{")


def test_an_unknown_placeholder_is_an_error_at_its_key_with_a_suggestion(
    write: WriteFile, tmp_path: Path
) -> None:
    error = expect_input_error(lambda: job(write, tmp_path, "args: [-i, '{node_rnak}']\n"))
    assert "line 2" in str(error) or ":2:" in str(error)
    assert "unknown placeholder {node_rnak}" in error.message
    assert "did you mean {node_rank}?" in error.hint
    error = expect_input_error(lambda: job(write, tmp_path, "env: {RANKS: '{nprocs}'}\n"))
    assert "env: unknown placeholder {nprocs}" in error.message


def test_launcher_errors_name_the_key(write: WriteFile, tmp_path: Path) -> None:
    error = expect_input_error(lambda: job(write, tmp_path, "launcher: pyton\n"))
    assert "unknown launcher 'pyton'" in error.message and "did you mean 'python'?" in error.hint
    error = expect_input_error(lambda: job(write, tmp_path, "local_rank_arg: --local_rank\n"))
    assert "applies to launcher: torch.distributed.launch only" in error.message
    error = expect_input_error(lambda: job(write, tmp_path, "launcher: python\nmax_restarts: 2\n"))
    assert "max_restarts" in error.message and "no torchrun" in error.message


def test_the_python_launcher_runs_the_script_once_per_node_with_torchruns_variables(
    write: WriteFile, tmp_path: Path
) -> None:
    spec = job(
        write,
        tmp_path,
        "launcher: python\nargs: [-n, '{num_nodes}', -g, '{nprocs_list}', -i, '{node_rank}']\nenv: {WHO: 'node {node_rank} of {world_size}'}\n",
    )
    plan = build_plan(spec, HOSTS, "j-1", "10.77.0.11", 29500)
    second = plan.nodes[1]
    assert second.argv == (
        "python3", "agent/run.py", "rank", "-", "code", "script", "train.py", "--",
        "-n", "2", "-g", "2,1", "-i", "1",
    )  # fmt: skip
    assert {k: second.env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WHO")} == {
        "MASTER_ADDR": "10.77.0.11",
        "MASTER_PORT": "29500",
        "NODE_RANK": "1",
        "WHO": "node 1 of 3",
    }
    assert (second.env["ORCH_NPROC"], second.env["ORCH_NPROCS_LIST"]) == ("1", "2,1")
    assert "torch.distributed.run" not in plan.nodes[0].argv


def test_torchrun_gets_expanded_args_and_no_master_variables(
    write: WriteFile, tmp_path: Path
) -> None:
    spec = job(write, tmp_path, "args: ['--url', 'tcp://{master_addr}:{master_port}']\n")
    plan = build_plan(spec, HOSTS, "j-1", "10.77.0.11", None)
    assert plan.nodes[0].argv[-2:] == ("--url", "tcp://10.77.0.11:<free port on master>")
    assert "MASTER_ADDR" not in plan.nodes[0].env and "torch.distributed.run" in plan.nodes[0].argv


@pytest.mark.parametrize(
    ("source", "spelling"),
    [
        ("parser.add_argument('--local_rank', type=int)", "--local_rank"),
        ('parser.add_argument("--local-rank", type=int)', "--local-rank"),
        ('p.add_argument("--local_rank", "--local-rank")', "--local-rank"),
        ("import os  # reads LOCAL_RANK", "--local-rank"),
    ],
)
def test_the_legacy_launcher_passes_the_spelling_the_script_declares(
    write: WriteFile, tmp_path: Path, source: str, spelling: str
) -> None:
    assert local_rank_spelling(source) == spelling
    spec = job(write, tmp_path, "launcher: torch.distributed.launch\nargs: [--x]\n", source)
    assert spec.local_rank_arg == spelling
    argv = build_plan(spec, HOSTS, "j-1", "10.77.0.11", 29500).nodes[0].argv
    assert argv[-4:] == ("train.py", spelling, "--", "--x")


def test_the_job_file_can_choose_the_spelling(write: WriteFile, tmp_path: Path) -> None:
    text = "launcher: torch.distributed.launch\nlocal_rank_arg: --local_rank\n"
    assert job(write, tmp_path, text, "no argparse here").local_rank_arg == "--local_rank"


def test_dry_run_shows_each_nodes_expanded_command(write: WriteFile, tmp_path: Path) -> None:
    spec = job(write, tmp_path, "launcher: python\nargs: [-i, '{node_rank}']\n")
    text = "\n".join(describe(build_plan(spec, HOSTS, "j-1", "10.77.0.11", None)))
    assert "train.py on 2 nodes, world size 3, launcher python" in text
    assert "code script train.py -- -i 0" in text and "code script train.py -- -i 1" in text
    assert "MASTER_PORT='<free port on master>'" in text
