"""`orch bench allreduce`: an all_reduce sweep across hosts, reported as nccl-tests does.

The sweep is an orch job like any other (bench/allreduce_rank.py, started through the
backend's own submit): it gets the same preflight, interface choice and teardown as a
training job, so what it measures is what a job would get. nccl on hosts with GPUs,
gloo on CPUs. A backend that runs it hands `run_allreduce` its submit; one that cannot
refuses the verb (backends/base.py).

Bus bandwidth is nccl-tests' measure for all_reduce: algorithm bandwidth (size / time)
times 2(n-1)/n, which a ring's every link carries; it can be compared with the links'
speed whatever the number of ranks n.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from orchestrator.models.errors import InputError
from orchestrator.models.inventory import Host, Inventory, pick_hosts
from orchestrator.models.job import JobSpec
from orchestrator.reporting.reporter import Reporter

# A backend's submit, attached: returns once the job succeeded, raises when it failed.
Submit = Callable[[JobSpec, Inventory, Reporter], str]

MARK = "@orch-allreduce "
SCRIPT = "allreduce.py"
DEFAULT_SIZES = {"gloo": "1K:16M:4", "nccl": "1K:1G:4"}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE = re.compile(r"^(\d+)([KMG]?)B?$", re.IGNORECASE)


@dataclass(frozen=True)
class AllreduceOptions:
    """`orch bench allreduce`: which hosts, which sizes (text as `--sizes` takes it;
    None: DEFAULT_SIZES), how many iterations, which torch.distributed backend
    ("auto": nccl when every host has GPUs) and processes per host (None: its slots)."""

    hosts: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    sizes: str | None = None
    iters: int = 20
    warmup: int = 5
    torch_backend: str = "auto"
    nproc_per_node: int | None = None


@dataclass(frozen=True)
class BenchSpec:
    """What to run: backend, sizes in bytes, iterations, processes per host."""

    backend: str
    sizes: tuple[int, ...]
    iters: int = 20
    warmup: int = 5
    nproc_per_node: int | None = None  # None: each host's slots (its GPUs)


@dataclass(frozen=True)
class SizeResult:
    """One row of the sweep."""

    size: int  # bytes
    count: int  # float32 elements
    time_us: float  # mean per all_reduce, slowest rank
    wrong: int  # elements with a wrong sum, all ranks together
    world: int

    @property
    def algbw(self) -> float:
        """GB/s: bytes reduced per second."""
        return self.size / self.time_us / 1e3 if self.time_us > 0 else 0.0

    @property
    def busbw(self) -> float:
        """GB/s each link carries in a ring: algbw * 2(n-1)/n."""
        return self.algbw * 2 * (self.world - 1) / self.world if self.world else 0.0


class BenchListener(Protocol):
    """What a running sweep tells the user (implemented by the CLI).

    1. `started(world, backend, hosts, spec)` comes once, when every rank is up: the
       ranks, the torch.distributed backend, the hosts' names, what the sweep runs.
    2. `row(result)` comes for each size, smallest first.
    3. `line(host, rank, text)` is any other output of the ranks (warnings, tracebacks).
    4. `notice(message)` is a diagnostic: host keys, the job id, teardown.
    """

    def started(self, world: int, backend: str, hosts: Sequence[str], spec: BenchSpec) -> None: ...

    def row(self, result: SizeResult) -> None: ...

    def line(self, host: str, rank: int | None, text: str) -> None: ...

    def notice(self, message: str) -> None: ...


def parse_sizes(text: str) -> tuple[int, ...]:
    """Sizes in bytes from `1K,64K,1M` or ranges `8:64M` (doubling) and `1K:1G:4` (x4).

    Raises:
        InputError: a size that does not parse, or an empty range.
    """
    sizes: list[int] = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        bounds = item.split(":")
        if len(bounds) == 1:
            sizes.append(_bytes(item))
            continue
        if len(bounds) > 3 or (len(bounds) == 3 and not bounds[2].isdigit()):
            raise InputError(f"bad size range '{item}'", "write MIN:MAX or MIN:MAX:FACTOR")
        low, high = _bytes(bounds[0]), _bytes(bounds[1])
        factor = int(bounds[2]) if len(bounds) == 3 else 2
        if factor < 2 or low > high:
            raise InputError(
                f"empty size range '{item}'", "MIN must not exceed MAX, and FACTOR is 2 or more"
            )
        size = low
        while size <= high:
            sizes.append(size)
            size *= factor
    if not sizes:
        raise InputError("no sizes given", "e.g. --sizes 1K,1M or --sizes 1K:64M")
    return tuple(sorted(set(sizes)))


def _bytes(text: str) -> int:
    match = _SIZE.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise InputError(f"bad size '{text}'", "sizes are bytes, with an optional K, M or G")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def choose_backend(hosts: Sequence[Host], asked: str = "auto") -> str:
    """nccl when every host has GPUs, gloo otherwise (or what was asked)."""
    if asked != "auto":
        return asked
    return "nccl" if all(h.gpus for h in hosts) else "gloo"


def bench_job(names: Sequence[str], spec: BenchSpec, workdir: Path) -> JobSpec:
    """The sweep as an orch job on the named hosts, its script in `workdir`."""
    args = ["--backend", spec.backend, "--sizes", ",".join(map(str, spec.sizes))]
    args += ["--iters", str(spec.iters), "--warmup", str(spec.warmup)]
    return JobSpec(
        path="<orch bench allreduce>",
        name="bench-allreduce",
        workdir=workdir,
        script=SCRIPT,
        module=None,
        args=tuple(args),
        nodes=len(names),
        hosts=tuple(names),
        nproc_per_node=spec.nproc_per_node,
    )


def bench_spec(hosts: Sequence[Host], options: AllreduceOptions) -> BenchSpec:
    """What the sweep runs on these hosts.

    Raises:
        InputError: an unknown torch.distributed backend, or sizes that do not parse.
    """
    if options.torch_backend not in ("auto", "nccl", "gloo"):
        raise InputError(f"unknown backend '{options.torch_backend}'", "use auto, nccl or gloo")
    chosen = choose_backend(hosts, options.torch_backend)
    sizes = parse_sizes(options.sizes or DEFAULT_SIZES[chosen])
    return BenchSpec(chosen, sizes, options.iters, options.warmup, options.nproc_per_node)


def run_allreduce(
    inventory: Inventory, options: AllreduceOptions, listener: BenchListener, submit: Submit
) -> list[SizeResult]:
    """Run the sweep on the chosen hosts (the first one is the master) through
    `submit`, and return its rows.

    Raises:
        InputError: bad options, or hosts the inventory does not have.
        SpecError: the hosts cannot run one job together (local and remote mixed).
        InfraError / PreflightError: as submit.
        JobFailed: a rank failed; the sweep was stopped on every host.
    """
    hosts = pick_hosts(inventory, list(options.hosts), list(options.labels))
    spec = bench_spec(hosts, options)
    workdir = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    try:
        source = resources.files("orchestrator.bench").joinpath("allreduce_rank.py").read_bytes()
        (workdir / SCRIPT).write_bytes(source)
        job = bench_job([h.name for h in hosts], spec, workdir)
        collector = _Collector(listener, tuple(h.name for h in hosts), spec)
        submit(job, inventory, collector)
        return collector.results
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class _Collector:
    """A submit Reporter that turns rank 0's result lines into rows."""

    def __init__(self, listener: BenchListener, hosts: tuple[str, ...], spec: BenchSpec) -> None:
        self.listener = listener
        self.hosts = hosts
        self.spec = spec
        self.results: list[SizeResult] = []
        self.world = 0

    def job_started(self, job_id: str) -> None:
        self.listener.notice(f"job {job_id}")

    def output(self, host: str, rank: int | None, data: bytes) -> None:
        for text in data.decode("utf-8", "replace").splitlines():
            if rank == 0 and text.startswith(MARK):
                self._record(text.removeprefix(MARK))
            else:
                self.listener.line(host, rank, text)

    def notice(self, message: str) -> None:
        self.listener.notice(message)

    def _record(self, payload: str) -> None:
        data: dict[str, Any] = json.loads(payload)
        if "world" in data:
            self.world = int(data["world"])
            self.listener.started(self.world, str(data["backend"]), self.hosts, self.spec)
            return
        result = SizeResult(
            int(data["size"]),
            int(data["count"]),
            float(data["time_us"]),
            int(data["wrong"]),
            self.world,
        )
        self.results.append(result)
        self.listener.row(result)


BENCH_HEADER = (
    f"#{'size':>12}  {'count':>12}  {'type':>8}  {'redop':>6}  {'time':>9}  "
    f"{'algbw':>8}  {'busbw':>8}  {'#wrong':>6}",
    f"#{'(B)':>12}  {'(elements)':>12}  {'':>8}  {'':>6}  {'(us)':>9}  {'(GB/s)':>8}  {'(GB/s)':>8}",
)


def format_row(r: SizeResult) -> str:
    """A row as nccl-tests' all_reduce_perf prints it (out-of-place columns)."""
    return (
        f"{r.size:>13}  {r.count:>12}  {'float':>8}  {'sum':>6}  {r.time_us:>9.1f}  "
        f"{r.algbw:>8.3f}  {r.busbw:>8.3f}  {r.wrong:>6}"
    )


def average_busbw(results: Sequence[SizeResult]) -> float:
    return sum(r.busbw for r in results) / len(results) if results else 0.0
