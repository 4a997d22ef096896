"""The backend is chosen once, from the inventory or from a job's record, and what a
backend cannot do is refused with one error (Unsupported, exit 2)."""

from __future__ import annotations

import pytest

from orchestrator import backends
from orchestrator.models.errors import InputError, Unsupported
from orchestrator.models.inventory import load_inventory
from orchestrator.models.job import load_job
from orchestrator.models.states import JobState
from orchestrator.records.db import JobRecord
from tests.unit.conftest import WriteFile

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


def test_what_slurm_cannot_do_is_refused_with_slurms_own_reason(write: WriteFile) -> None:
    write("train.py", "")
    inventory = load_inventory(write("hpc.yaml", HPC))
    job = load_job(write("job.yaml", "name: digits\nscript: train.py\nnodes: 2\n"))
    with pytest.raises(Unsupported) as caught:
        backends.for_inventory(inventory).plan(job, inventory)
    assert "Slurm picks the nodes at start" in caught.value.message
    assert "--dry-run" in caught.value.hint and caught.value.exit_code == 2
    with pytest.raises(Unsupported) as caught:
        backends.for_inventory(inventory).warm(job, inventory, NoReporter())
    assert "an allocation of its own" in caught.value.message
    assert "start cold" in caught.value.hint and caught.value.exit_code == 2


class NoReporter:
    def notice(self, message: str) -> None:
        raise AssertionError(f"nothing is said before the refusal: {message}")
