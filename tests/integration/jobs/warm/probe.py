"""Integration-test job for orch's warm starts: each rank reports what it was started
with (environment, argv, paths, __name__, how torch sees its launcher), joins a gloo
group and all-reduces, then prints one ``REPORT {json}`` line.

``--fail-rank N``: rank N exits 3 after the all_reduce; ``--sleep S``: every rank
sleeps S seconds before it ends (tests kill it there). ``--deep``: the report holds the
rest of the process's state too (``process_state``), and two more lines follow:
``DRAWS {json}``, the random numbers it drew (a fresh process draws its own), and
``KEPT {json}``, what a warm rank keeps of its warm parent on purpose; and at its end,
``ENDED ...`` lines, each step of the process's end that prints (``ending``).
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import gc
import json
import os
import random
import re
import stat
import sys
import threading
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def launcher_views() -> dict[str, object]:
    """How libraries that look at the launcher see this process (those installed)."""
    views: dict[str, object] = {"torch": dist.is_torchelastic_launched()}
    try:
        from lightning.fabric.plugins.environments import TorchElasticEnvironment

        views["lightning"] = TorchElasticEnvironment.detect()
    except ImportError:
        pass
    try:
        from accelerate.state import PartialState  # noqa: F401

        views["accelerate"] = int(os.environ.get("LOCAL_RANK", "-1"))
    except ImportError:
        pass
    return views


class Numbers(torch.utils.data.Dataset[tuple[int, str]]):
    """Each item: its index and the seed of the loader worker that made it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[int, str]:
        return index, str(torch.initial_seed())


def draws() -> dict[str, object]:
    """The first numbers each generator gives, unseeded, and the loader's worker
    seeds (drawn from torch's default generator)."""
    import numpy

    drawn: dict[str, object] = {
        "torch": torch.rand(1).item(),
        "torch_seed": torch.initial_seed(),
        "numpy": float(numpy.random.rand()),
        "random": random.random(),
    }
    loader = torch.utils.data.DataLoader(Numbers(), batch_size=1, num_workers=2)
    drawn["loader_seeds"] = sorted({batch[1][0] for batch in loader})
    return drawn


def started_with() -> dict[str, object]:
    """The signal dispositions and open descriptors the script started with (before
    gloo and the loader add theirs)."""
    import signal

    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    fds = {}
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        fds[fd] = re.sub(r"\[\d+\]$", "", target)  # pipe:[123] -> pipe:
    handlers = {s.name: signal.getsignal(s) for s in signal.Signals}
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    with open("/proc/self/oom_score_adj") as f:
        oom = f.read().strip()
    return {
        "signals": {k: status[k].strip() for k in ("SigBlk", "SigIgn", "SigCgt")},
        "python_signals": {k: repr(getattr(h, "__name__", h)) for k, h in handlers.items()},
        "fds": fds,
        "comm": comm,  # the name ps -o comm and top show
        "oom_score_adj": oom,
    }


def process_state() -> dict[str, object]:
    """What else a rank was started with: thread pools, umask, limits, stdio,
    interpreter flags, the multiprocessing start method, a loader with worker
    processes, and what explicit seeds give."""
    import locale
    import multiprocessing
    import resource

    import numpy

    umask = os.umask(0)
    os.umask(umask)
    limits = {
        name: resource.getrlimit(getattr(resource, name))
        for name in sorted(dir(resource))
        if name.startswith("RLIMIT_")
    }
    loader = torch.utils.data.DataLoader(Numbers(), batch_size=1, num_workers=2)
    torch.manual_seed(1234)
    numpy.random.seed(1234)
    random.seed(1234)
    seeded = [torch.rand(2).tolist(), numpy.random.rand(2).tolist(), random.random()]
    return {
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "umask": umask,
        "limits": limits,
        "stdio": [
            [s.line_buffering, s.write_through, s.encoding, s.errors, type(s.buffer).__name__]
            for s in (sys.stdout, sys.stderr)
        ],
        "flags": list(sys.flags),
        "start_method": multiprocessing.get_start_method(allow_none=True),
        "loader": [int(batch[0][0]) for batch in loader],  # in order, from 2 workers
        "seeded": seeded,
        "path": sys.path,
        "recursion_limit": sys.getrecursionlimit(),
        "switch_interval": sys.getswitchinterval(),
        "locale": list(locale.getlocale()),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "warnings": [repr(f) for f in warnings.filters],
        "dtype": str(torch.get_default_dtype()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--deep", action="store_true")
    parser.add_argument("extra", nargs="*")
    args = parser.parse_args()
    started = started_with() if args.deep else None
    drawn = draws() if args.deep else None  # first: as the script's first draws
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.tensor([rank + 1])
    dist.all_reduce(tensor)
    report = {
        "rank": rank,
        "sum": int(tensor.item()),
        "env": dict(os.environ),
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "name": __name__,
        "main_file": getattr(sys.modules["__main__"], "__file__", None),
        "launchers": launcher_views(),
        "stdin_is_devnull": stat.S_ISCHR(os.fstat(0).st_mode),
        "own_session": os.getsid(0) == os.getpid(),
        "stdout_raw": type(sys.stdout.buffer).__name__ if hasattr(sys.stdout, "buffer") else None,
        "executable": sys.executable,
    }
    if args.deep:
        report["process_state"] = {**process_state(), **(started or {})}
    print("REPORT " + json.dumps(report, sort_keys=True), flush=True)
    if drawn is not None:
        print("DRAWS " + json.dumps(drawn, sort_keys=True), flush=True)
        kept = {"gc_frozen": gc.get_freeze_count() > 0, "str_hash": hash("orch")}
        print("KEPT " + json.dumps(kept, sort_keys=True), flush=True)
    if args.sleep:
        print(f"rank {rank} sleeping", flush=True)
        time.sleep(args.sleep)
    if args.fail_rank == rank:
        sys.exit(3)
    dist.destroy_process_group()
    if args.deep:
        ending()


class Finalized:
    def __del__(self) -> None:
        print("ENDED del", flush=True)


def ending() -> None:
    """How the process ends, in order: C's stdio (unbuffered under `python -u`), then
    Python's shutdown: a thread still running, atexit, the script's objects."""
    global finalized
    ctypes.CDLL(None).printf(b"ENDED c stdio\n")
    threading.Thread(target=lambda: (time.sleep(0.2), print("ENDED thread", flush=True))).start()
    atexit.register(print, "ENDED atexit", flush=True)
    finalized = Finalized()


if __name__ == "__main__":
    main()
