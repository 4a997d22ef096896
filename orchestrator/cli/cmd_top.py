"""`orch top`: a live table of a running job's nodes and ranks; `--once --json` for scripts."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.cli.app import OptionalJobIdArg, app
from orchestrator.cli.console import ConsoleReporter
from orchestrator.jobs.top import (
    INTERVAL_S,
    SILENT_S,
    GpuView,
    NodeView,
    RankView,
    TopView,
    watch,
)
from orchestrator.records.db import JobDB

BEHIND_STYLE = "bold red"


@app.command()
def top(
    job_id: OptionalJobIdArg = None,
    once: Annotated[
        bool, typer.Option("--once", help="Print one sample (over one interval) and exit.")
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="JSON for scripts: with --once one object, else one line per refresh.",
        ),
    ] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval", min=0.2, metavar="SECONDS", help="Seconds between two refreshes."
        ),
    ] = INTERVAL_S,
    silent_after: Annotated[
        float,
        typer.Option(
            "--silent-after",
            min=0.0,
            metavar="SECONDS",
            help="A rank seen printing that has been silent this long, while the others "
            "print, is behind (raise it for jobs whose steps take longer).",
        ),
    ] = SILENT_S,
) -> None:
    """Watch a running job (default: the newest): per node and rank, CPU and memory,
    GPU use and memory (where nvidia-smi is), lines per second and seconds since the
    last line. The node that falls behind the others shows in red, with why.
    Rates are measured between two refreshes: the first table has none yet.
    """
    views = watch(JobDB(), job_id, ConsoleReporter(), interval, silent_after)
    first = next(views)
    if once:
        view = next(views)  # the first has no rates: one interval later
        if as_json:
            typer.echo(json.dumps(view.to_json(), indent=2))
        else:
            Console().print(render(view))
        return
    if as_json:
        for view in views:
            typer.echo(json.dumps(view.to_json()), nl=True)
        return
    console, view = Console(), first
    if not console.is_terminal:  # batch mode, as `top -b`: every refresh, one after another
        for view in views:
            console.print(render(view), "")
    else:
        with Live(render(first), console=console, auto_refresh=False) as live:
            for view in views:
                live.update(render(view), refresh=True)
    console.print(f"job {view.job_id} ended: {view.state}")


def render(view: TopView) -> Group:
    """The table of one refresh, with a title line that names who falls behind."""
    title = Text(f"job {view.job_id} ({view.name}): {view.state}, every {view.interval_s:g} s")
    for node in view.nodes:
        if node.behind:
            title.append(f"\nbehind: {node.host} {node.behind}", style=BEHIND_STYLE)
    table = Table(
        "node",
        "rank",
        "CPU %",
        "RSS",
        "GPU",
        "GPU mem",
        "lines/s",
        "last line",
        "",
        box=None,
        header_style="bold",
    )
    for column in table.columns[2:8]:
        column.justify = "right"
    for node in view.nodes:
        _node_rows(table, node)
    return Group(title, table)


def _node_rows(table: Table, node: NodeView) -> None:
    style = BEHIND_STYLE if node.behind else None
    if node.state != "running" and not node.ranks:
        table.add_row(node.host, "", *[""] * 6, node.error or node.state, style=style or "dim")
        return
    gpus = {g.index: g for g in node.gpus or ()}
    for i, rank in enumerate(node.ranks):
        table.add_row(
            node.host if i == 0 else "",
            rank.label,
            _num(rank.cpu_percent, "{:.0f}"),
            _bytes(rank.rss_bytes),
            _gpu_use(rank, gpus, node.gpus is None),
            _gpu_mem(rank, gpus, node.gpus is None),
            _num(rank.lines_per_s, "{:.1f}"),
            _seconds(rank.idle_s),
            "◀ behind" if rank.behind else node.state if i == 0 and node.state != "running" else "",
            style=BEHIND_STYLE if rank.behind else style,
        )
    if node.launcher_rss_bytes:
        cpu = _num(node.launcher_cpu_percent, "{:.0f}")
        table.add_row("", "torchrun", cpu, _bytes(node.launcher_rss_bytes), style="dim")
    if node.gpu_error:
        table.add_row("", "", *[""] * 6, f"nvidia-smi: {node.gpu_error}", style="dim")


def _num(value: float | None, fmt: str) -> str:
    return "…" if value is None else fmt.format(value)


def _bytes(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f} s ago"
    minutes, secs = divmod(int(value), 60)
    return f"{minutes}m{secs:02d}s ago"


def _gpu_use(rank: RankView, gpus: dict[int | None, GpuView], no_smi: bool) -> str:
    used = [gpus[i] for i in rank.gpus if i in gpus]
    if no_smi or not used:
        return "-"
    return " ".join(
        f"{g.index}:" + ("?" if g.utilization_percent is None else f"{g.utilization_percent}%")
        for g in used
    )


def _gpu_mem(rank: RankView, gpus: dict[int | None, GpuView], no_smi: bool) -> str:
    used = [gpus[i] for i in rank.gpus if i in gpus]
    if no_smi or not used:
        return "-"
    total = sum(g.memory_total_mib or 0 for g in used)
    return f"{rank.gpu_memory_mib / 1024:.1f}/{total / 1024:.0f} GiB"
