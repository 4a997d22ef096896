"""`orch bench allreduce`."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from orchestrator.bench.allreduce import (
    BENCH_HEADER,
    DEFAULT_SIZES,
    BenchSpec,
    SizeResult,
    average_busbw,
    choose_backend,
    format_row,
    parse_sizes,
    run_allreduce,
)
from orchestrator.cli.app import HostsOpt, InventoryOpt, LabelsOpt, _names, app
from orchestrator.cli.console import ConsoleReporter
from orchestrator.models.errors import InputError
from orchestrator.models.inventory import pick_hosts, resolve_inventory

bench_app = typer.Typer(
    name="bench", help="Measure the cluster as a job sees it.", no_args_is_help=True
)


class _BenchPrinter:
    """Prints a sweep as nccl-tests' all_reduce_perf does; rank output on stderr."""

    def __init__(self, hosts: list[str], spec: BenchSpec) -> None:
        self.hosts = hosts
        self.spec = spec
        self.notices = ConsoleReporter()

    def started(self, world: int, backend: str) -> None:
        typer.echo(
            f"# orch bench allreduce: {world} ranks on {', '.join(self.hosts)}; {backend}, "
            f"float32 sum, {self.spec.iters} iterations after {self.spec.warmup} warm-up"
        )
        typer.echo("#")
        for line in BENCH_HEADER:
            typer.echo(line)

    def row(self, result: SizeResult) -> None:
        typer.echo(format_row(result))

    def line(self, host: str, rank: int | None, text: str) -> None:
        prefix = f"[{host} r{rank}]" if rank is not None else f"[{host}]"
        sys.stderr.write(f"{prefix} {text}\n")

    def notice(self, message: str) -> None:
        self.notices.notice(message)


@bench_app.command("allreduce")
def bench_allreduce(
    inventory: InventoryOpt = None,
    hosts: HostsOpt = None,
    labels: LabelsOpt = None,
    sizes: Annotated[
        str | None,
        typer.Option(
            "--sizes", help="Bytes: 1K,1M or MIN:MAX[:FACTOR] (default 1K:16M:4, nccl 1K:1G:4)."
        ),
    ] = None,
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed all_reduces per size.")] = 20,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Untimed ones before.")] = 5,
    backend: Annotated[
        str, typer.Option("--backend", help="auto (nccl when every host has GPUs), nccl, gloo.")
    ] = "auto",
    nproc_per_node: Annotated[
        int | None, typer.Option("--nproc-per-node", min=1, help="Default: each host's slots.")
    ] = None,
) -> None:
    """all_reduce sweep across the hosts: size, time, algorithm and bus bandwidth."""
    if backend not in ("auto", "nccl", "gloo"):
        raise InputError(f"unknown backend '{backend}'", "use auto, nccl or gloo")
    found = resolve_inventory(inventory, None)
    selected = pick_hosts(found, _names(hosts), _names(labels))
    chosen = choose_backend(selected, backend)
    spec = BenchSpec(
        chosen, parse_sizes(sizes or DEFAULT_SIZES[chosen]), iters, warmup, nproc_per_node
    )
    results = run_allreduce(found, selected, spec, _BenchPrinter([h.name for h in selected], spec))
    typer.echo(f"# Avg bus bandwidth    : {average_busbw(results):.3f} GB/s")


app.add_typer(bench_app)
