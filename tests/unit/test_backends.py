"""The backend is chosen once, from the inventory or from a job's record, and what a
backend cannot do yet is refused with one error (Unsupported, exit 2) naming the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import backends
from orchestrator.models.errors import InputError
from orchestrator.models.inventory import load_inventory
from orchestrator.models.states import JobState
from orchestrator.records.db import JobDB, JobRecord
from tests.unit.conftest import Orch, WriteFile

HPC = """
slurm:
  login: login1.hpc.example.edu
  partition: gpu
"""
HOSTS = """
hosts:
  - {name: node1, address: 10.0.0.1}
"""


def slurm_record(job_id: str = "digits-ab12cd") -> JobRecord:
    host = {"name": "login1", "address": "login1.hpc.example.edu", "user": "alice"}
    spec = {"backend": "slurm", "slurm": {"host": host, "job_id": "42", "job_root": "/x"}}
    return JobRecord(job_id, "digits", JobState.RUNNING, "", None, spec)


def test_the_inventory_chooses_the_backend(write: WriteFile) -> None:
    slurm = backends.for_inventory(load_inventory(write("hpc.yaml", HPC)))
    ssh = backends.for_inventory(load_inventory(write("hosts.yaml", HOSTS)))
    assert (slurm.name, ssh.name) == ("slurm", "ssh")


def test_a_recorded_job_goes_back_to_the_backend_that_ran_it() -> None:
    assert backends.for_record(slurm_record()).name == "slurm"
    ssh = JobRecord("train-1", "train", JobState.RUNNING, "10.0.0.1", 29500, {})
    assert backends.for_record(ssh).name == "ssh"  # records from before backends
    other = JobRecord("x-1", "x", JobState.RUNNING, "", None, {"backend": "k8s"})
    with pytest.raises(InputError, match="backend 'k8s'"):
        backends.for_record(other)


@pytest.mark.parametrize(
    ("verb", "message"),
    [
        (("top",), "orch top does not watch a Slurm job yet"),
        (("pull",), "orch pull does not copy a Slurm job's outputs yet"),
    ],
)
def test_what_slurm_cannot_do_yet_is_refused_naming_the_job(
    orch: Orch, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: tuple[str], message: str
) -> None:
    with monkeypatch.context() as m:
        m.setenv("ORCH_HOME", str(tmp_path / "state"))
        JobDB().add(slurm_record())
    result = orch(*verb, "digits-ab12cd")
    assert result.returncode == 2
    assert f"error: job digits-ab12cd: {message}" in result.stderr and "hint: " in result.stderr


def test_the_host_view_of_a_slurm_cluster_is_refused_naming_the_inventory(
    orch: Orch, write: WriteFile
) -> None:
    hpc = write("hpc.yaml", HPC)
    result = orch("status", "--hosts", "-i", hpc)
    assert result.returncode == 2
    assert f"error: {hpc}: orch status --hosts does not show" in result.stderr
    assert "sinfo" in result.stderr
