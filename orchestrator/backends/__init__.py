"""Where jobs run: one protocol (base.py), one implementation per backend (ssh.py,
slurm.py), and the one choice between them, made where the inventory is read
(`load`, `for_inventory`) or from a job's record (`for_record`). Nothing above asks
which backend it is; a new backend is a new module and a line in BACKENDS."""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.backends.base import Backend, CheckOptions, ExecOptions, GcOptions, PullBars
from orchestrator.models.errors import InputError
from orchestrator.models.inventory import Inventory, resolve_inventory
from orchestrator.models.job import JobSpec, Overrides, load_job, with_overrides
from orchestrator.records.db import JobRecord

if TYPE_CHECKING:  # the plan's module is for `plan` and `submit` to import
    from orchestrator.ssh.plan import LaunchPlan

__all__ = [
    "BACKENDS",
    "Backend",
    "CheckOptions",
    "Chosen",
    "ExecOptions",
    "GcOptions",
    "LaunchPlan",
    "PullBars",
    "for_inventory",
    "for_record",
    "load",
]

# name -> the module and class that implement it. A backend's module is imported when
# a job or an inventory first needs it: `orch kill` of an SSH job imports no Slurm.
BACKENDS: dict[str, tuple[str, str]] = {
    "ssh": ("orchestrator.backends.ssh", "SshBackend"),
    "slurm": ("orchestrator.backends.slurm", "SlurmBackend"),
}


@functools.cache
def backend(name: str) -> Backend:
    """The backend called `name` (a key of BACKENDS), one instance per process."""
    module, cls = BACKENDS[name]
    made: Backend = getattr(importlib.import_module(module), cls)()
    return made


def for_inventory(inventory: Inventory) -> Backend:
    """The backend of an inventory: the one its backend section names (`slurm:`), else
    SSH.

    Raises:
        InputError: the section names a backend this orch does not know.
    """
    if inventory.backend_name not in BACKENDS:
        raise InputError(
            f"inventory {inventory.path} names backend '{inventory.backend_name}', "
            "which this orch does not know",
            "known backends: " + ", ".join(BACKENDS),
        )
    return backend(inventory.backend_name)


def for_record(record: JobRecord) -> Backend:
    """The backend that ran a recorded job.

    Raises:
        InputError: the record names a backend this orch does not know.
    """
    if record.backend not in BACKENDS:
        raise InputError(
            f"job {record.id} ran on backend '{record.backend}', which this orch does not know",
            "manage it with the orch that submitted it",
        )
    return backend(record.backend)


@dataclass(frozen=True)
class Chosen:
    """A job with the command line's overrides, its inventory, and the backend that
    runs it there."""

    job: JobSpec
    inventory: Inventory
    backend: Backend


def load(job: Path | JobSpec, inventory: Path | None, overrides: Overrides | None = None) -> Chosen:
    """Load a job (a file, or one loaded already) with the command line's overrides,
    read its inventory (`-i`, else $ORCH_INVENTORY, the job's `inventory:`, then
    localhost), and pick the backend from it.

    Raises:
        InputError: a bad job file, inventory or override.
    """
    spec = job if isinstance(job, JobSpec) else load_job(job)
    if overrides is not None:
        spec = with_overrides(spec, overrides)
    found = resolve_inventory(inventory, spec.inventory)
    return Chosen(spec, found, for_inventory(found))
