"""`orch top`: a live table of a running job's nodes and ranks; `--once --json` for scripts."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.api import watch
from orchestrator.api.watch import INTERVAL_S, SILENT_S, GpuView, NodeView, RankView, TopView
from orchestrator.cli.app import OptionalJobIdArg, app
from orchestrator.cli.console import ConsoleReporter

BEHIND_STYLE = "bold red"
QUIET_STYLE = "yellow"  # silent for a tenth of stall_after: on its way to a stall


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
    views = watch.top(job_id, interval, silent_after, ConsoleReporter())
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
    """One refresh: a title, a line per node that falls behind (with why), the table
    (80 columns suffice: the GPU column is `index:util% used/totalG`, silences are short)
    and a line per node that could not be sampled."""
    lines = [Text(f"job {view.job_id} ({view.name}): {view.state}, every {view.interval_s:g} s")]
    lines += [
        Text(f"behind: {n.host} {n.behind}", style=BEHIND_STYLE) for n in view.nodes if n.behind
    ]
    lines += [
        Text(f"quiet: {n.host} {view.quiet(n)}", style=QUIET_STYLE)
        for n in view.nodes
        if view.quiet(n)
    ]
    table = Table(box=None, header_style="bold")
    for header in ("node", "rank", "CPU%", "RSS", "GPU", "lines/s", "silent", ""):
        right = header in ("CPU%", "RSS", "lines/s", "silent")
        table.add_column(header, justify="right" if right else "left", no_wrap=True)
    notes = []
    for node in view.nodes:
        notes += _node_rows(table, node)
    return Group(*lines, table, *notes)


def _node_rows(table: Table, node: NodeView) -> list[Text]:
    """Add the node's rows; returns what is said of it below the table."""
    style = BEHIND_STYLE if node.behind else None
    if node.state != "running" and not node.ranks:
        table.add_row(node.host, "", "", "", "", "", "", node.state, style="dim")
        return [Text(f"{node.host}: {node.error}", style="dim")] if node.error else []
    gpus = {g.index: g for g in node.gpus or ()}
    for i, rank in enumerate(node.ranks):
        table.add_row(
            node.host if i == 0 else "",
            rank.label,
            _num(rank.cpu_percent, "{:.0f}"),
            _bytes(rank.rss_bytes),
            _gpu(rank, gpus),
            _num(rank.lines_per_s, "{:.1f}"),
            _seconds(rank.idle_s),
            "◀ behind" if rank.behind else node.state if i == 0 and node.state != "running" else "",
            style=BEHIND_STYLE if rank.behind else style,
        )
    if node.launcher_rss_bytes:
        cpu = _num(node.launcher_cpu_percent, "{:.0f}")
        table.add_row("", "torchrun", cpu, _bytes(node.launcher_rss_bytes), style="dim")
    for w in node.warm:  # idle: what they hold is memory (their share of it, PSS)
        memory = _bytes(w.pss_kb << 10) if w.pss_kb is not None else "?"
        idle = _seconds(w.idle_s) if w.state == "ready" else w.state
        table.add_row("", "warm", "", memory, "", "", idle, f"pid {w.pid}", style="dim")
    return (
        [Text(f"{node.host}: nvidia-smi: {node.gpu_error}", style="dim")] if node.gpu_error else []
    )


def _num(value: float | None, fmt: str) -> str:
    return "…" if value is None else fmt.format(value)


def _bytes(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f}G"
    return f"{n / (1 << 20):.0f}M"


def _seconds(value: float | None) -> str:
    """Seconds since the last line: `-` before the first."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    return f"{minutes}m{secs:02d}s"


def _gpu(rank: RankView, gpus: dict[int | None, GpuView]) -> str:
    """`0:97% 40/80G` for each GPU the rank holds memory on (its own memory there, of
    the GPU's total); `-` for none, or no nvidia-smi on the host."""
    used = [gpus[i] for i in rank.gpus if i in gpus]
    if not used:
        return "-"
    util = " ".join(
        f"{g.index}:" + ("?" if g.utilization_percent is None else f"{g.utilization_percent}%")
        for g in used
    )
    total = sum(g.memory_total_mib or 0 for g in used)
    return f"{util} {rank.gpu_memory_mib / 1024:.0f}/{total / 1024:.0f}G"
