"""A restarted job's earlier attempts, printed from the local copy of their logs: the
same for a job over SSH (ssh/logs.py) and on Slurm (slurm/restarts.py)."""

from __future__ import annotations

from orchestrator.records.db import JobDB, JobRecord
from orchestrator.records.logmirror import LogMirror, rank_of
from orchestrator.reporting.filters import LogFilter
from orchestrator.reporting.reporter import Reporter


def print_earlier_attempts(
    record: JobRecord, store: JobDB, want: LogFilter, reporter: Reporter
) -> None:
    """A restarted job's earlier attempts, each under a marker line, from the local
    copy (their nodes ended; a lost host's lines stop where it went); then the current
    attempt's marker."""
    for earlier in record.view.attempts:
        ended = ", ".join(f"{n['host']} {n['state']}" for n in earlier.nodes)
        reporter.notice(f"--- attempt {earlier.attempt + 1} ({ended}) ---")
        mirror = LogMirror(store.home / "logs", record.id, earlier.attempt)
        try:
            for node in earlier.nodes:
                name = str(node["host"])
                for stream in mirror.streams(name):
                    if want.wants(name, rank_of(stream)):
                        reporter.output(name, rank_of(stream), mirror.read(name, stream, want.tail))
        finally:
            mirror.close()
    if record.view.attempts:
        reporter.notice(f"--- attempt {record.view.attempt + 1} ---")
