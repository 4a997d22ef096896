"""A Slurm job's restarts as a chain of batch jobs: the pure rules both ends use
(agent/kernel/slurm_chain.py), the batch script's steps, and the begin step's
decisions that need no Slurm (agent/node/chain.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from orchestrator.agent.kernel.slurm_chain import (
    KILLED_MARK,
    attempt_dir,
    attempt_record,
    culprits,
    exclude,
    restartable,
    usable,
)
from orchestrator.agent.node import chain
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job
from orchestrator.slurm import script
from orchestrator.slurm.failures import ended_by_slurm, slurm_ending
from orchestrator.slurm.submit import slurm_job
from tests.unit.conftest import WriteFile

HPC = """
defaults: {user: alice}
slurm:
  login: login1.hpc.example.edu
  partition: gpu
  python: /shared/venvs/torch/bin/python
  sbatch: [--account=proj42, --time=04:00:00]
"""


@pytest.mark.parametrize(
    ("state", "restarts"),
    [
        ("FAILED", True),
        ("NODE_FAIL", True),
        ("OUT_OF_MEMORY", True),
        ("CANCELLED by 1000", False),
        ("TIMEOUT", False),
        ("PREEMPTED", False),
        ("COMPLETED", False),
    ],
)
def test_a_restart_follows_a_failure_or_a_lost_node_never_a_cancel_or_time_limit(
    state: str, restarts: bool
) -> None:
    assert restartable(state) is restarts


def test_the_node_that_failed_first_is_the_culprit_not_those_srun_stopped_after() -> None:
    exits = {
        "node2": {"returncode": 1, "ended": 20.5},
        "node3": {"returncode": 1, "ended": 20.1},  # its rank died first
        "node4": {"returncode": -15, "ended": 20.4},
    }
    assert culprits(exits) == ["node3"]
    assert culprits({"node2": {"returncode": 1}, "node3": {"returncode": 1, "ended": 9.0}}) == [
        "node3"
    ]
    # A node that recorded nothing was lost: it, not the peers its loss took down.
    assert culprits({"node2": {"returncode": 1, "ended": 5.0}, "node3": None}) == ["node3"]


def test_the_failed_node_is_left_out_only_where_the_partition_has_enough_others() -> None:
    partition = {"n1": "alloc", "n2": "alloc", "n3": "idle", "n4": "down*"}
    assert exclude(partition, ["n2"], ["n1", "n2"], 2) == ["n2"]
    assert exclude(partition, ["n2"], ["n1", "n2"], 3) == []  # n1, n3 only: keep n2
    # A node of the allocation Slurm took out is left out with the one that failed.
    assert exclude({**partition, "n1": "down*"}, ["n2"], ["n1", "n2"], 1) == ["n1", "n2"]
    assert not usable("down*") and not usable("idle*") and not usable("drain")
    assert usable("idle") and usable("alloc") and usable("mix")


def test_a_later_attempts_node_directory_sits_beside_the_first() -> None:
    assert attempt_dir("node3", 0) == "node3"
    assert attempt_dir("node3", 2) == "node3.attempt2"
    assert attempt_record(1) == "slurm/attempt-1.json"


def slurm_of(write: WriteFile, extra: str) -> script.SlurmJob:
    write("train.py", "print('hi')\n")
    job = load_job(write("job.yaml", "name: digits\nscript: train.py\nnodes: 3\n" + extra))
    return slurm_job(job, load_inventory(write("hpc.yaml", HPC)), "digits-abc123")


def test_a_job_with_restarts_begins_and_ends_each_attempt_around_srun(write: WriteFile) -> None:
    sj = slurm_of(write, "restarts: 2\n")
    text = script.batch_script(sj)
    lines = text.splitlines()
    begin = next(i for i, line in enumerate(lines) if "slurm-attempt begin" in line)
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    end = next(i for i, line in enumerate(lines) if "slurm-attempt end" in line)
    assert begin < srun < end and lines[-1] == "exit $rc"
    assert "ORCH_ATTEMPT=${1:-0}; export ORCH_ATTEMPT" in text
    assert lines[begin].endswith('begin "$PWD" "$ORCH_ATTEMPT" "${2:-}" || exit 0')
    assert subprocess.run(["sh", "-n"], input=text, text=True, check=False).returncode == 0
    # The next attempt's sbatch carries the inventory's own options.
    assert json.loads(script.chain_json(sj)) == {
        "restarts": 2,
        "sbatch": ["--account=proj42", "--time=04:00:00"],
    }
    plain = script.batch_script(slurm_of(write, ""))
    assert "slurm-attempt" not in plain and "ORCH_ATTEMPT" not in plain


def test_no_attempt_begins_after_a_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "slurm").mkdir()
    (tmp_path / KILLED_MARK).touch()
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    assert chain.main(["begin", str(tmp_path), "1", "42"]) == 1
    record = json.loads((tmp_path / attempt_record(1)).read_text())
    assert record["slurm_id"] == "43" and "killed" in record["skipped"]
    assert "started" not in record


@pytest.mark.parametrize(
    ("state", "said", "hint"),
    [
        ("TIMEOUT", "ended TIMEOUT", "--time="),
        ("NODE_FAIL", "ended NODE_FAIL (node node3)", "restarts:"),
        ("PREEMPTED", "ended PREEMPTED", "higher priority"),
        ("CANCELLED by 0", "ended CANCELLED", "orch logs j1"),
    ],
)
def test_a_job_slurm_ended_is_one_error_naming_slurms_word_with_a_hint_for_that_cause(
    state: str, said: str, hint: str
) -> None:
    message, advice = slurm_ending("j1", "failed", "42", state, ["node3"], "~/x/batch-42.out")
    assert message.startswith("job j1 failed: Slurm job 42 ") and said in message
    assert hint in advice and advice.endswith("~/x/batch-42.out on the login node")
    assert ended_by_slurm(state) is (state in ("TIMEOUT", "NODE_FAIL", "PREEMPTED"))
