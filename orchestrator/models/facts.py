"""What a probe learned about a host (nodes/probe.py), as plan and check use it."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.models.clocks import HostClock
from orchestrator.models.environment import WheelTarget


@dataclass(frozen=True)
class HostFacts:
    """What a probe learned about a host; every field may be unknown."""

    hostname: str = ""
    python_version: str = ""
    torch_version: str | None = None
    iface: str | None = None  # the interface that routes to the master
    local_addr: str | None = None  # this host's address on that route
    free_port: int | None = None  # a port free on this host when probed
    # What `orch check` and submit's preflight look at:
    os: str = ""
    python_executable: str = ""
    torch_cuda: str | None = None  # CUDA version torch was built for; None: CPU build
    nccl_version: str | None = None  # of the nvidia-nccl wheel beside torch
    gpu_count: int | None = None  # GPUs seen (nvidia-smi, else /dev/nvidiaN); None: unknown
    gpu_names: tuple[str, ...] = ()
    gpu_error: str | None = None  # what nvidia-smi said instead of (or beside) its GPU rows
    addresses: tuple[tuple[str, str], ...] = ()  # (address, interface) of every IPv4 address
    route_error: str | None = None  # why no interface routes to the master
    port: int | None = None  # the port asked about, and whether it could be bound
    port_free: bool | None = None
    port_holders: tuple[str, ...] = ()  # who holds it: "pid 42 (python train.py), user bob"
    disk_free: int | None = None  # bytes free in the workdir
    clock_offset_s: float | None = None  # host clock minus controller clock
    clock: HostClock | None = None  # the same, with how sure it is (None: not measured)
    modules_missing: tuple[str, ...] = ()  # top-level modules the job needs, not found
    # Which hosts share the workdir's filesystem: the mark this host wrote there, and
    # the other hosts' marks it found (None: not asked, or the workdir is not writable).
    fs_mark: str | None = None
    fs_seen: tuple[str, ...] | None = None
    # `orch check` of a job with `environment:` and no `wheels:`: the package index it
    # would install from, and "ok" or why this host does not reach it.
    index: tuple[str, str] | None = None
    # Submit of a job with `wheels: download`: what wheels the host's python installs.
    wheel_target: WheelTarget | None = None
