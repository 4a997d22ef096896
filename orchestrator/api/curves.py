"""orch from Python, the curves of a job: the numbers its ranks print (`loss 1.23`,
`loss=1.23`, `loss: 1.23`, the Hugging Face Trainer's dict lines, the job file's own
`metrics:` patterns), read from the job's records, against step and time.

```python
from orchestrator.api import curves

reader = curves.curves("digits-ab12cd")
points = reader.read()                  # MetricPoint(host, rank, name, value, step, time)
later = reader.read()                   # only what was printed since
open("curves.csv", "w").write(curves.to_csv(points + later))
```

The records hold what the controller has copied of the job's logs: what an attached
`orch submit`, `orch logs` or `orch ui` received. A job nothing followed has its lines
copied (and so its curves) by the next `orch logs` or page that shows it.
"""

from __future__ import annotations

from orchestrator.api import _owner_only
from orchestrator.records.db import JobDB
from orchestrator.reporting.curves import READ_BUDGET, CurveReader, MetricPoint, to_csv
from orchestrator.reporting.metrics import MetricParser, Reading

__all__ = ["Curves", "MetricParser", "MetricPoint", "Reading", "curves", "to_csv"]


class Curves:
    """The points of one recorded job, each handed out once: `read()` again for what
    its ranks printed since (a restarted job's later attempts included).

    Args:
        job_id: the job's full id.
    """

    def __init__(self, job_id: str) -> None:
        with _owner_only():
            store = JobDB()
            record = store.get(job_id)
        self.job_id = record.id
        self.metrics = record.view.metrics
        self._reader = CurveReader(store.home / "logs", record.id, MetricParser(self.metrics))

    def read(self, budget: int = READ_BUDGET) -> list[MetricPoint]:
        """The points printed since the last read, reading at most about `budget`
        bytes of logs (a long log fills in over several reads)."""
        with _owner_only():
            attempts = JobDB().get(self.job_id).view.attempt + 1
            return self._reader.read(attempts, budget)


def curves(job_id: str) -> Curves:
    """A reader of a recorded job's curves.

    Args:
        job_id: its id, or a unique prefix of it.

    Raises:
        InputError: no such job, or a prefix of several.
    """
    return Curves(job_id)
