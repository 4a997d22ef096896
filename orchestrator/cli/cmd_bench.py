"""`orch bench allreduce`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from orchestrator.api import cluster
from orchestrator.api.cluster import (
    BENCH_HEADER,
    AllreduceOptions,
    BenchSpec,
    SizeResult,
    average_busbw,
    format_row,
)
from orchestrator.cli.app import HostsOpt, InventoryOpt, LabelsOpt, _names, app
from orchestrator.cli.console import ConsoleReporter

bench_app = typer.Typer(
    name="bench", help="Measure the cluster as a job sees it.", no_args_is_help=True
)


class _BenchPrinter:
    """Prints a sweep as nccl-tests' all_reduce_perf does; rank output on stderr."""

    def __init__(self) -> None:
        self.notices = ConsoleReporter()

    def started(self, world: int, backend: str, hosts: Sequence[str], spec: BenchSpec) -> None:
        typer.echo(
            f"# orch bench allreduce: {world} ranks on {', '.join(hosts)}; {backend}, "
            f"float32 sum, {spec.iters} iterations after {spec.warmup} warm-up"
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
    options = AllreduceOptions(
        tuple(_names(hosts)),
        tuple(_names(labels)),
        sizes,
        iters,
        warmup,
        backend,
        nproc_per_node,
    )
    results = cluster.bench_allreduce(options, _BenchPrinter(), inventory)
    typer.echo(f"# Avg bus bandwidth    : {average_busbw(results):.3f} GB/s")


app.add_typer(bench_app)
