"""The backend is chosen once, from the inventory or from a job's record; every verb of
the protocol is implemented or refused by each backend, and what a backend cannot do
is refused with one error (Unsupported, exit 2) before anything is contacted."""

from __future__ import annotations

import importlib
import inspect
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator import backends
from orchestrator.backends import CheckOptions, ExecOptions, GcOptions
from orchestrator.backends.base import Backend
from orchestrator.bench.allreduce import AllreduceOptions
from orchestrator.models.errors import InputError, Unsupported
from orchestrator.models.inventory import Inventory, load_inventory
from orchestrator.models.job import load_job
from orchestrator.models.states import JobState
from orchestrator.nodes.into import ForwardOptions, ShellOptions
from orchestrator.records.db import JobRecord
from orchestrator.reporting.stacks import StackOptions
from orchestrator.slurm.unsupported import NOT_YET
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


def test_what_slurm_cannot_do_is_refused_with_slurms_own_reason(write: WriteFile) -> None:
    write("train.py", "")
    inventory = load_inventory(write("hpc.yaml", HPC))
    job = load_job(write("job.yaml", "name: digits\nscript: train.py\nnodes: 2\n"))
    with pytest.raises(Unsupported) as caught:
        backends.for_inventory(inventory).plan(job, inventory)
    assert "Slurm picks the nodes at start" in caught.value.message
    assert "--dry-run" in caught.value.hint and caught.value.exit_code == 2
    with pytest.raises(Unsupported) as caught:
        backends.for_inventory(inventory).warm_start(job, inventory, NoReporter())
    assert "an allocation of its own" in caught.value.message
    assert "start cold" in caught.value.hint and caught.value.exit_code == 2


class NoReporter:
    def notice(self, message: str) -> None:
        raise AssertionError(f"nothing is said before the refusal: {message}")


def protocol_verbs() -> dict[str, list[str]]:
    """Each verb of the Backend protocol, with its parameters' names."""
    verbs = {}
    for name, member in vars(Backend).items():
        if name.startswith("_") or not callable(member):
            continue
        verbs[name] = list(inspect.signature(member).parameters)
    return verbs


def test_the_protocol_check_sees_every_verb() -> None:
    verbs = protocol_verbs()
    assert {"submit", "check", "hosts", "gc", "exec", "warm_list", "bench_allreduce"} <= set(verbs)
    assert verbs["check"] == ["self", "inventory", "job", "options", "reporter"]


@pytest.mark.parametrize("name", sorted(backends.BACKENDS))
def test_every_backend_implements_or_refuses_every_verb_of_the_protocol(name: str) -> None:
    module, cls = backends.BACKENDS[name]
    backend = getattr(importlib.import_module(module), cls)
    assert backend.name == name
    for verb, parameters in protocol_verbs().items():
        method = getattr(backend, verb, None)
        assert callable(method), f"{name} lacks {verb}"
        assert list(inspect.signature(method).parameters) == parameters, f"{name}.{verb}"


def test_slurms_refusals_are_each_a_verb_of_the_protocol() -> None:
    assert set(NOT_YET) <= set(protocol_verbs())


@pytest.mark.parametrize("verb", sorted(set(NOT_YET) - {"plan"}))
def test_slurm_refuses_a_verb_by_name_before_anything_is_said_or_contacted(
    verb: str, write: WriteFile
) -> None:
    write("train.py", "")
    inventory = load_inventory(write("hpc.yaml", HPC))
    job = load_job(write("job.yaml", "name: digits\nscript: train.py\nnodes: 2\n"))
    arguments = refused_arguments(verb, inventory, job)
    with pytest.raises(Unsupported) as caught:
        getattr(backends.for_inventory(inventory), verb)(*arguments)
    said = NOT_YET[verb][0]
    where = f"job {slurm_record().id}" if "record" in protocol_verbs()[verb] else inventory.path
    assert caught.value.message.startswith(f"{where}: {said} is not for the slurm backend")
    assert caught.value.hint and caught.value.exit_code == 2


def refused_arguments(verb: str, inventory: Inventory, job: Any) -> list[Any]:
    options = {
        "gc": GcOptions(),
        "exec": ExecOptions(("true",)),
        "bench_allreduce": AllreduceOptions(),
        "check": CheckOptions(),
        "stack": StackOptions(),
        "forward": ForwardOptions(6006),
        "shell": ShellOptions(),
    }
    given = {
        "inventory": inventory,
        "job": job,
        "reporter": NoReporter(),
        "listener": NoReporter(),
        "record": slurm_record(),
        "store": None,  # a refusal reads no record
    }
    names = protocol_verbs()[verb][1:]
    return [options[verb] if n == "options" else given[n] for n in names]


@pytest.fixture
def login_node() -> Iterator[socket.socket]:
    """A port that stands for a Slurm login node's sshd: whatever connects is queued."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.2", 0))
        listening.listen(8)
        listening.setblocking(False)
        yield listening


def nobody_connected(listening: socket.socket) -> bool:
    try:
        listening.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["gc", "-i", "HPC"], "orch gc"),
        (["gc", "-i", "HPC", "--outputs"], "orch gc"),
        (["exec", "-i", "HPC", "--", "hostname"], "orch exec"),
        (["warm", "-i", "HPC"], "orch warm"),
        (["warm", "-i", "HPC", "--stop"], "orch warm --stop"),
        (["warm", "-i", "HPC", "JOB"], "orch warm JOB"),
        (["bench", "allreduce", "-i", "HPC"], "orch bench allreduce"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_what_slurm_cannot_do_is_refused_by_the_cli_with_exit_2_contacting_nothing(
    words: list[str], said: str, orch: Orch, write: WriteFile, login_node: socket.socket
) -> None:
    port = login_node.getsockname()[1]
    hpc = write("hpc.yaml", f"defaults: {{port: {port}}}\nslurm: {{login: 127.0.0.2}}\n")
    write("train.py", "")
    job = write("job.yaml", "script: train.py\nnodes: 2\n")
    done = orch(*({"HPC": str(hpc), "JOB": str(job)}.get(w, w) for w in words))
    assert done.returncode == 2, done.stderr
    head, hint, *rest = done.stderr.splitlines()
    assert head.startswith(f"error: {hpc}: {said} is not for the slurm backend: "), head
    assert hint.startswith("hint: ") and rest == []
    assert done.stdout == ""
    assert nobody_connected(login_node)
