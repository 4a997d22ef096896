"""orch: launch PyTorch distributed training on machines you can reach over SSH."""

__version__ = "0.1.0"

# The Python API (orchestrator.api) under the package's own name, imported on first
# use: it pulls in paramiko and the rest (~170 ms), `import orchestrator` stays under 1 ms.
TYPE_CHECKING = False  # typing's own would cost its import; type checkers read it as True
if TYPE_CHECKING:
    from orchestrator.api import Job as Job
    from orchestrator.api import job as job
    from orchestrator.api import jobs as jobs
    from orchestrator.api import submit as submit

_API = ("Job", "job", "jobs", "submit")


def __getattr__(name: str) -> object:
    if name in _API:
        from orchestrator import api

        return getattr(api, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
