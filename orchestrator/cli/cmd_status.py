"""`orch status`: the jobs table, or one job's nodes; `--json` for scripts."""

from __future__ import annotations

import json
import signal
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from orchestrator import api
from orchestrator.api import JobState, JobStatus
from orchestrator.cli.app import InventoryOpt, OptionalJobIdArg, app
from orchestrator.cli.console import ConsoleReporter


@app.command()
def status(
    job_id: OptionalJobIdArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    hosts: Annotated[
        bool, typer.Option("--hosts", help="Each host's GPUs or slots: free or held by whom.")
    ] = False,
    inventory: InventoryOpt = None,
) -> None:
    """Table of jobs, or one job's nodes; reconciled with the hosts."""
    if hosts:
        from orchestrator.cli.hosts_view import show_hosts  # the hosts' rows: for --hosts only

        show_hosts(inventory, as_json)
        return
    reporter = ConsoleReporter()
    records = api.statuses(job_id, reporter)
    if as_json:
        queued = api.places([r.id for r in records if r.state is JobState.PENDING])
        shown = [{**_job_json(r), "queued": queued.get(r.id)} for r in records]
        typer.echo(json.dumps(shown, indent=2))
        return
    console = Console()
    if job_id:
        console.print(_nodes_table(records[0]))
        return
    table = Table("id", "name", "state", "nodes", "started", "duration", "exit", box=None)
    queued = api.places([r.id for r in records if r.state is JobState.PENDING])
    for r in records:
        table.add_row(
            r.id,
            r.name,
            f"[cyan]{queued[r.id]}[/cyan]" if r.id in queued else _state(r.state) + r.note,
            str(len(r.nodes)),
            _when(r.started or r.created),
            _duration(r.duration),
            "" if r.exit_code is None else str(r.exit_code),
        )
    console.print(table if records else "no jobs yet: orch submit JOB.yaml")


def _state(state: JobState) -> str:
    color = {"succeeded": "green", "failed": "red", "lost": "red", "killed": "yellow"}.get(
        state.value, "cyan"
    )
    return f"[{color}]{state.value}[/{color}]"


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return ""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return str(code)


def _attempt(record: JobStatus) -> str:
    """`, attempt 2 of 3 (attempt 1 failed on node2)` for a job with restarts."""
    if not record.restarts:
        return ""
    before = [
        f"attempt {a.attempt + 1} {state.value} on {host}"
        for a in record.earlier
        for host, state in a.nodes.items()
        if state in (JobState.FAILED, JobState.LOST)
    ]
    earlier = f" ({'; '.join(before)})" if before else ""
    return f", attempt {record.attempt + 1} of {record.restarts + 1}{earlier}"


def _nodes_table(record: JobStatus) -> Table:
    table = Table(
        "host",
        "node rank",
        "ranks",
        "state",
        "exit",
        "last line",
        box=None,
        title=f"job {record.id} ({record.name}): {record.state.value}{_attempt(record)}"
        + record.note,
        title_justify="left",
    )
    for n in record.nodes:
        ranks = str(n.ranks.start) if len(n.ranks) == 1 else f"{n.ranks.start}-{n.ranks.stop - 1}"
        state = _state(n.state)
        if n.still_running:
            state += f" ({n.error})"
        silent = "" if n.idle_s is None else f"{n.idle_s:.0f} s ago"
        table.add_row(n.host, str(n.node_rank), ranks, state, _exit_text(n.exit_code), silent)
    return table


def _job_json(r: JobStatus) -> dict[str, object]:
    return {
        "id": r.id,
        "name": r.name,
        "state": r.state.value,
        "created": r.created,
        "started": r.started,
        "ended": r.ended,
        "duration": r.duration,
        "exit_code": r.exit_code,
        "master_addr": r.master_addr,
        "master_port": r.master_port,
        "spec": r.spec,
        "nodes": [
            {
                "host": n.host,
                "address": n.address,
                "node_rank": n.node_rank,
                "ranks": list(n.ranks),
                "state": n.state.value,
                "exit_code": n.exit_code,
                "signal": _exit_text(n.exit_code) if (n.exit_code or 0) < 0 else None,
                "error": n.error,
                "idle_s": n.idle_s,
            }
            for n in r.nodes
        ],
    }
