"""How `orch check` of SSH hosts reads: a row per host, the bandwidth with the master,
the rendezvous line, the problems, as a CheckResult (reporting/check.py) that the CLI
draws. Cells a problem concerns carry its mark (error, warning); every problem is also
spelled out below the tables, so nothing depends on colour."""

from __future__ import annotations

from orchestrator.models.errors import RemoteCommandError
from orchestrator.reporting.check import Cell, CheckLine, CheckResult, CheckTable, Column, Mark
from orchestrator.ssh.check.net import BANDWIDTH_S
from orchestrator.ssh.check.rules import Problem, human_bytes
from orchestrator.ssh.check.run import CheckReport, HostStatus, describe_port
from orchestrator.ssh.plan import IFNAME_VARS

COLUMNS = (
    ("host", "host"),
    ("ssh", "ssh"),
    ("os", "os"),
    ("python", "python"),
    ("torch", "torch"),
    ("cuda / nccl", "torch"),
    ("gpus", "gpus"),
    ("disk free", "disk"),
    ("clock", "clock"),
    ("route to master", "route"),
)


def check_result(report: CheckReport) -> CheckResult:
    """The report as `orch check` shows it."""
    tables = [host_table(report)]
    if report.throughput is not None:
        tables.append(bandwidth_table(report))
    return CheckResult(tuple(tables), tuple(summary_lines(report)), failed=bool(report.errors))


def host_table(report: CheckReport) -> CheckTable:
    """One row per host; the first host is the master."""
    columns = tuple(Column(t, no_wrap=t in ("host", "ssh", "clock")) for t, _ in COLUMNS)
    worst = _worst_by_cell(report.problems)
    master = report.hosts[0].host.name
    rows = []
    for status in report.hosts:
        cells = host_cells(status, is_master=status.host.name == master)
        rows.append(
            tuple(
                Cell(cell, worst.get((status.host.name, topic)))
                for cell, (_, topic) in zip(cells, COLUMNS, strict=True)
            )
        )
    return CheckTable(columns, tuple(rows))


def host_cells(status: HostStatus, is_master: bool = False) -> list[str]:
    """The text of a host's row, column by column."""
    host, facts = status.host, status.facts
    name = f"{host.name} (master)" if is_master else host.name
    if status.error_topic == "ssh":
        return [name, "failed", *["-"] * (len(COLUMNS) - 2)]
    ssh = "local" if status.ssh_ms is None else f"ok {status.ssh_ms:.0f} ms"
    if facts is None:  # python missing, or the probe failed in it
        python = "failed" if isinstance(status.error, RemoteCommandError) else "not found"
        return [name, ssh, "-", python, *["-"] * (len(COLUMNS) - 4)]
    builds = [v for v in (facts.torch_cuda, facts.nccl_version) if v]
    return [
        name,
        ssh,
        facts.os or "-",
        facts.python_version or "-",
        facts.torch_version or "missing",
        " / ".join([facts.torch_cuda or "-", facts.nccl_version or "-"]) if builds else "-",
        _gpus(status),
        human_bytes(facts.disk_free) if facts.disk_free is not None else "-",
        f"{facts.clock_offset_s:+.1f} s" if facts.clock_offset_s is not None else "-",
        _route(status),
    ]


def _gpus(status: HostStatus) -> str:
    facts = status.facts
    assert facts is not None
    declared = len(status.host.gpus)
    seen = "?" if facts.gpu_count is None else str(facts.gpu_count)
    count = f"{seen}/{declared}" if declared else seen
    names = sorted({n.removeprefix("NVIDIA ") for n in facts.gpu_names})
    return f"{count} {', '.join(names)}" if names else count


def _route(status: HostStatus) -> str:
    facts = status.facts
    assert facts is not None
    if not facts.iface:
        return "none"
    text = f"{facts.iface} {facts.local_addr or ''}".strip()
    pinned = [f"{var}={status.host.env[var]}" for var in IFNAME_VARS if var in status.host.env]
    return f"{text} ({', '.join(pinned)})" if pinned else text


def _worst_by_cell(problems: tuple[Problem, ...]) -> dict[tuple[str, str], Mark]:
    worst: dict[tuple[str, str], Mark] = {}
    for p in problems:
        for host in p.hosts:
            if worst.get((host, p.topic)) is not Mark.ERROR:
                worst[(host, p.topic)] = Mark(p.severity.value)
    return worst


def bandwidth_table(report: CheckReport) -> CheckTable:
    """Gbit/s between each node and the master, each way."""
    master = report.hosts[0].host.name
    title = f"TCP throughput with the master {master} ({BANDWIDTH_S:g} s each way):"
    columns = (Column("host"), Column("to master", right=True), Column("from master", right=True))
    worst = _worst_by_cell(report.problems)
    rows = []
    for name, rate in (report.throughput or {}).items():
        mark = worst.get((name, "bandwidth"))
        if rate.error:
            rows.append((Cell(name), Cell(rate.error, Mark.WARNING), Cell("")))
            continue
        rows.append(
            (Cell(name), Cell(_gbits(rate.up_gbps), mark), Cell(_gbits(rate.down_gbps), mark))
        )
    return CheckTable(columns, tuple(rows), title)


def _gbits(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} Gbit/s"


def summary_lines(report: CheckReport) -> list[CheckLine]:
    """The rendezvous line, each problem as error/warning + hint, and the tally."""
    lines = []
    if report.rendezvous is not None:
        lines.append(CheckLine(describe_port(report.rendezvous)))
    for group in report.shared:
        lines.append(
            CheckLine(f"shared filesystem: {', '.join(group)} (one copy of the code, one setup)")
        )
    if report.environment is not None:
        lines.append(CheckLine(report.environment))
    if report.relayed:
        master = report.hosts[0].host.name
        lines.append(
            CheckLine(f"code relay: {', '.join(report.relayed)} fetch the code from {master}")
        )
    for problem in report.problems:
        head, *hint = problem.lines()
        label, _, rest = head.partition(": ")
        lines.append(CheckLine(rest, Mark(problem.severity.value), head=label))
        lines += [CheckLine(h) for h in hint]
    errors, warnings = len(report.errors), len(report.warnings)
    hosts = f"{len(report.hosts)} host{'s' if len(report.hosts) != 1 else ''}"
    if not errors and not warnings:
        lines.append(CheckLine(f"{hosts}: all checks passed", Mark.PASSED))
    else:
        counts = [_count(errors, "error"), _count(warnings, "warning")]
        lines.append(CheckLine(f"{hosts}: " + ", ".join(c for c in counts if c)))
    return lines


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}" if n else ""
