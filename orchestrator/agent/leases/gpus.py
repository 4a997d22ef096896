"""GPUs busy outside orch: those nvidia-smi shows in use by a process that no live lease
holds (a process orch did not start). They count as busy, each with a warning that
names it."""

from __future__ import annotations

from ..host import proc
from .policy import Record, held_units


def foreign_gpus(leases: list[Record]) -> dict[int, Record]:
    """GPUs in use by a process that no live lease accounts for: {index: {gpu, pid,
    user}}. Empty where nvidia-smi is missing or fails."""
    from ..host import nvidia  # not for a lease of slots: subprocess costs every command 3 ms

    smi = nvidia.find()
    if smi is None:
        return {}
    listed = nvidia.run(smi, "gpu=index,uuid")
    apps = nvidia.run(smi, nvidia.APPS_QUERY)
    if listed.error is not None or apps.error is not None:
        return {}
    gpus = [{"index": int(cells[0]), "uuid": cells[1]} for cells in nvidia.rows(listed.text, 2)[0]]
    held = held_units(leases, "gpu")
    found: dict[int, Record] = {}
    for gpu, app in nvidia.held(gpus, nvidia.processes(apps.text)):
        if gpu["index"] not in held:
            pid = app["pid"]
            found.setdefault(
                gpu["index"], {"gpu": gpu["index"], "pid": pid, "user": proc.user_of(pid)}
            )
    return found


def busy_units(request: Record, leases: list[Record]) -> dict[int, Record]:
    return foreign_gpus(leases) if request["kind"] == "gpu" else {}
