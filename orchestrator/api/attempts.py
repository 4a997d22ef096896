"""orch from Python, a job's attempts on a time line: each node of each attempt as a
span of time on its host, how it ended, and where a restart put a node on another host
(a spare) than the attempt before; read from the job's records, no host asked.

```python
from orchestrator.api import attempts

line = attempts.timeline("digits-ab12cd")
for span in line.spans:                 # NodeSpan(attempt, host, node_rank, state, ...)
    print(span.attempt, span.host, span.state, span.start, span.end, span.took_place_of)
```
"""

from __future__ import annotations

from orchestrator.api import _owner_only
from orchestrator.records.db import JobDB
from orchestrator.reporting.timeline import NodeSpan, Timeline
from orchestrator.reporting.timeline import timeline as _timeline

__all__ = ["NodeSpan", "Timeline", "timeline"]


def timeline(job_id: str) -> Timeline:
    """A recorded job's attempts on a time line (reporting/timeline.py says how each
    span's start and end are known).

    Args:
        job_id: its id, or a unique prefix of it.

    Raises:
        InputError: no such job, or a prefix of several.
    """
    with _owner_only():
        store = JobDB()
        return _timeline(store.get(job_id), store.home / "logs")
