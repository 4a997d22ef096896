"""`top JOB_DIR` (stdin: a JSON request): one sample of a node's ranks, for `orch top`.

What each rank costs and how it talks, read from this host alone, cheaply enough to run
every few seconds beside the ranks:

- **Processes.** A rank is its process group (`logs/rank-N.pid`, whose leader must still
  run with the recorded start time: pids are reused), plus whatever carries the job's
  tag and `RANK=N` in its environment (children that left the group). torchrun's own
  group (`pid.json`) and tagged processes without a RANK are the node's launcher. CPU is
  cumulative seconds (user + system, with reaped children) and RSS the sum of the
  processes' resident sets; the controller turns CPU seconds into a percentage between
  two samples, on this host's monotonic clock (`clock`).
- **Lines.** Each rank's log grows only by appending: the request carries the byte
  offset the last sample reached, and only the bytes past it are read and their
  newlines counted (at most MAX_COUNT per sample; beyond that, extrapolated). Without an
  offset a log is not read at all: the sample starts counting at its end. Seconds since
  the rank's last line are this host's wall clock minus the log's mtime.
- **GPUs**, where `nvidia-smi` is on the PATH (the node's own, then the agent's): two
  queries, each GPU's utilization and memory and each compute process's memory, matched
  to ranks by pid (the UUID ties a process to its GPU: the apps query has no index).
  `gpus` is null where there is no nvidia-smi; a failing one leaves its first line in
  `gpu_error`. nvidia-smi is the one cost here that is not a few reads of /proc
  (tens of ms on a GPU host): it runs only where it exists.

Request: `{"job_id": ID, "offsets": {STREAM: BYTES}}`. Reply (replies.TopSample): the
node's status, `clock`, and `ranks`, `launcher`, `gpus` as plain JSON. Under launcher
python there are no rank logs: one rank entry (`rank` null, stream `node`) stands for the
node's process and its output.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from ..host import nvidia, proc
from ..kernel.fileio import read_json
from ..kernel.framing import send_record
from ..kernel.layout import LOGS, NODE_SPEC, PIDS, TORCHRUN_LOG
from ..kernel.messages import parse_message
from ..kernel.replies import TopSample, WarmRow
from ..kernel.requests import TopRequest
from . import state
from .warm import interpreters as warm

MAX_COUNT = 32 << 20  # bytes of new log read per rank and sample; past that, estimated
CHUNK = 1 << 20
NVIDIA_SMI_TIMEOUT_S = 5.0  # a wedged driver makes nvidia-smi hang: never the sample
GPU_QUERY = "gpu=index,uuid,utilization.gpu,memory.used,memory.total"
NODE_STREAM = "node"


def main(args: list[str]) -> int:
    job_dir = os.path.expanduser(args[0])
    try:
        request = parse_message(TopRequest, json.loads(sys.stdin.read() or "{}"))
    except ValueError as exc:  # bad JSON, or a MessageError: a controller of another version
        sys.stderr.write(f"orch agent top: {exc}\n")
        return 2
    if not os.path.isdir(job_dir):
        absent = TopSample(exists=False, started=False, running=False)
        send_record(sys.stdout.buffer, absent.as_dict())
        return 0
    os.chdir(job_dir)
    found = sample(request.job_id, request.offsets or {})
    send_record(sys.stdout.buffer, found.as_dict())
    return 0


def sample(job_id: str | None, offsets: dict[str, int]) -> TopSample:
    """One sample of the node in the current directory."""
    clock = time.monotonic()
    status = state.status()
    spec = read_json(NODE_SPEC) or {}
    env = spec.get("env") or {}
    job_id = job_id or env.get("ORCH_JOB_ID")
    tag = f"ORCH_JOB_ID={job_id}".encode() if job_id else None
    groups = rank_groups()
    launcher_group = recorded_group(read_json(PIDS) or {})
    usages: dict[Any, dict[str, Any]] = {rank: new_usage() for rank in groups.values()}
    launcher = new_usage()
    owners: dict[int, Any] = {}  # pid -> its rank (None: the launcher)
    me = os.getpid()
    for pid, fields in proc.stats():
        if len(fields) <= 21:  # too short to hold rss and the start time
            continue
        pgid = int(fields[2])
        if pgid in groups:
            owner: Any = groups[pgid]
        elif pgid == launcher_group:
            owner = None
        elif tag is not None and pid != me and tag in (environ := proc.environ(pid)):
            owner = rank_of(environ)
        else:
            continue
        usage = launcher if owner is None else usages.setdefault(owner, new_usage())
        add_usage(usage, pid, fields)
        owners[pid] = owner
    streams: dict[Any, str] = log_streams()
    if node_output_only(spec):  # launcher python: the node's process is its one "rank"
        streams, usages = {NODE_STREAM: TORCHRUN_LOG}, {NODE_STREAM: launcher}
        launcher = new_usage()
        owners = {pid: NODE_STREAM for pid in owners}
    now = proc.uptime()
    ranks = []
    for key in sorted(set(usages) | set(streams), key=lambda k: (isinstance(k, str), k)):
        figures = usages.get(key) or new_usage()
        started = figures.pop("started_s")
        ranks.append(
            {
                "rank": None if key == NODE_STREAM else key,
                "stream": str(key),
                **figures,
                "age_s": None if started is None or now is None else round(now - started, 3),
                "log": log_growth(streams.get(key), offsets.get(str(key))),
                "gpus": [],
                "gpu_memory_mib": 0,
            }
        )
    gpus, gpu_error = gpu_sample(env.get("PATH"), owners)
    for gpu in gpus or []:
        held = gpu.pop("rank_memory_mib")
        gpu["used"] = bool(held)  # by any process of the job, the launcher's too
        for entry in ranks:
            if entry["stream"] in held:
                entry["gpus"].append(gpu["index"])
                entry["gpu_memory_mib"] += held[entry["stream"]]
                if entry["rank"] is not None:
                    gpu["ranks"].append(entry["rank"])
    return TopSample(
        started=status.started,
        running=status.running,
        ended=status.ended,
        exists=True,
        clock=clock,
        ranks=ranks,
        launcher={k: v for k, v in launcher.items() if k != "started_s"},
        gpus=gpus,
        gpu_error=gpu_error,
        warm=warm_rows(),
    )


def warm_rows() -> list[WarmRow]:
    """This user's warm interpreters here, with their memory: they are the host's too."""
    try:
        return [WarmRow(**row) for row in warm.listing()]
    except (OSError, ValueError, TypeError):
        return []


def node_output_only(spec: dict[str, Any]) -> bool:
    """Whether the node runs with launcher python: its rank entry (`rank - code ...`)
    leaves the output in the node's log, and there are no rank logs."""
    argv = [str(a) for a in spec.get("argv") or []]
    return any(argv[i] == "rank" and argv[i + 1] == "-" for i in range(len(argv) - 1))


# ---------------------------------------------------------------- processes


def recorded_group(record: dict[str, Any]) -> int | None:
    """The process group a pid record names, if its leader still is that process."""
    try:
        pgid, when = int(record["pgid"]), record.get("start_time")
    except (KeyError, TypeError, ValueError):
        return None
    return pgid if when is not None and proc.start_time(pgid) == when else None


def rank_groups() -> dict[int, int]:
    """pgid -> global rank, from the rank-N.pid files of groups whose leader still runs."""
    found = {}
    for name in os.listdir(LOGS) if os.path.isdir(LOGS) else []:
        if not (name.startswith("rank-") and name.endswith(".pid")):
            continue
        try:
            with open(os.path.join(LOGS, name)) as f:
                pid, _, when = f.read().partition(" ")
            rank = int(name[5:-4])
            if proc.start_time(int(pid)) == int(when):
                found[int(pid)] = rank
        except (OSError, ValueError):
            continue
    return found


def rank_of(environ: list[bytes]) -> int | None:
    for entry in environ:
        if entry.startswith(b"RANK="):
            try:
                return int(entry[5:])
            except ValueError:
                return None
    return None


def new_usage() -> dict[str, Any]:
    return {"pids": [], "cpu_s": 0.0, "rss_bytes": 0, "started_s": None}


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def add_usage(usage: dict[str, Any], pid: int, fields: list[str]) -> None:
    """Add one process: utime, stime, cutime, cstime (fields 14-17 of stat), rss (24),
    and the group's earliest start, in seconds since boot (22)."""
    usage["pids"].append(pid)
    usage["cpu_s"] = round(usage["cpu_s"] + sum(int(v) for v in fields[11:15]) / TICK, 3)
    usage["rss_bytes"] += int(fields[21]) * PAGE
    started = int(fields[19]) / TICK
    if usage["started_s"] is None or started < usage["started_s"]:
        usage["started_s"] = started


# ---------------------------------------------------------------- logs


def log_streams() -> dict[Any, str]:
    """rank -> its log file."""
    found: dict[Any, str] = {}
    for name in os.listdir(LOGS) if os.path.isdir(LOGS) else []:
        if name.startswith("rank-") and name.endswith(".log") and name[5:-4].isdigit():
            found[int(name[5:-4])] = os.path.join(LOGS, name)
    return found


def log_growth(path: str | None, offset: int | None) -> dict[str, Any]:
    """A log's new lines since `offset`, and how long it has been still.

    Returns:
        {"offset": where the next sample starts (the log's size), "lines": newlines
        past the given offset (null without one: counting starts now), "estimated":
        whether part of that was extrapolated, "idle_s": seconds since the last write
        (null: no log yet, or an empty one)}.
    """
    growth: dict[str, Any] = {"offset": 0, "lines": None, "estimated": False, "idle_s": None}
    if path is None:
        return growth
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if offset is not None:  # a shorter log than last time was replaced: all new
                start = offset if offset <= info.st_size else 0
                growth["lines"], growth["estimated"] = count_lines(f, start, info.st_size)
    except OSError:
        return growth
    growth["offset"] = info.st_size
    if info.st_size:
        growth["idle_s"] = round(max(0.0, time.time() - info.st_mtime), 3)
    return growth


def count_lines(f: Any, start: int, end: int) -> tuple[int, bool]:
    """Newlines in bytes [start, end) of an open file: read at most MAX_COUNT of them,
    the rest extrapolated at the same density (a rank writing 16 MB/s is not slowed
    down by a reader that keeps up with it, nor is this sample)."""
    f.seek(start)
    counted = read = 0
    while read < min(end - start, MAX_COUNT):
        chunk = f.read(min(CHUNK, end - start - read))
        if not chunk:
            break
        counted += chunk.count(b"\n")
        read += len(chunk)
    if read >= end - start or read == 0:
        return counted, False
    return round(counted * (end - start) / read), True


# ---------------------------------------------------------------- GPUs


def gpu_sample(
    node_path: str | None, owners: dict[int, Any]
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Every GPU of the host, each with the memory the job's processes hold there by
    stream (`rank_memory_mib`); (None, None) where there is no nvidia-smi, (None, what
    it said) where it fails."""
    path = os.pathsep.join(p for p in (node_path, os.environ.get("PATH", os.defpath)) if p)
    smi = nvidia.find(path)
    if smi is None:
        return None, None
    answer = nvidia.run(smi, GPU_QUERY, NVIDIA_SMI_TIMEOUT_S)
    error = complaint(answer)
    if error is not None:
        return None, error
    apps = nvidia.run(smi, nvidia.APPS_QUERY, NVIDIA_SMI_TIMEOUT_S)
    error = complaint(apps)
    gpus = parse_gpus(answer.text)
    for gpu, app in nvidia.held(gpus, [] if error else nvidia.processes(apps.text)):
        if app["pid"] not in owners:
            continue
        owner = owners[app["pid"]]
        stream = NODE_STREAM if owner is None else str(owner)
        held = gpu["rank_memory_mib"]
        held[stream] = held.get(stream, 0) + (app["used_memory_mib"] or 0)
    return gpus, error


def complaint(answer: nvidia.Answer) -> str | None:
    """nvidia-smi's first line of complaint, where it gave no answer to use."""
    if answer.error is not None:
        return answer.error
    if answer.returncode != 0:
        first = next((line.strip() for line in answer.text.splitlines() if line.strip()), "")
        return first or f"nvidia-smi exited with {answer.returncode}"
    return None


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """Rows of GPU_QUERY: `0, GPU-5d1e..., 97, 40536, 81559`. Lines that are not such a
    row (a warning nvidia-smi printed) are skipped."""
    number = nvidia.number
    return [
        {
            "index": int(cells[0]),
            "uuid": cells[1],
            "utilization_percent": number(cells[2]),
            "memory_used_mib": number(cells[3]),
            "memory_total_mib": number(cells[4]),
            "ranks": [],
            "rank_memory_mib": {},  # stream -> MiB the job's processes hold
        }
        for cells in nvidia.rows(text, 5)[0]
    ]
